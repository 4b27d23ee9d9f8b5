"""Settling an effect left in doubt: an operator tells a stopped run what a call did.

An effect journal (:mod:`stepstone.durable._effects`) files each call of a run at its
position (``"tool:2:0"``: kind, turn, index) with an ``intent`` row before the call and an
``outcome`` row after it. A call with an intent and no outcome is *in doubt*: the process
died during the call. A tool declared ``in_doubt="fail"`` stops its run there, because only
a person can find out whether the call took effect. Once they have, :func:`settle_effect`
records the answer as the call's outcome, in one transaction with the run's head:

* **it happened**: the outcome carries the result the person gives (``data["content"]``,
  the text a tool's outcome holds, and ``data["settled"]["result"]``, the value as given);
  the run's next resume replays it as the call's result, as for any recorded outcome;
* **it did not happen**: the outcome says so (``data["settled"]["happened"]`` False); the
  next resume runs the call as a new one (a new intent first: a crash inside it leaves it
  in doubt again).

Both are written only while no process owns the run. A run that had ended (``failed`` with
``EffectInDoubtError``) is left ``paused`` and continues at its next resume. Nothing here
knows what kind of engine wrote the journal: any engine that files its calls as intent and
outcome rows by position can be settled this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepstone.core._envelope import payload_text
from stepstone.core._serialization import to_json_value
from stepstone.durable._hashing import hash_json
from stepstone.durable._journal_format import Entry, entries_of
from stepstone.durable._kernel import _journal_rows, ownership_error
from stepstone.durable._leases import owner_alive
from stepstone.durable._records import list_runs
from stepstone.exceptions import UserError
from stepstone.store._base import Claim, JournalRow, RunHead, read_consistent
from stepstone.store._store import Store

__all__ = [
    "in_doubt_effects",
    "not_happened",
    "settle_effect",
    "settled_since_last_phase",
]

#: The key of a settled outcome's data that says so (its value: how it was settled).
SETTLED = "settled"

#: The fields of an intent row an outcome row repeats (its hashes tie the two together).
_INTENT_FIELDS = ("kind", "name", "turn", "index", "call_id", "input_hash", "input_hash_version")


def not_happened(data: Any) -> bool:
    """Whether an outcome's ``data`` is a settlement saying the call did not happen."""
    settled = data.get(SETTLED) if isinstance(data, dict) else None
    return isinstance(settled, dict) and settled.get("happened") is False


def settled_since_last_phase(rows: Sequence[JournalRow] | Sequence[Entry]) -> bool:
    """Whether an outcome was settled after the run's last phase record (a run that ended,
    then was settled: its next resume continues instead of returning how it ended)."""
    for entry in reversed(entries_of(rows)):
        if entry.kind == "phase":
            return False
        if entry.kind == "outcome":
            inner = entry.data.get("data")
            if isinstance(inner, dict) and SETTLED in inner:
                return True
    return False


def _doubtful(rows: Sequence[JournalRow] | Sequence[Entry]) -> list[dict[str, Any]]:
    """The calls of a journal with an intent and no outcome after it, in journal order."""
    latest: dict[str, dict[str, Any] | None] = {}
    for entry in entries_of(rows):
        if entry.kind in ("intent", "outcome") and entry.name is not None:
            latest[entry.name] = entry.data if entry.kind == "intent" else None
    out = []
    for position, intent in latest.items():
        if intent is None or intent.get("kind") == "model":  # a model call is asked again
            continue
        out.append(
            {
                "position": position,
                "kind": intent.get("kind"),
                "name": intent.get("name"),
                "call_id": intent.get("call_id"),
                "turn": intent.get("turn"),
                "index": intent.get("index"),
                "intent": intent,
            }
        )
    return out


def _runs(store: Store, key: str) -> list[RunHead]:
    """The run under ``key`` and the runs nested in it (the LLM loops of a Plan's steps or
    a graph's nodes, ``key:...``; a subagent's, ``key/...``)."""
    head = store.backend.run_get(key)
    if head is None:
        from stepstone.durable._inspect import missing_run  # (it imports the kernel)

        raise UserError(missing_run(store, key))
    nested = [h for p in (f"{key}:", f"{key}/") for h in list_runs(store, p)]
    return [head, *nested]


