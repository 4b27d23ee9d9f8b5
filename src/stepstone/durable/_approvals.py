"""Agent runs seen from outside their owner: their journal as phases, effects and pending
approvals, and approval decisions recorded by an operator.

An agent run paused on a tool approval keeps the pending calls in its last ``run_terminal``
phase record. :func:`approve_call` records a decision for one of them in the run's head
(``meta["approvals"]``, with the call's position and the journal's length, which names the
pause), through the head's compare-and-swap; the next resume of that run (``runner.resume``
or ``Plan(resume=True)`` re-running the step) applies it as if it had been passed in
``approvals=`` (see :func:`recorded_approvals`). A decision is tied to the call's position
and to that pause, so it never applies to a later call that reuses the id, nor to the same
call asked about again after a crash. Every function here, but :func:`approve_call`, only
reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stepstone.durable._agent_journal import AGENT_KIND
from stepstone.durable._journal_format import Entry, entries_of
from stepstone.durable._leases import owner_alive
from stepstone.durable._records import list_runs
from stepstone.exceptions import ApprovalTargetError, UserError
from stepstone.store._base import Claim, JournalRow, RunHead
from stepstone.store._store import Store

__all__ = [
    "agent_timeline",
    "agent_view",
    "applied_decisions",
    "approve_call",
    "check_approvals",
    "decision_conflicts",
    "paused_on",
    "plan_decisions",
    "pending_approvals",
    "recorded_approvals",
    "refusal_text",
    "waiting_calls",
]


_DECISIONS = "True (run the call), False or a reason why not (a non-empty str) to refuse it"


def check_approvals(approvals: Any, *, error: type[UserError] = UserError) -> dict[str, bool | str]:
    """``approvals`` (a resume's decisions for the calls a run waits on), checked: None or a
    mapping of call ids (non-empty str) to True, False or a non-empty reason. Returns them
    as a dict. A decision is never read from a value's truthiness: ``1`` is not True, and
    ``None`` or ``""`` is not a refusal.

    Raises:
        UserError: (or ``error``) anything else, naming the call id, the value and the fix.
    """
    if approvals is None:
        return {}
    if not isinstance(approvals, Mapping):
        raise error(
            f"approvals= must map call ids to {_DECISIONS}, got a {type(approvals).__name__} "
            f"{approvals!r:.200}; e.g. approvals={{'call_0_0': True}} with ids from "
            "pending_approvals"
        )
    for call_id, decision in approvals.items():
        if not isinstance(call_id, str) or not call_id:
            raise error(
                f"approvals= must map call ids to {_DECISIONS}; {call_id!r} "
                f"({type(call_id).__name__}) is not a call id: use the call_id strings "
                "from pending_approvals"
            )
        if not isinstance(decision, bool) and not (isinstance(decision, str) and decision.strip()):
            raise error(
                f"approvals= must map call ids to {_DECISIONS}; call id {call_id!r} has "
                f"{decision!r:.100} ({type(decision).__name__}). Pass {{{call_id!r}: True}} to "
                f"run it, or {{{call_id!r}: 'why not'}} to refuse it (the model reads the reason)"
            )
    return dict(approvals)


def _terminal(rows: Sequence[JournalRow] | Sequence[Entry]) -> dict[str, Any]:
    """The ``terminal_result`` of the run's latest phase record, when that is terminal."""
    for entry in reversed(entries_of(rows)):
        if entry.kind != "phase":
            continue
        data = entry.data
        if data.get("phase") != "run_terminal":
            return {}
        payload = data.get("payload")
        result = payload.get("terminal_result") if isinstance(payload, dict) else None
        return result if isinstance(result, dict) else {}
    return {}


def pending_approvals(
    head: RunHead, rows: Sequence[JournalRow] | Sequence[Entry]
) -> list[dict[str, Any]]:
    """The tool calls a paused agent run waits on (``call_id, tool, arguments, turn,
    index, reason``), each with the ``decision`` an operator recorded for it (or None)."""
    if head.kind != AGENT_KIND or head.status != "paused":
        return []
    decided = head.meta.get("approvals") or {}
    out = []
    for p in paused_on(rows):
        d = decided.get(p.get("call_id"))
        # A decision answers the pause it was given for: the call at that position, the
        # journal as long as it was then (an approved call that crashed and paused again,
        # in doubt, waits for a new decision; one recorded before journal_len was kept
        # answers by position only).
        same = (
            isinstance(d, dict)
            and (d.get("turn"), d.get("index")) == (p.get("turn"), p.get("index"))
            and d.get("journal_len", head.journal_len) == head.journal_len
        )
        out.append({**p, "decision": d.get("decision") if same and d else None})
    return out


def recorded_approvals(
    head: RunHead | None, rows: Sequence[JournalRow] | Sequence[Entry]
) -> dict[str, bool | str]:
    """The decisions recorded by :func:`approve_call` for the calls the run waits on now,
    by call id (what its next resume applies when the caller passes none for them)."""
    if head is None:
        return {}
    return {
        p["call_id"]: p["decision"]
        for p in pending_approvals(head, rows)
        if p["decision"] is not None
    }


def paused_on(rows: Sequence[JournalRow] | Sequence[Entry]) -> list[dict[str, Any]]:
    """The calls an agent run's latest record says it waits on (a paused ``run_terminal``),
    whatever its head says: a resume that died before it committed anything leaves them so."""
    result = _terminal(rows)
    if result.get("state") != "paused":
        return []
    return [p for p in result.get("pending_approvals") or [] if isinstance(p, dict)]


_REFUSED = "not approved: "
_CALLS = ("tool:", "subagent:")


def applied_decisions(
    store: Store, key: str, rows: Sequence[JournalRow] | Sequence[Entry]
) -> dict[str, set[bool | str]]:
    """The decisions the agent run under ``key`` (``rows``: its journal) has applied, by call
    id, for every call it paused on: True once the call started (it was approved, or it ran
    before it was in doubt), the reason once it was refused (``"refused"`` for False). A
    call paused on several times (approved, then in doubt after a crash) has each. A
    subagent's call (``"subagent:T:I/<id>"``) is read from the subagent's own run."""
    asked, started, refused = _calls_of(rows)
    out: dict[str, set[bool | str]] = {}
    for call_id, p in asked.items():
        via = p.get("via")
        if isinstance(via, str) and via:
            _add_subagent_decisions(out, store, key, call_id, via)
            continue
        pos = f"{p.get('turn')}:{p.get('index')}"
        decided: set[bool | str] = {True} if pos in started else set()
        if pos in refused:
            decided.add(refused[pos])
        if decided:
            out[call_id] = decided
    return out


def _calls_of(
    rows: Sequence[JournalRow] | Sequence[Entry],
) -> tuple[dict[str, dict[str, Any]], set[str], dict[str, str]]:
    """From an agent run's journal: the calls it paused on (by call id), the positions
    (``"turn:index"``) of the calls that started, and the reasons of those refused (by
    position)."""
    asked: dict[str, dict[str, Any]] = {}
    started: set[str] = set()
    refused: dict[str, str] = {}
    for row in entries_of(rows):
        data = row.data
        if row.kind == "phase" and data.get("phase") == "run_terminal":
            payload = data.get("payload")
            result = payload.get("terminal_result") if isinstance(payload, dict) else None
            if isinstance(result, dict) and result.get("state") == "paused":
                for p in result.get("pending_approvals") or []:
                    if isinstance(p, dict) and isinstance(p.get("call_id"), str):
                        asked[p["call_id"]] = p
        elif row.kind in ("intent", "outcome") and str(row.name).startswith(_CALLS):
            pos = str(row.name).split(":", 1)[1]  # "turn:index" of a tool or subagent call
            error = (data.get("data") or {}).get("error") if row.kind == "outcome" else None
            if isinstance(error, dict) and error.get("type") == "ApprovalDenied":
                refused[pos] = str(error.get("message", "")).removeprefix(_REFUSED)
            else:
                started.add(pos)
    return asked, started, refused


def _add_subagent_decisions(
    out: dict[str, set[bool | str]], store: Store, key: str, call_id: str, via: str
) -> None:
    """Add to ``out[call_id]`` the decisions the subagent runs ``via`` names (under
    ``key``) applied to the call (``call_id`` without ``via``)."""
    inner = call_id[len(via) :]
    prefix = f"{key}/{via.rstrip('/')}:"
    for sub in list_runs(store, prefix):
        if sub.kind != AGENT_KIND or "/" in sub.key[len(prefix) :]:
            continue
        found = applied_decisions(store, sub.key, store.backend.run_journal(sub.key))
        out.setdefault(call_id, set()).update(found.get(inner, set()))


def decision_conflicts(
    approvals: dict[str, bool | str],
    waiting: list[str],
    applied: dict[str, set[bool | str]],
) -> tuple[list[str], dict[str, str]]:
    """Which of a resume's ``approvals`` the run can take: a call it waits on, or one it
    already decided the same way (a resume retried after a crash, or after it returned).
    Returns the ids it never waited on or no longer does and never decided, and, by id,
    what was decided instead for the ones that contradict what the run did (a refusal of
    a call that already ran, an approval of a refused one)."""
    unknown: list[str] = []
    contradicted: dict[str, str] = {}
    for call_id, decision in approvals.items():
        if call_id in waiting:
            continue
        done = applied.get(call_id)
        want: bool | str = "refused" if decision is False else decision
        if not done:
            unknown.append(call_id)
        elif want not in done:
            contradicted[call_id] = (
                "approved and started"
                if True in done
                else "refused (" + ", ".join(sorted(repr(d) for d in done)) + ")"
            )
    return sorted(unknown), contradicted


def refusal_text(approvals: dict[str, bool | str], contradicted: dict[str, str]) -> str:
    """What is wrong with the decisions :func:`decision_conflicts` found contradicting what
    the run did (``contradicted``: what each call did instead)."""
    return "; ".join(
        f"call {cid!r} was already {what}, so {approvals[cid]!r} for it changes nothing"
        for cid, what in sorted(contradicted.items())
    )


def plan_decisions(store: Store, key: str) -> tuple[list[str], dict[str, set[bool | str]]]:
    """For the Plan (or graph) run under ``key``: the call ids its LLM steps wait on (by
    their latest records) and the decisions they applied (:func:`applied_decisions`)."""
    waiting: list[str] = []
    applied: dict[str, set[bool | str]] = {}
    for sub in list_runs(store, f"{key}:"):
        if sub.kind != AGENT_KIND:
            continue
        rows = store.backend.run_journal(sub.key)
        waiting += [str(p.get("call_id")) for p in paused_on(rows)]
        for call_id, done in applied_decisions(store, sub.key, rows).items():
            applied.setdefault(call_id, set()).update(done)
    return waiting, applied


def waiting_calls(store: Store, head: RunHead, rows: list[JournalRow]) -> list[dict[str, Any]]:
    """The tool calls a paused run waits on, each with the ``run_key`` of the agent run
    that holds it: the run itself, or the LLM steps of a paused Plan (or graph)."""
    if head.status != "paused":
        return []
    if head.kind == "workflow":  # calls its agents (stepstone.integrations) asked about
        from stepstone.durable._operations import pending_operation_approvals

        asked = pending_operation_approvals(head, rows)
        return [{**c, "run_key": head.key} for c in asked if c["decision"] is None]
    if head.kind == AGENT_KIND:
        return [{**p, "run_key": head.key} for p in pending_approvals(head, rows)]
    out: list[dict[str, Any]] = []
    for sub in list_runs(store, f"{head.key}:"):
        if sub.kind == AGENT_KIND and sub.status == "paused":
            sub_rows = store.backend.run_journal(sub.key)
            out += [{**p, "run_key": sub.key} for p in pending_approvals(sub, sub_rows)]
    return out


def _paused_agents(store: Store, key: str) -> list[RunHead]:
    head = store.backend.run_get(key)
    if head is not None and head.kind == AGENT_KIND:
        return [head]
    if head is None:
        raise ApprovalTargetError(
            f"no run under key {key!r}; list the paused ones with `stepstone runs --status paused`"
        )
    # A Plan (or graph) run: its LLM steps journal under keys derived from its own.
    return [h for h in list_runs(store, f"{key}:") if h.kind == AGENT_KIND]


def decision_text(decision: bool | str | None) -> str:
    """A recorded decision in words: ``approved``, ``denied (REASON)``, ``undecided``."""
    if decision is None:
        return "undecided"
    if decision is True:
        return "approved"
    return "denied" if decision is False else f"denied ({decision})"


def approve_call(
    store: Store,
    key: str,
    call_id: str,
    *,
    decision: bool | str = True,
    replace: bool = False,
) -> dict[str, Any]:
    """Record ``decision`` for the tool call ``call_id`` a paused run waits on.

    ``key`` is the agent run's key, or the key of a Plan whose LLM step paused (the agent
    runs under it are searched). ``decision`` is True (run the call), False or a reason
    (the model gets a refusal); the next resume of the run applies it.

    A decision already recorded for the call is never replaced silently: the same decision
    again writes nothing (``changed`` is False); a different one is refused, naming the
    decision that stands, unless ``replace`` (whoever decides saw it and changes it). The
    check and the write are one compare-and-swap on the run as read, so of two decisions
    given at once the second is refused (to be given again, seeing the first).

    Returns:
        ``{key, run_key, call_id, tool, arguments, decision, previous, changed}``:
        ``previous`` is the decision that stood before (None if none).

    Raises:
        ApprovalTargetError: no such run, the run is live or not paused, it does not wait
            for ``call_id`` (the message lists the ids it waits for), or another decision
            stands and ``replace`` is False.
    """
    from stepstone.durable._inspect import missing_run  # (it reads approvals from here)

    if decision == "" or decision is None:
        raise ApprovalTargetError(
            f"an empty reason for denying {call_id!r}; pass --deny 'why' (the model reads it)"
        )
    found = store.backend.run_get(key)
    if found is None:
        raise ApprovalTargetError(missing_run(store, key))
    if found.kind == "workflow":  # a call an integration's agent asked about
        from stepstone.durable._operations import approve_operation

        return approve_operation(store, key, call_id, decision, replace=replace)
    waiting: list[str] = []
    for head in _paused_agents(store, key):
        rows = store.backend.run_journal(head.key)
        pending = pending_approvals(head, rows)
        waiting += [str(p["call_id"]) for p in pending]
        match = next((p for p in pending if p["call_id"] == call_id), None)
        if match is None:
            continue
        before = match.get("decision")
        if before is None or (before != decision and replace):
            _record(store, head, match, decision)  # refused if the run changed since read
        elif before != decision:
            raise ApprovalTargetError(
                f"tool call {call_id!r} of run {head.key!r} is already "
                f"{decision_text(before)}; nothing was changed. To change the decision to "
                f"{decision_text(decision)}, give it again with replace=True "
                "(`stepstone approve --replace`)"
            )
        return {
            "key": key,
            "run_key": head.key,
            "call_id": call_id,
            "tool": match.get("tool"),
            "arguments": match.get("arguments"),
            "decision": decision,
            "previous": before,
            "changed": before != decision,
        }
    if not waiting:
        raise ApprovalTargetError(
            f"run {key!r} is not paused on a tool approval; `stepstone show {key}` shows its state"
        )
    raise ApprovalTargetError(
        f"run {key!r} does not wait for tool call {call_id!r}; it waits for "
        f"{', '.join(waiting)} (pass one of those)"
    )


def _record(store: Store, head: RunHead, pending: dict[str, Any], decision: bool | str) -> None:
    def decide(cur: RunHead | None, _kv: str | None) -> Claim:
        if cur is None or cur.version != head.version or cur.status != "paused":
            raise ApprovalTargetError(
                f"run {head.key!r} changed while the decision was being recorded (it was "
                "resumed or deleted); check it with `stepstone show` and approve again"
            )
        if owner_alive(cur):
            raise ApprovalTargetError(f"run {head.key!r} is live; approve it once it pauses")
        entry = {
            "decision": decision,
            "turn": pending.get("turn"),
            "index": pending.get("index"),
            "journal_len": cur.journal_len,
            "at": time.time(),
        }
        approvals = {**(cur.meta.get("approvals") or {}), pending["call_id"]: entry}
        new = cur.replace(version=cur.version + 1, meta={**cur.meta, "approvals": approvals})
        return Claim(head=new)

    store.backend.run_transact(head.key, decide)


def agent_view(head: RunHead, rows: Sequence[JournalRow] | Sequence[Entry]) -> dict[str, Any]:
    """An agent run's journal for operators: its phases (a run's start says whether it
    resumed; its end, the state it ended in), its effects (each with the entry it started
    at, what it did, and how many times a resumed run replayed it) and the approvals it
    waits on, each with the times of the commits that wrote it (given the journal's rows;
    None given entries). The one place the operator views read an agent run's entries
    (:func:`agent_timeline` is built on it)."""
    phases: list[dict[str, Any]] = []
    starts: list[int] = []
    effects: dict[str, dict[str, Any]] = {}
    entries = entries_of(rows)
    # the times of the journal row each entry is in (its commit's)
    times: dict[int, tuple[float | None, float | None]] = {
        r.seq: (r.started_at, r.committed_at) for r in rows if isinstance(r, JournalRow)
    }
    for row in entries:
        started_at, committed_at = times.get(row.row, (None, None))
        if row.kind == "phase":
            phase = _phase_view(row, started_at, committed_at)
            if phase["phase"] == "run_started":
                starts.append(row.seq)
            phases.append(phase)
        elif row.kind in ("intent", "outcome") and row.name is not None:
            _add_effect(effects, row.name, row, started_at, committed_at)
    listed = _listed_effects(effects, starts)
    result = _terminal(entries)
    return {
        "phases": phases,
        "effects": listed,
        "pending_approvals": pending_approvals(head, entries),
        "agent_state": result.get("state"),
        "final_text": result.get("final_text"),
    }


def _phase_view(row: Entry, started_at: float | None, committed_at: float | None) -> dict[str, Any]:
    """A phase entry for :func:`agent_view`: a run's start says whether it resumed; its
    end, the state it ended in."""
    data = row.data
    phase = {"seq": row.seq, "phase": data.get("phase"), "at_ms": data.get("timestamp_ms")}
    phase["started_at"], phase["committed_at"] = started_at, committed_at
    given = data.get("payload")
    payload: dict[str, Any] = given if isinstance(given, dict) else {}
    if data.get("phase") == "run_started":
        phase["resumed"] = bool(payload.get("resumed"))
    elif data.get("phase") == "run_terminal":
        ended = payload.get("terminal_result")
        result: dict[str, Any] = ended if isinstance(ended, dict) else {}
        phase["state"] = payload.get("state") or result.get("state")
        phase["final_text"] = payload.get("final_text")
        phase["error"] = result.get("error")
    return phase


def _add_effect(
    effects: dict[str, dict[str, Any]],
    name: str,
    row: Entry,
    started_at: float | None,
    committed_at: float | None,
) -> None:
    """Fold an effect's intent or outcome entry (``name``: the effect's position) into its
    view in ``effects`` (``_seq`` and ``_intent_at`` are for :func:`_listed_effects`)."""
    data = row.data
    e = effects.setdefault(
        name,
        {
            "position": name,
            "kind": data.get("kind"),
            "name": data.get("name"),
            "call_id": data.get("call_id"),
            "turn": data.get("turn"),
            "index": data.get("index"),
            "state": "in doubt",
            "error": None,
            "seq": row.seq,
            "_seq": None,
            # when the commit that wrote its intent started (the call ran within
            # that commit's span when its outcome came in the same one), until
            # the commit of its outcome
            "started_at": started_at,
            "committed_at": None,
            "_intent_at": committed_at,
        },
    )
    if row.kind != "outcome":
        return
    out = data.get("data")
    e["state"] = "done"
    e["error"] = out.get("error") if isinstance(out, dict) else None
    e["_seq"] = row.seq
    e["committed_at"] = committed_at
    intent_at, outcome_at = e["_intent_at"], committed_at
    # an intent committed before the call: the call began then
    if intent_at is not None and outcome_at is not None and intent_at < outcome_at:
        e["started_at"] = intent_at
    if isinstance(out, dict):
        e.update(_did(e["kind"], out))


def _listed_effects(effects: dict[str, dict[str, Any]], starts: list[int]) -> list[dict[str, Any]]:
    """The effects' views as listed: each with how many times a resumed run replayed it
    (``starts``: the seqs of the runs' starts), a tool call with its arguments."""
    calls = {  # the arguments of each tool call, as the model asked for it
        c.get("id"): c.get("arguments")
        for e in effects.values()
        for c in e.get("tool_calls") or ()
        if isinstance(c, dict)
    }
    listed = []
    for e in effects.values():
        seq = e.pop("_seq")
        e.pop("_intent_at")
        # Every run started after an outcome was committed replays it instead of calling.
        e["replays"] = 0 if seq is None else sum(1 for s in starts if s > seq)
        if e["kind"] != "model" and e.get("call_id") in calls:
            e["arguments"] = calls[e["call_id"]]
        listed.append(e)
    return listed


def _did(kind: Any, out: dict[str, Any]) -> dict[str, Any]:
    """What an effect's recorded outcome says it did: a model call's text, the tool calls
    it asked for (name and arguments), its model and token counts (``usage``: all of
    them); a tool or subagent call's result."""
    if kind == "model":
        asked = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
            for c in out.get("tool_calls") or ()
            if isinstance(c, dict)
        ]
        usage = out.get("usage")
        tokens = usage if isinstance(usage, dict) else {}
        return {
            "text": out.get("text"),
            "tool_calls": asked,
            "model": out.get("model"),
            "input_tokens": tokens.get("input_tokens"),
            "output_tokens": tokens.get("output_tokens"),
            "usage": tokens or None,
        }
    return {"content": out.get("content")}


