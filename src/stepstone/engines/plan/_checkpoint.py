"""How a Plan run is journaled, replayed on resume, and shown by ``store.read(key)``.

A step commit appends one ``step`` row (the step's envelope, its ``writes=`` key and the
iteration). Branches of a parallel band append their ``step`` rows as they finish, marked
with the band; the band's own ``band`` row, committed with every branch's ``writes=``
value, applies them all at once. Branch rows without a ``band`` row are pending: a resumed
run reuses them instead of re-running those branches (guarantee 11).
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
import time
from collections.abc import Callable
from typing import Any

from stepstone.core import Envelope
from stepstone.core._serialization import dumps, untag
from stepstone.durable._kernel import Encoded
from stepstone.exceptions import CheckpointCorruptError
from stepstone.store._base import RUN_STATUSES, JournalRow, RunHead, journal_problem

__all__ = [
    "CHECKPOINT_VERSION",
    "Replay",
    "band_row",
    "check_head",
    "check_journal",
    "corrupt_checkpoint",
    "legacy_import",
    "plan_view",
    "replay",
    "row_write_value",
    "step_row",
]

CHECKPOINT_VERSION = 2

Row = tuple[str, str | None, Any]


def step_row(
    name: str,
    env: Envelope[Any],
    *,
    iteration: int,
    band: str | None,
    writes: str | None,
    strict: bool,
) -> tuple[Row, Any]:
    """The journal row for a finished step, and its ``writes=`` value (plain JSON).

    Only the step's output is journaled (payload, metadata, error): its task and context
    were inputs, already journaled as earlier outputs, and storing them again would double
    the bytes of every step.

    Both come back already encoded (:class:`Encoded`, the very text the kernel would
    make of them), so the payload, the bulk of a step's bytes, is encoded once: the row's
    text is that of ``{"iteration", "envelope": {"payload", ...}, "band"?, "writes"?}``
    with the payload's text spliced in, and the value reuses it when untagging left the
    payload as it was (it held no value JSON cannot hold).
    """
    where = f"step {name!r} writes[{writes!r}]" if writes else f"step {name!r} output"
    env_data = env.to_dict(where=where, strict=strict)
    env_data.pop("task", None)
    env_data.pop("context", None)
    payload = env_data.pop("payload")  # the rest: encoding, metadata?, error?
    value = untag(payload) if writes else None
    try:
        text = dumps(payload)
        plain = text if value is payload or value == payload else dumps(value)
        row = Encoded(_row_text(iteration, text, env_data, band, writes))
    except (TypeError, ValueError):  # not JSON-ready after all: the kernel names it
        data: dict[str, Any] = {"iteration": iteration, "envelope": {"payload": payload}}
        data["envelope"].update(env_data)
        if band is not None:
            data["band"] = band
        if writes is not None:
            data["writes"] = writes
        return ("step", name, data), value
    return ("step", name, row), (Encoded(plain) if writes else None)


def _row_text(
    iteration: int, payload: str, env: dict[str, Any], band: str | None, writes: str | None
) -> str:
    """``dumps({"iteration": iteration, "envelope": {"payload": ..., **env}, "band"?:
    band, "writes"?: writes})``, the payload given as its JSON text: built from its parts
    (the envelope's other keys, as ``dumps`` writes them, after the payload)."""
    if len(env) == 1 and type(env.get("encoding")) is int:
        rest = f'"encoding":{env["encoding"]}'  # the usual output: no metadata, no error
    elif "encoding" in env:
        rest = dumps(env)[1:-1]  # an object's members, without its braces
    else:
        raise ValueError("an envelope without its encoding")  # never: to_dict sets it
    number = str(iteration) if type(iteration) is int else dumps(iteration)
    parts = [f'{{"iteration":{number},"envelope":{{"payload":{payload},{rest}}}']
    if band is not None:
        parts.append(f',"band":{dumps(band)}')
    if writes is not None:
        parts.append(f',"writes":{dumps(writes)}')
    parts.append("}")
    return "".join(parts)


def row_write_value(data: dict[str, Any]) -> Any:
    """The ``writes=`` value of a journaled step (plain JSON, as the Store holds it)."""
    env = data.get("envelope") or {}
    return untag(env.get("payload"))


def band_row(entry: str, names: list[str]) -> Row:
    """The row that applies a band's pending branch rows."""
    return ("band", entry, {"steps": names})


@dataclasses.dataclass
class Replay:
    """A run's journal, decoded.

    Attributes:
        applied: ``(step_name, row_data)`` of completed steps, in completion order.
        pending: Per band entry, branch results journaled before the band completed.
        kv: The ``writes=`` values of applied steps (latest per key).
        shape: The steps of the plan that started the run (``[name, parallel, writes]``
            each), journaled once at its fresh start; None for runs written before.
        direct: Names of the steps applied by a row of their own (not by a band's row).
        bands: Entries of the bands applied by a band row.
    """

    applied: list[tuple[str, dict[str, Any]]]
    pending: dict[str, dict[str, dict[str, Any]]]
    kv: dict[str, Any]
    shape: list[Any] | None = None
    direct: list[str] = dataclasses.field(default_factory=list)
    bands: list[str] = dataclasses.field(default_factory=list)
    _checked: dict[str, Envelope[Any]] | None = None

    def envelopes(self) -> dict[str, Envelope[Any]]:
        """Latest output envelope per applied step (legacy rows without one are skipped)."""
        if self._checked is not None:
            return dict(self._checked)
        out: dict[str, Envelope[Any]] = {}
        for name, data in self.applied:
            env = data.get("envelope")
            if env is not None:
                out[name] = Envelope.from_dict(env)
        return out

    def check(self, key: str) -> None:
        """Decode every envelope once; raises CheckpointCorruptError naming ``key`` and the
        step whose entry cannot be decoded (a resume validates before it claims)."""
        entries = [*self.applied]
        n_applied = len(entries)
        for branches in self.pending.values():
            entries.extend(branches.items())
        decoded: dict[str, Envelope[Any]] = {}
        for i, (name, data) in enumerate(entries):
            env = data.get("envelope")
            if env is None:
                continue
            try:
                if not isinstance(env, dict):
                    raise TypeError(f"envelope is a {type(env).__name__}, not an object")
                envelope = Envelope.from_dict(env)
                if i < n_applied:
                    decoded[name] = envelope
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                what = f"the entry of step {name!r} cannot be decoded ({exc})"
                raise corrupt_checkpoint(key, what) from exc
        self._checked = decoded


#: The fields each kind of Plan journal row holds (any other is a damaged field name).
_ROW_FIELDS = {
    "step": {"iteration", "envelope", "band", "writes"},
    "band": {"steps"},
    "plan": {"steps"},
    "kv": {"key", "value"},
}
#: The fields of a journaled envelope (``Envelope.to_dict``, older encodings included).
_ENVELOPE_FIELDS = {"task", "context", "payload", "encoding", "metadata", "error"}


def replay(key: str, rows: list[JournalRow]) -> Replay:
    """Decode ``rows``; raises CheckpointCorruptError naming ``key`` when they are bad."""
    rep = Replay([], {}, {})
    for row in rows:
        data = _row_data(key, row)
        apply = _REPLAY_ROW.get(row.kind)
        if apply is None:  # a byte flipped in its kind: skipping it would drop a step
            raise _unknown_row(key, row)
        apply(key, rep, row, data)
    return rep


def _row_data(key: str, row: JournalRow) -> dict[str, Any]:
    """A journal row's fields, checked to be the ones its kind of row holds."""
    try:
        data = json.loads(row.data)
    except ValueError as exc:
        raise corrupt_checkpoint(key, f"journal row {row.seq} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise corrupt_checkpoint(
            key, f"journal row {row.seq} is {type(data).__name__}, not an object"
        )
    unknown = set(data) - _ROW_FIELDS.get(row.kind, set(data))
    env = data.get("envelope") if row.kind == "step" else None
    if isinstance(env, dict):
        unknown |= {f"envelope.{k}" for k in set(env) - _ENVELOPE_FIELDS}
    if unknown:  # a byte flipped in a field's name: skipping the field changes the run
        raise corrupt_checkpoint(
            key,
            f"journal row {row.seq} ({row.kind} {row.name!r}) has the field(s) "
            f"{sorted(unknown)}, which a Plan run never writes",
        )
    return data


def _unknown_row(key: str, row: JournalRow) -> CheckpointCorruptError:
    return corrupt_checkpoint(
        key,
        f"journal row {row.seq} is a {row.kind!r} row named {row.name!r}, which a Plan "
        "run never writes",
    )


def _replay_step(key: str, rep: Replay, row: JournalRow, data: dict[str, Any]) -> None:
    if not row.name:
        raise corrupt_checkpoint(key, f"journal row {row.seq} has no step name")
    band = data.get("band")
    # Only rows imported from the first formats (before the shape row) may lack
    # their envelope: without it, a resume would run the step again.
    legacy = rep.shape is None and band is None
    if not isinstance(data.get("envelope"), dict | None if legacy else dict):
        raise corrupt_checkpoint(key, f"journal row {row.seq} (step {row.name!r}) has no envelope")
    if band is not None:
        rep.pending.setdefault(str(band), {})[row.name] = data
        return
    rep.applied.append((row.name, data))
    rep.direct.append(row.name)
    _apply_write(rep.kv, data)


def _replay_band(key: str, rep: Replay, row: JournalRow, data: dict[str, Any]) -> None:
    rep.bands.append(str(row.name))
    branches = rep.pending.pop(str(row.name), {})
    for name, branch in branches.items():
        rep.applied.append((name, branch))
        _apply_write(rep.kv, branch)


def _replay_kv(key: str, rep: Replay, row: JournalRow, data: dict[str, Any]) -> None:
    if "key" not in data:
        raise corrupt_checkpoint(key, f"journal row {row.seq} (a kv entry) has no key")
    rep.kv[str(data["key"])] = data.get("value")


def _replay_plan(key: str, rep: Replay, row: JournalRow, data: dict[str, Any]) -> None:
    if row.name != "shape":
        raise _unknown_row(key, row)
    steps = data.get("steps")
    if not _is_shape(steps):
        # read as no shape, the run would pass for one from before shape rows, and
        # its steps would be checked as loosely as those
        raise corrupt_checkpoint(
            key,
            f"journal row {row.seq} (the plan's steps) is not a list of "
            f"[name, parallel, writes] entries: {reprlib.repr(steps)}",
        )
    rep.shape = steps


#: How each kind of Plan journal row applies to the decoded run.
_REPLAY_ROW: dict[str, Callable[[str, Replay, JournalRow, dict[str, Any]], None]] = {
    "step": _replay_step,
    "band": _replay_band,
    "kv": _replay_kv,
    "plan": _replay_plan,
}


def _is_shape(steps: Any) -> bool:
    """Whether ``steps`` is what a shape row lists: ``[name, parallel, writes]`` per step."""
    return isinstance(steps, list) and all(
        isinstance(s, list)
        and len(s) == 3
        and isinstance(s[0], str)
        and isinstance(s[1], bool)
        and (s[2] is None or isinstance(s[2], str))
        for s in steps
    )


def _apply_write(kv: dict[str, Any], data: dict[str, Any]) -> None:
    writes = data.get("writes")
    if writes is not None:
        kv[str(writes)] = row_write_value(data)


def corrupt_checkpoint(key: str, what: str) -> CheckpointCorruptError:
    """The error for the Plan checkpoint under ``key``, corrupt as ``what`` says."""
    return CheckpointCorruptError(
        f"checkpoint {key!r} is corrupt: {what}. Inspect it with `stepstone inspect --db FILE "
        f"{key}` (`--url URL` for PostgreSQL); to start over, remove it with "
        f"store.delete({key!r})"
    )


def check_head(head: RunHead) -> None:
    """Raise CheckpointCorruptError when ``head`` cannot be a Plan run's: every commit that
    leaves a run unfinished names the step it continues at."""
    if head.next_step is None and head.status != "done":
        raise corrupt_checkpoint(
            head.key, f"the run is {head.status!r} but names no step to continue at"
        )
    position, rejoin = head.meta.get("position"), head.meta.get("rejoin")
    if position is not None and (type(position) is not int or position < 0):
        raise corrupt_checkpoint(
            head.key, f"head meta position is {position!r}, not a count of steps"
        )
    if rejoin is not None and (not isinstance(rejoin, str) or not rejoin):
        raise corrupt_checkpoint(head.key, f"head meta rejoin is {rejoin!r}, not a step name")


def check_journal(head: RunHead, rows: list[JournalRow]) -> None:
    """Raise CheckpointCorruptError unless ``rows`` are every journal row ``head`` counts
    and no more (a resume that skipped a lost row would drop its step from the run; one
    past the count would collide with the next commit). ``rows`` must be read
    consistently with ``head`` (``read_run``)."""
    problem = journal_problem(head, rows)
    if problem is not None:
        raise corrupt_checkpoint(head.key, problem)


def plan_view(head: RunHead, rows: list[JournalRow]) -> dict[str, Any]:
    """The checkpoint dict users read (docs/plans.md), assembled from the head and the journal."""
    check_head(head)
    rep = replay(head.key, rows)
    rep.check(head.key)
    return {
        "next_step": head.next_step,
        "kv": rep.kv,
        "completed_steps": [name for name, _ in rep.applied],
        "status": head.status,
        "run_uid": head.run_uid,
        "checkpoint_version": CHECKPOINT_VERSION,
        "history": [
            {"step": name, "iteration": data.get("iteration"), "envelope": _plain(data["envelope"])}
            for name, data in rep.applied
            if data.get("envelope") is not None
        ],
        "iteration": head.iteration,
        "error": head.meta.get("error"),
    }


def _plain(env: dict[str, Any]) -> dict[str, Any]:
    """A journaled envelope as plain JSON (type tags and the encoding version dropped)."""
    out = untag(env)
    out.pop("encoding", None)
    return dict(out)


_LEGACY_KEYS = ("next_step", "kv", "status")


def legacy_import(key: str, text: str) -> tuple[RunHead, list[JournalRow]] | None:
    """Turn a checkpoint stored as a plain value (the first format, v1, or v2) into a run.

    Returns None when the value is not a checkpoint at all. A v1 checkpoint (no
    ``history``) imports with an empty history (guarantee 26).
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(k in data for k in _LEGACY_KEYS):
        return None
    status, next_step, kv = data["status"], data["next_step"], data["kv"]
    if (
        status not in RUN_STATUSES
        or not isinstance(kv, dict)
        or not (next_step is None or isinstance(next_step, str))
    ):
        raise corrupt_checkpoint(
            key, f"legacy checkpoint has invalid status/next_step/kv: {text[:200]}"
        )
    version = data.get("checkpoint_version", 1)
    rows = _legacy_rows(data, kv)
    now = time.time()
    head = RunHead(
        key=key,
        kind="plan",
        status=str(status),
        next_step=next_step,
        run_uid=str(data.get("run_uid") or "legacy"),
        version=1,
        iteration=int(data.get("iteration") or 0),
        journal_len=len(rows),
        host="",
        pid=0,
        pid_start=None,
        lease_until=0.0,
        meta={"checkpoint_version": CHECKPOINT_VERSION, "imported_from_version": version},
        created_at=now,
        updated_at=now,
    )
    return head, rows


def _legacy_rows(data: dict[str, Any], kv: dict[str, Any]) -> list[JournalRow]:
    """The journal rows of a plain-value checkpoint: its kv entries, then its steps."""
    rows: list[JournalRow] = []
    for k, v in kv.items():
        rows.append(JournalRow(len(rows), "kv", None, dumps({"key": k, "value": v})))
    history = data.get("history") or []
    completed = [str(n) for n in data.get("completed_steps") or []]
    if isinstance(history, list) and history:
        for name, row in _legacy_history(history):
            rows.append(JournalRow(len(rows), "step", name, dumps(row)))
    else:
        for name in completed:
            rows.append(JournalRow(len(rows), "step", name, dumps({"envelope": None})))
    return rows


def _legacy_history(history: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(step, row data)`` of each named entry of a v2 checkpoint's history."""
    out: list[tuple[str, dict[str, Any]]] = []
    for item in history:
        if not isinstance(item, dict):
            continue
        name = item.get("step") or item.get("name")
        env = item.get("envelope")
        if env is None and "payload" in item:
            env = {"task": item.get("task"), "payload": item.get("payload")}
        if name:
            out.append((str(name), {"iteration": item.get("iteration"), "envelope": env}))
    return out