def _workflow_run(store: Store, key: str) -> RunHead | None:
    """The head under ``key`` when it is a workflow run (settled through
    :func:`~stepstone.durable._operations.settle_operation`), else None."""
    head = store.backend.run_get(key)
    return head if head is not None and head.kind == "workflow" else None


def workflow_in_doubt(store: Store, head: RunHead) -> list[dict[str, Any]]:
    """The steps in doubt of the workflow run ``head``, as :func:`in_doubt_effects` lists
    calls (``position`` the step's position, ``name`` its name)."""
    from stepstone.durable._operations import (
        operation_rows,
    )  # (it imports _effects, which imports this)

    found = read_consistent(store.backend, head.key)
    rows = found[1] if found is not None else []
    live = owner_alive(head)
    return [
        {
            "run_key": head.key,
            "position": op["position"],
            "kind": op["op"],
            "name": op["name"],
            "call_id": None,
            "turn": None,
            "index": None,
            "live": live,
        }
        for op in operation_rows(head, rows)
        if op["status"] in ("in doubt", "running") and op["op"] == "step"
    ]


def in_doubt_effects(store: Store, key: str) -> list[dict[str, Any]]:
    """The calls in doubt in the run under ``key`` and the runs nested in it, each as
    ``{run_key, position, kind, name, call_id, turn, index, live}`` (``live``: a process
    owns that run now, so it cannot be settled yet).

    Raises:
        UserError: no run under ``key``.
    """
    workflow = _workflow_run(store, key)
    if workflow is not None:
        return workflow_in_doubt(store, workflow)
    out: list[dict[str, Any]] = []
    for head in _runs(store, key):
        live = owner_alive(head)
        for e in _doubtful(store.backend.run_journal(head.key)):
            e.pop("intent")
            out.append({"run_key": head.key, **e, "live": live})
    return out


def settle_effect(
    store: Store,
    key: str,
    effect: str,
    *,
    happened: bool,
    result: Any = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Record what the call ``effect`` in doubt in the run under ``key`` did.

    Args:
        store: The run's store.
        key: The run's key, or the key of a Plan or graph run whose nested LLM loop holds
            the call.
        effect: The call's position (``"tool:2:0"``) or its call id (``"call_2_0"``), as
            :func:`in_doubt_effects` and the ``EffectInDoubtError`` name it.
        happened: True: it took effect, and ``result`` is what it returned (the run's next
            resume replays it). False: it did not (the next resume runs it).
        result: With ``happened``: the call's result, a JSON value (a tool's is usually
            text: the model reads it).
        note: Why you know, kept with the outcome for whoever reads the run later.

    Returns:
        ``{key, run_key, position, kind, name, call_id, happened, result, status}``:
        ``status`` is the run's status now.

    Raises:
        UserError: no run under ``key``, no such call in doubt (the message lists the calls
            that are), two nested runs with a call of that id (pass its position), a
            ``result`` with ``happened=False``, or one JSON cannot hold; or the run changed
            while the settlement was being written (nothing was).
        ConcurrentRunError: a live process owns the run: stop it, or wait for it to end.
    """
    _check_settlement(happened, result, note)
    value = to_json_value(result, where="settle_effect(result=...)", strict=True)
    workflow = _workflow_run(store, key)
    if workflow is not None:  # its steps are operations of the kernel's operation journal
        from stepstone.durable._operations import settle_operation

        doubts = [d for d in in_doubt_effects(store, key) if effect in (d["position"], d["name"])]
        step_head = settle_operation(store, key, effect, happened=happened, value=value)
        return {
            "key": key,
            "run_key": key,
            "position": doubts[0]["position"] if doubts else effect,
            "kind": "step",
            "name": doubts[0]["name"] if doubts else effect,
            "call_id": None,
            "happened": happened,
            "result": value if happened else None,
            "status": step_head.status,
        }
    head, e = _call_in_doubt(store, key, effect)
    outcome = _settled_outcome(e["intent"], happened, value, note, store.backend.clock())
    written = _write_outcome(store, head, e["position"], outcome)
    return {
        "key": key,
        "run_key": head.key,
        "position": e["position"],
        "kind": e["kind"],
        "name": e["name"],
        "call_id": e["call_id"],
        "happened": happened,
        "result": value if happened else None,
        "status": written.status,
    }


def _check_settlement(happened: bool, result: Any, note: str | None) -> None:
    """Refuse a settlement's bad arguments (before anything is read)."""
    if not isinstance(happened, bool):
        raise UserError(f"happened= must be True or False, got {happened!r}")
    if not happened and result is not None:
        raise UserError(
            f"settle_effect(happened=False, result={result!r:.100}): a call that did not "
            "happen has no result; leave result out (the next resume runs the call)"
        )
    if note is not None and not isinstance(note, str):
        raise UserError(f"note= must be a string or None, got {note!r:.100}")