def agent_timeline(view: dict[str, Any]) -> list[dict[str, Any]]:
    """An agent run as operators follow it, from :func:`agent_view`: one entry per run
    start (``run``: ``started``, or ``resumed`` where a resume took over), model turn
    (``model``, named by the model, with the tool calls it asked for), tool or subagent
    call (named by the tool, with its arguments and result) and run end (``end``, named by
    the state it ended in), in journal order. Each entry has ``seq``, ``kind``, ``name``,
    ``payload``, ``error`` and a one-line ``detail``."""
    out: list[dict[str, Any]] = []
    for p in view["phases"]:
        times = {"started_at": p.get("started_at"), "committed_at": p.get("committed_at")}
        if p["phase"] == "run_started":
            name = "resumed" if p.get("resumed") else "started"
            out.append({**_entry(p["seq"], "run", name, None, None, f"run {name}"), **times})
        elif p["phase"] == "run_terminal":
            error = p.get("error")
            said = f"ended {p.get('state')}"
            if p.get("final_text"):
                said += f": {_brief(p['final_text'])}"
            entry = _entry(p["seq"], "end", p.get("state"), p.get("final_text"), error, said)
            out.append({**entry, **times})
    for e in view["effects"]:
        extra = {"turn": e.get("turn"), "state": e["state"], "replays": e["replays"]}
        extra.update(started_at=e.get("started_at"), committed_at=e.get("committed_at"))
        if e["kind"] == "model":
            asked = e.get("tool_calls") or []
            said = f"turn {e.get('turn')}: " + (
                ", ".join(_call(c.get("name"), c.get("arguments")) for c in asked)
                if asked
                else _brief(e.get("text") or "")
            )
            payload = {"text": e.get("text"), "tool_calls": asked} if "text" in e else None
        else:
            said = _call(e.get("name"), e.get("arguments"))
            if "content" in e:
                said += f" -> {_brief(e.get('content'))}"
            payload = e.get("content")
            extra.update(call_id=e.get("call_id"), arguments=e.get("arguments"))
        if e["state"] != "done":
            said += " (in doubt: no outcome recorded)"
        entry = _entry(e["seq"], e["kind"] or "effect", e.get("name"), payload, e["error"], said)
        out.append({**entry, **extra})
    out.sort(key=lambda entry: entry["seq"])
    return out


def _entry(seq: int, kind: str, name: Any, payload: Any, error: Any, detail: str) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "name": name,
        "payload": payload,
        "error": error,
        "detail": detail,
    }


def _call(name: Any, arguments: Any) -> str:
    """``lookup(order='o-42')``: a call as a line shows it."""
    if isinstance(arguments, dict):
        args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    else:
        args = "" if arguments is None else repr(arguments)
    return f"{name}({args})"


def _brief(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")