def _call_in_doubt(store: Store, key: str, effect: str) -> tuple[RunHead, dict[str, Any]]:
    """The run (``key``'s, or one nested in it) and the call in doubt there that ``effect``
    names (a position or a call id).

    Raises:
        UserError: no such call in doubt (the message lists those that are), or a call id
            in doubt in two runs.
    """
    found = [
        (head, e)
        for head in _runs(store, key)
        for e in _doubtful(store.backend.run_journal(head.key))
        if effect in (e["position"], e["call_id"])
    ]
    if not found:
        doubts = in_doubt_effects(store, key)
        listed = ", ".join(
            f"{e['position']} ({e['name']}, call id {e['call_id']!r}, run {e['run_key']!r})"
            for e in doubts
        )
        raise UserError(
            f"run {key!r} has no call {effect!r} in doubt; "
            + (f"the calls in doubt are: {listed}" if doubts else "no call of it is in doubt")
        )
    if len(found) > 1:
        where = ", ".join(f"{e['position']} in {h.key!r}" for h, e in found)
        raise UserError(
            f"call id {effect!r} is in doubt in {len(found)} runs under {key!r} ({where}); "
            "settle each by its run key and position"
        )
    return found[0]


def _settled_outcome(
    intent: dict[str, Any], happened: bool, value: Any, note: str | None, now: float
) -> dict[str, Any]:
    """The outcome row a settlement records for the call whose ``intent`` row is given."""
    settled: dict[str, Any] = {"happened": happened, "at": now}
    if note is not None:
        settled["note"] = note
    data: dict[str, Any] = {SETTLED: settled}
    if happened:
        settled["result"] = value
        data["content"] = payload_text(value)
    outcome = {f: intent[f] for f in _INTENT_FIELDS if f in intent}
    outcome.update({"output_hash": hash_json(data), "data": data})
    return outcome


def _write_outcome(store: Store, head: RunHead, position: str, outcome: dict[str, Any]) -> RunHead:
    """Append ``outcome`` at ``position`` of the run ``head`` (as read) in one transaction
    with its head, while no process owns it (a failed run is left paused); its new head.

    Raises:
        UserError: the run changed since it was read (nothing was written).
        ConcurrentRunError: a live process owns the run.
    """

    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        if cur is None or cur.version != head.version or cur.journal_len != head.journal_len:
            raise UserError(
                f"run {head.key!r} changed while the call was being settled (it was resumed, "
                "cancelled or deleted); nothing was written. Check it with `stepstone show "
                f"{head.key}` and settle it again if it is still in doubt"
            )
        if owner_alive(cur, now=store.backend.clock()):
            raise ownership_error(
                cur.kind,
                f"run {head.key!r} is live: a process owns it now, so its call "
                f"{position} cannot be settled; wait for it to stop, or cancel it "
                f"(`stepstone cancel {head.key}`), then settle it",
            )
        rows = _journal_rows(cur.key, [("outcome", position, outcome)], cur.journal_len)
        new = cur.replace(
            status="paused" if cur.status == "failed" else cur.status,
            version=cur.version + 1,
            journal_len=cur.journal_len + 1,
            updated_at=store.backend.clock(),
        )
        return Claim(head=new, rows=rows)

    written = store.backend.run_transact(head.key, decide)
    assert written is not None
    return written
