"""One durable LLM run: claim it through the kernel, drive the loop with journaling, end it.

Shared by :class:`stepstone.Runner` and by an ``LLMEngine`` running inside a durable Plan
step or graph node (whose run key is derived from the step execution's position).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any

from pydantic import BaseModel

from stepstone.core import Envelope, ErrorInfo, RunContext, RunLocation, payload_text
from stepstone.core._serialization import to_json_value
from stepstone.durable._agent_journal import (
    AGENT_KIND,
    AgentJournal,
    AgentLog,
    corrupt_agent_run,
    normalize_record,
    validate_record,
)
from stepstone.durable._approvals import (
    applied_decisions,
    check_approvals,
    decision_conflicts,
    recorded_approvals,
    refusal_text,
)
from stepstone.durable._effects import DurableScope
from stepstone.durable._journal_format import read_entries
from stepstone.durable._kernel import OwnedRun, claim_run, describe_owner
from stepstone.durable._leases import owner_alive
from stepstone.durable._messages import encode_value
from stepstone.durable._records import blocking_call
from stepstone.durable._records import read_run as kernel_read_run
from stepstone.durable._settle import settled_since_last_phase
from stepstone.engines.llm._calls import RunState
from stepstone.engines.llm._hooks import AgentPaused, JournaledEffects, LoopHooks
from stepstone.engines.llm._output import type_adapter, wants_structured
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    ConcurrentRunError,
    CorruptRecordError,
    PlanPaused,
    UserError,
)
from stepstone.providers._pricing import estimate_cost
from stepstone.store._base import JournalRow, RunHead, journal_problem
from stepstone.store._store import Store

__all__ = [
    "DurableSettings",
    "agent_view",
    "normalize_record",
    "latest_record",
    "read_run",
    "location_key",
    "run_at_location",
    "run_durable",
    "run_in_scope",
]

log = logging.getLogger("stepstone")

TERMINAL_STATES = ("completed", "failed", "cancelled")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DurableSettings:
    """How a durable run writes (the Runner's config, or the defaults inside a Plan)."""

    async_writes: bool = False
    coalesce: bool = True
    flush_timeout_s: float = 10.0
    queue_maxsize: int = 1024
    flush_interval_s: float = 0.05


def latest_record(key: str, rows: list[JournalRow]) -> dict[str, Any] | None:
    """The validated latest phase record of a run's journal (None when it has none).

    Raises:
        AgentCheckpointCorruptionError: the journal does not decode, or the latest record
            misses a required field.
    """
    try:
        entries = read_entries(rows)
    except ValueError as exc:
        raise AgentCheckpointCorruptionError(
            f"checkpoint {key!r}: the latest record is not valid JSON ({exc}); nothing "
            "was resumed or written. Start a new run under another run_id"
        ) from exc
    for entry in reversed(entries):
        if entry.kind == "phase":
            return validate_record(key, entry.data)
    return None


def agent_view(head: RunHead, rows: list[JournalRow]) -> Any:
    """How ``Store.read`` shows an agent run: its latest phase record."""
    record = latest_record(head.key, rows)
    return record if record is not None else {"status": head.status, "phase": None}


def read_run(
    store: Store, key: str, run_id: str | None = None
) -> tuple[RunHead | None, list[JournalRow]]:
    """The head and journal of the agent run ``run_id`` under ``key`` (blocking).

    Raises:
        AgentCheckpointCorruptionError: the store found the record damaged (a row that does
            not match its checksum...), or the key holds another engine's run.
    """
    try:
        found = kernel_read_run(store, key)
    except CorruptRecordError as exc:
        raise store_corruption(key, run_id, exc) from exc
    if found is None:
        return None, []
    head, rows = found
    if head.kind != AGENT_KIND:
        raise AgentCheckpointCorruptionError(
            f"checkpoint {key!r} holds a {head.kind} run, not an agent run; use another run_id"
        )
    return head, rows


def store_corruption(
    key: str, run_id: str | None, exc: CorruptRecordError
) -> AgentCheckpointCorruptionError | CorruptRecordError:
    """What the store's ``exc`` (a damaged record under ``key``) is for an agent run: an
    :class:`AgentCheckpointCorruptionError` naming the run and the fault (one already
    about an agent run is kept)."""
    if isinstance(exc, AgentCheckpointCorruptionError):
        return exc
    fault = exc.fault or str(exc)
    error = corrupt_agent_run(key, run_id if run_id is not None else _run_id_of(key), fault)
    error.fault = fault
    return error


def _run_id_of(key: str) -> str:
    """The run id of the agent run under ``key`` (a Runner's key names it; the key of an
    LLM loop inside a Plan step or graph node is its run id)."""
    prefix, suffix = "agent:", ":checkpoint:latest"
    if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix + suffix):
        return key[len(prefix) : -len(suffix)]
    return key


def _structured(value: Any, output_type: Any) -> Any:
    """The JSON form of a structured output (None for plain text). By the declared type, not
    the value's: an output of ``Literal["spam", "ham"]`` or a str ``Enum`` is a str too."""
    if not wants_structured(output_type):
        return None
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        return type_adapter(output_type).dump_python(value, mode="json")
    except Exception:  # noqa: BLE001 - a value the type cannot dump: stored as it encodes
        return to_json_value(value, warn=False)


def _result(
    engine: Any,
    journal: AgentJournal,
    state: RunState,
    hooks: LoopHooks,
    outcome: dict[str, Any],
    payload: Any,
    call: _Call,
) -> dict[str, Any]:
    tools_run, subs_run = _tool_executions(journal)
    model = state.model or engine.model
    completed = outcome["state"] == "completed"
    output_type = call.ctx.output_type
    text = completed and not wants_structured(output_type) and isinstance(payload, str)
    return {
        "run_id": call.run_id,
        "thread_id": call.thread,
        "state": outcome["state"],
        "final_text": payload if text else hooks.final_text,
        "final_structured": _structured(payload, output_type) if completed else None,
        "tool_executions": tools_run,
        "subagent_executions": subs_run,
        "usage": state.usage.to_dict(),
        "total_cost_usd": estimate_cost(model, state.usage),
        "replayed_effect_count": journal.replayed,
        "pending_approvals": outcome["pending_approvals"],
        "error": outcome["error"],
        "llm_calls": state.turns,
        "tool_calls": state.tool_calls,
    }


def _tool_executions(journal: AgentJournal) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools: list[dict[str, Any]] = []
    subs: list[dict[str, Any]] = []
    for outcome in sorted(
        journal.outcomes.values(), key=lambda o: (o.get("turn", 0), o.get("index", 0))
    ):
        if outcome.get("kind") not in ("tool", "subagent"):
            continue
        data = outcome.get("data") or {}
        record = {
            "call_id": outcome.get("call_id"),
            "tool": outcome.get("name"),
            "turn": outcome.get("turn"),
            "index": outcome.get("index"),
            "content": data.get("content"),
            "error": data.get("error"),
            "input_hash": outcome.get("input_hash"),
            "output_hash": outcome.get("output_hash"),
        }
        (subs if outcome.get("kind") == "subagent" else tools).append(record)
    return tools, subs


def _pending(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The calls a run's latest record says it waits on (none unless it paused)."""
    stored = (record or {}).get("payload", {}).get("terminal_result") or {}
    pending: list[dict[str, Any]] = stored.get("pending_approvals") or []
    return pending if stored.get("state") == "paused" else []


def _decisions(
    record: dict[str, Any] | None, approvals: dict[str, Any]
) -> dict[tuple[int, int, str], Any]:
    """Approvals by call id, resolved to the positions the run is paused on and the reason
    it asks: a decision applies to that pending call only, never to a later call that
    reuses its id, nor to the same call asked about again for another reason (an approved
    call that was in doubt after a crash)."""
    return {  # a subagent's calls (``via`` it) are decided in its own run
        (p["turn"], p["index"], p.get("reason") or "requires_approval"): approvals[p["call_id"]]
        for p in _pending(record)
        if p["call_id"] in approvals and not p.get("via")
    }


async def _settle(
    call: _Call, found: _Found, approvals: dict[str, bool | str]
) -> dict[str, bool | str]:
    """The caller's ``approvals`` for the calls the run waits on. A decision for a call it
    no longer waits on is let through only when the run applied that very decision (the
    same resume retried after a crash, or after it returned); anything else is refused.

    Raises:
        UserError: an id the run never waited on, or a decision that contradicts what the
            run did (a refusal of a call that already started, an approval of a refused
            one); nothing was read further, run or written.
        ConcurrentRunError: such ids, while a live process runs it (it may pause later).
    """
    store, key, run_id, head = call.store, call.key, call.run_id, found.head
    waiting = [str(p["call_id"]) for p in _pending(found.latest)]
    if any(cid not in waiting for cid in approvals):
        entries = found.log.effects.entries
        applied = await store._offload(applied_decisions, store, key, entries) if head else {}
        unknown, contradicted = decision_conflicts(approvals, waiting, applied)
        if unknown or contradicted:
            if head is not None and await store._offload(
                lambda: owner_alive(head, now=store.backend.clock())
            ):
                raise ConcurrentRunError(
                    f"agent run {run_id!r} is owned by live {describe_owner(head)}; its "
                    "approvals can be given once it has stopped (paused)"
                )
            if unknown:
                raise UserError(
                    f"agent run {run_id!r} is not waiting for approval of call id(s) "
                    f"{unknown}; it waits for {waiting or 'nothing'}. Pass "
                    "approvals={call_id: True} with ids from result.pending_approvals"
                )
            late = refusal_text(approvals, contradicted)
            raise UserError(
                f"agent run {run_id!r}: {late}. Nothing was run or written; the run's result "
                "(runner.resume() without approvals) shows what the call did"
            )
    return {cid: v for cid, v in approvals.items() if cid in waiting}


def _retryable(error: Any) -> bool:
    return isinstance(error, dict) and error.get("retryable") is True


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Call:
    """One call of :func:`run_durable`: which run, started how, written how."""

    store: Store
    key: str
    run_id: str
    thread_id: str | None  # as asked (None: the stored run's)
    user_message: str | None
    context: dict[str, Any] | None
    ctx: RunContext
    settings: DurableSettings
    must_exist: bool
    retry_failed: bool
    retry_retryable: bool
    system_context: str | None
    #: The run's thread, once the record is read (:func:`_identify`).
    thread: str = ""

    def corrupt(self, what: str) -> AgentCheckpointCorruptionError:
        return corrupt_agent_run(self.key, self.run_id, what)


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """The run's record as it was before the claim: its head (None: no run yet) and its
    journal, read and checked once."""

    head: RunHead | None
    log: AgentLog

    @property
    def latest(self) -> dict[str, Any] | None:
        """The run's latest phase record (checked)."""
        return self.log.latest


def _read(store: Store, key: str, run_id: str) -> _Found:
    """The record of the agent run under ``key``, the whole of it checked before anything
    is claimed (blocking: one read, decoded where it was read).

    Raises:
        AgentCheckpointCorruptionError: a damaged record (a row lost or past the head's
            count, a row that does not decode, an effect or record that is not what the
            run wrote, a latest record that misses a field), or another engine's run.
    """
    head, rows = read_run(store, key, run_id)
    if head is None:
        return _Found(None, AgentLog.empty(key, run_id))
    problem = journal_problem(head, rows)
    if problem is not None:
        raise corrupt_agent_run(key, run_id, problem)
    return _Found(head, AgentLog.load(key, run_id, rows))


def _identify(call: _Call, found: _Found) -> tuple[_Call, str]:
    """``call`` with the run's thread (``thread_id=None`` takes the stored run's, or a fresh
    one for a new run), and the user message the run started with, once the record is
    known to be this run's.

    Raises:
        AgentCheckpointCorruptionError: ``must_exist`` and no record, or a record of
            another run or without its first message.
        UserError: another thread, or another user message, than the run's.
    """
    record, run_id = found.latest, call.run_id
    if call.must_exist and (found.head is None or record is None):
        raise AgentCheckpointCorruptionError(
            f"no checkpoint for agent run {run_id!r} (key {call.key!r}): it never started or "
            "the store was cleared. Check the run_id and the store, or start it with "
            "runner.run()"
        )
    if record is not None and record["run_id"] != run_id:
        raise call.corrupt(f"its latest record belongs to run {record['run_id']!r}")
    call = dataclasses.replace(call, thread=_thread_of(call, found))
    return call, _first_message(call, found)


def _thread_of(call: _Call, found: _Found) -> str:
    """The run's thread: the stored one, which ``thread_id=None`` takes (a fresh one for a
    new run).

    Raises:
        UserError: ``thread_id`` contradicts the stored run's thread.
    """
    record, head, thread_id = found.latest, found.head, call.thread_id
    known = record["thread_id"] if record is not None else None
    if known is None and head is not None and isinstance(head.meta.get("thread_id"), str):
        known = head.meta["thread_id"]
    if thread_id is None:
        return known if known is not None else uuid.uuid4().hex
    if known is not None and known != thread_id:
        raise UserError(
            f"agent run {call.run_id!r} belongs to thread {known!r}, not {thread_id!r}; "
            f"pass thread_id={known!r} or leave thread_id out"
        )
    return thread_id


def _first_message(call: _Call, found: _Found) -> str:
    """The user message the run started with.

    Raises:
        AgentCheckpointCorruptionError: a record without its first message.
        UserError: another user message than the run's.
    """
    started = call.user_message
    if found.head is not None and found.log.messages:
        started = found.log.messages[0].get("text")
        if not isinstance(started, str):
            raise call.corrupt("its first message has no text")
    if started is None:
        raise AgentCheckpointCorruptionError(
            f"agent run {call.run_id!r}: the checkpoint has no user message to resume from"
        )
    if call.user_message is not None and found.head is not None and call.user_message != started:
        raise UserError(
            f"run_id {call.run_id!r} already exists with another user_message; a run_id is "
            "the run's idempotency key: pass a new run_id for a new task, or call "
            "runner.resume() to continue this one"
        )
    return started


def _finished(call: _Call, found: _Found) -> dict[str, Any] | None:
    """The stored result of a run that ended (None: the run goes on): a finished run
    gives it, unless it failed and ``retry_failed``, or a call it was in doubt about was
    settled since (``settle_effect``), or it failed on a retryable error and
    ``retry_retryable``."""
    record = found.latest
    stored = record["payload"].get("terminal_result") if record is not None else None
    if record is None or record["phase"] != "run_terminal" or not isinstance(stored, dict):
        return None
    state = stored.get("state")
    again = state != "completed" and (
        call.retry_failed
        or settled_since_last_phase(found.log.effects.entries)
        or (call.retry_retryable and _retryable(stored.get("error")))
    )
    return stored if state in TERMINAL_STATES and not again else None


async def _claim(call: _Call, found: _Found) -> tuple[OwnedRun | None, AgentLog]:
    """Claim the run; returns it with its journal (the one read before, unless the record
    changed meanwhile), or None when it finished meanwhile.

    Raises:
        AgentCheckpointCorruptionError: the store found the record damaged.
        ConcurrentRunError: a live process owns the run.
    """
    store, key, run_id = call.store, call.key, call.run_id
    meta = {"run_id": run_id, "thread_id": call.thread, "agent": call.ctx.agent_name}
    try:
        claim = await store._offload(
            lambda: claim_run(
                store,
                key,
                kind=AGENT_KIND,
                resume=True,
                first_step="turn:0",
                meta=meta,
                what="agent run",
            )
        )
    except CorruptRecordError as exc:  # found by the store under the claim's lock
        raise store_corruption(key, run_id, exc) from exc
    unchanged = (claim.outcome == "resumed" and claim.previous == found.head) or (
        claim.outcome == "fresh" and found.head is None
    )
    if claim.run is None or unchanged:
        return claim.run, found.log
    try:
        return claim.run, (await store._offload(_read, store, key, run_id)).log
    except BaseException:
        claim.run.release()
        raise


async def run_durable(
    engine: Any,
    *,
    store: Store,
    key: str,
    run_id: str,
    thread_id: str | None,
    user_message: str | None,
    context: dict[str, Any] | None,
    ctx: RunContext,
    approvals: dict[str, Any] | None,
    settings: DurableSettings,
    must_exist: bool,
    retry_failed: bool,
    system_context: str | None = None,
    retry_retryable: bool = False,
    address: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) the durable LLM run under ``key`` with the agent's tools, output
    type, name and session from ``ctx``; returns its terminal result dict.

    With the engine's ``stream_to``, the model's text is written to that stream of the run
    ``address`` names (default: ``run_id``) as it comes.

    A finished run gives its stored result, unless ``retry_failed`` (a failed one runs
    again from where it stopped) or ``retry_retryable`` and it failed on a retryable error.
    ``thread_id=None`` takes the stored run's thread (a fresh id for a new run).

    Raises:
        AgentCheckpointCorruptionError: ``must_exist`` and no checkpoint, or a damaged
            record (nothing written).
        ConcurrentRunError: a live process owns the run.
        UserError: ``thread_id`` contradicts the stored run's thread, ``approvals`` is not
            a mapping of call ids to True, False or a reason,
            or (unless ``retry_failed``) names a call the run does not wait on and did not
            decide that way already (see :func:`_settle`).
    """
    call = _Call(
        store=store,
        key=key,
        run_id=run_id,
        thread_id=thread_id,
        user_message=user_message,
        context=context,
        ctx=ctx,
        settings=settings,
        must_exist=must_exist,
        retry_failed=retry_failed,
        retry_retryable=retry_retryable,
        system_context=system_context,
    )
    approvals = check_approvals(approvals)  # before anything is read: the Plan's own check
    found = await store._offload(_read, store, key, run_id)
    call, started = _identify(call, found)
    if approvals and not retry_failed:  # a Plan's step passes all of the Plan's decisions
        approvals = await _settle(call, found, approvals)
    stored = _finished(call, found)
    if stored is not None:  # a finished run: its result (the decisions given were its own)
        return stored
    # Decisions an operator recorded (`stepstone approve`) apply unless the caller decides.
    approvals = {**recorded_approvals(found.head, found.log.effects.entries), **approvals}
    owned, log = await _claim(call, found)
    if owned is None:  # it finished between our read and the claim
        result = _finished(call, await store._offload(_read, store, key, run_id))
        assert result is not None
        return result
    try:
        agent_run = _AgentRun(engine, call, owned, log, approvals, address or run_id)
        return await agent_run.drive(started, found.latest)
    finally:
        owned.release()


class _AgentRun:
    """This process's part of an owned agent run: ``run_started``, the turns (each writes
    ``step_started``, ``pre_llm``, ``post_llm``, ``pre_tool_batch``, ``post_tool_batch``
    through :class:`LoopHooks`), ``run_terminal``."""

    def __init__(
        self,
        engine: Any,
        call: _Call,
        owned: OwnedRun,
        log: AgentLog,
        approvals: dict[str, bool | str],
        address: str,
    ) -> None:
        settings = call.settings
        self.engine = engine
        self.call = call
        self.approvals = approvals
        self.address = address  # whose stream the engine's stream_to writes
        # runs of this record before this one: a resumed run's streamed text is a retry
        self.starts = sum(
            1 for e in log.effects.entries if e.kind == "phase" and e.name == "run_started"
        )
        self.journal = AgentJournal(
            owned,
            log,
            run_id=call.run_id,
            thread_id=call.thread,
            async_writes=settings.async_writes,
            coalesce=settings.coalesce,
            queue_maxsize=settings.queue_maxsize,
            flush_interval=settings.flush_interval_s,
        )
        self.resumed = log.effects.rows > 0
        self.provider = engine.get_provider()
        ctx = call.ctx
        self.state = RunState(run_id=call.run_id, agent_name=ctx.agent_name, session=ctx.session)

    async def drive(self, started: str, latest: dict[str, Any] | None) -> dict[str, Any]:
        """Run the loop from where the journal stands; the run's result."""
        hooks = self._run_started(started, latest)
        outcome, payload = await self._turns(started, hooks)
        result = _result(self.engine, self.journal, self.state, hooks, outcome, payload, self.call)
        if outcome["error"] is not None and outcome["error"]["type"] == _FLUSH_FAILED:
            return result  # the store failed mid-run: no terminal record, resumable
        return await self._run_terminal(hooks, outcome, result)

    def _run_started(self, started: str, latest: dict[str, Any] | None) -> LoopHooks:
        """``run_started`` (and the user message of a new run); the loop's hooks."""
        call, journal = self.call, self.journal
        prior = journal.snapshot or {}
        scope = DurableScope(store=call.store, key=journal.run.key, approvals=self.approvals)
        decisions = _decisions(latest, self.approvals)
        hooks = LoopHooks(
            journal=journal,
            effects=JournaledEffects(journal, store_scope=scope, decisions=decisions),
            provider=self.provider.name,
            requested_model=self.engine.model,
            context=dict(prior.get("context") or call.context or {}),  # the Runner's context
            max_turns=self.engine.max_turns,
            max_tool_calls_per_turn=self.engine.max_tool_calls_per_turn,
            started_at_s=float(prior.get("started_at_s") or time.time()),
        )
        resumed = bool(self.resumed)
        journal.phase("run_started", {"agent_name": call.ctx.agent_name, "resumed": resumed})
        if not journal.messages:
            journal.message({"role": "user", "text": started})
        return hooks

    async def _turns(self, started: str, hooks: LoopHooks) -> tuple[dict[str, Any], Any]:
        """The model and tool loop to its end: ``(outcome, payload)``. A failure the caller
        should see as a result (an error, a pause) is the outcome; one that leaves the
        journal untrusted, not this process's, or the call wrong is raised, and so is a
        cancellation (the run stays resumable where it stopped)."""
        call, engine = self.call, self.engine
        env = Envelope.from_task(started, context=call.system_context)
        outcome: dict[str, Any] = {"state": "completed", "error": None, "pending_approvals": []}
        payload: Any = None
        tokens = _TokenStream.start(engine, call.store, self.address, self.starts + 1)
        try:
            payload = await engine._loop(
                env,
                tools=list(call.ctx.tools),
                output_type=call.ctx.output_type,
                state=self.state,
                hooks=hooks,
                sink=None if tokens is None else tokens.sink,
            )
        except AgentPaused as paused:
            outcome = {"state": "paused", "error": None, "pending_approvals": paused.pending}
        except (ConcurrentRunError, AgentCheckpointCorruptionError, UserError):
            await self.journal.close()  # nothing more is written
            raise
        except Exception as exc:  # noqa: BLE001 - a failed run is a result (in doubt...)
            outcome = {"state": "failed", "error": _error(exc), "pending_approvals": []}
        except BaseException:  # cancellation, KeyboardInterrupt: a crash, resumable
            await self.journal.close()
            raise
        finally:
            if tokens is not None:
                await tokens.close()
        await self.journal.close()
        return outcome, payload

    async def _run_terminal(
        self, hooks: LoopHooks, outcome: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any]:
        """The last runtime snapshot and ``run_terminal``, committed with the run's status
        within ``flush_timeout_s``; the result (``failed`` with a ``CheckpointFlushError``
        when that commit failed)."""
        journal, state, engine = self.journal, self.state, self.engine
        snap = hooks.snapshot(state, outcome["state"])
        snap.update(final_text=result["final_text"], final_structured=result["final_structured"])
        journal.runtime_snapshot(snap)
        journal.phase(
            "run_terminal",
            {
                "state": outcome["state"],
                "final_text": result["final_text"],
                "requested_model": engine.model,
                "normalized_model": state.model or engine.model,
                "provider_adapter": self.provider.name,
                "terminal_result": result,
            },
        )
        status = {"completed": "done", "paused": "paused"}.get(outcome["state"], "failed")
        timeout = self.call.settings.flush_timeout_s
        try:
            await asyncio.wait_for(journal.flush(status=status, force=True), timeout=timeout)
        except ConcurrentRunError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller sees it in the result
            result = {
                **result,
                "state": "failed",
                "error": {
                    "type": _FLUSH_FAILED,
                    "message": (
                        f"agent run {self.call.run_id!r}: the terminal checkpoint flush failed "
                        f"({type(exc).__name__}: {exc}) within checkpoint_flush_timeout_s="
                        f"{timeout}; the run's last records may be missing. Resume it with "
                        "runner.resume() once the store is healthy"
                    ),
                },
            }
        result["checkpoint_commits"] = journal.commits
        return result


_FLUSH_FAILED = CheckpointFlushError.__name__


def _error(exc: Exception) -> dict[str, Any]:
    """How a run that failed on ``exc`` records it (a rate limit, an outage: resumable)."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if getattr(exc, "retryable", False) is True:
        error.update(retryable=True, retry_at=getattr(exc, "retry_at", None))
    return error


async def run_in_scope(
    engine: Any, env: Envelope[Any], scope: DurableScope, ctx: RunContext
) -> Envelope[Any]:
    """The loop inside a durable Plan step, graph node or subagent call: journaled under
    a run key derived from that position, so a crash resumes it at its last committed
    turn (finished tools replayed, the model not asked again for committed turns). A pause
    for approvals pauses the enclosing run (``PlanPaused``)."""
    key = scope.run_key()
    return await _run_journaled(
        engine,
        env,
        ctx,
        store=scope.store,
        key=key,
        run_id=key,
        thread_id=scope.key,
        approvals=scope.approvals,
        pause_raises=True,
        address=scope.run_address,  # its tokens go to the stream of the run it is part of
    )


def location_key(run_id: str) -> str:
    """The record key of the agent run ``run_id`` (what ``checkpoint_latest_key`` gives)."""
    return f"agent:{run_id}:checkpoint:latest"


async def run_at_location(
    engine: Any, env: Envelope[Any], location: RunLocation, ctx: RunContext
) -> Envelope[Any]:
    """The loop as the durable agent run whose ``run_id`` is ``location.key`` (a
    :class:`~stepstone.Runner` run: ``Runner(store).resume(agent, run_id=key,
    thread_id=key)`` continues it and ``runner.snapshot(key)`` shows it). A crashed run
    continues, a failed one is tried again from where it stopped, a finished one gives
    its stored result; a pause for approvals is a retryable ``PlanPaused`` error envelope
    listing the calls in ``metadata["pending_approvals"]``."""
    if not isinstance(location.store, Store):
        raise UserError(
            f"LLMEngine.run: RunLocation(store={location.store!r}) must be a stepstone Store"
        )
    return await _run_journaled(
        engine,
        env,
        ctx,
        store=location.store,
        key=location_key(location.key),
        run_id=location.key,
        thread_id=location.key,
        approvals=None,
        pause_raises=False,
    )


async def _run_journaled(
    engine: Any,
    env: Envelope[Any],
    ctx: RunContext,
    *,
    store: Store,
    key: str,
    run_id: str,
    thread_id: str,
    approvals: dict[str, Any] | None,
    pause_raises: bool,
    address: str | None = None,
) -> Envelope[Any]:
    started = time.perf_counter()
    result = await run_durable(
        engine,
        store=store,
        key=key,
        run_id=run_id,
        thread_id=thread_id,
        user_message=env.task if env.task else payload_text(env.payload),
        context=None,
        ctx=ctx,
        approvals=approvals,
        settings=DurableSettings(),
        must_exist=False,
        retry_failed=True,
        system_context=env.context,
        address=address,
    )
    metadata = {
        "model": engine.model,
        "provider": engine.provider,
        "usage": result["usage"],
        "cost_usd": result["total_cost_usd"],
        "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        "turns": result["llm_calls"],
        "tool_calls": result["tool_calls"],
        "run_id": run_id,
        "replayed_effect_count": result["replayed_effect_count"],
    }
    if result["state"] == "paused":
        pending = result["pending_approvals"]
        ids = ", ".join(str(p["call_id"]) for p in pending)
        paused = PlanPaused(
            f"LLM run {run_id!r} waits for approval of tool call(s) {ids}; resume with "
            "approvals={call_id: True | False | 'reason'}",
            pending_approvals=pending,
        )
        if pause_raises:
            raise paused
        return Envelope.error_envelope(
            paused,
            retryable=True,
            task=env.task,
            metadata={**metadata, "pending_approvals": pending},
        )
    if result["state"] != "completed":
        error = result.get("error") or {"type": "RuntimeError", "message": "failed"}
        info = ErrorInfo(type=error["type"], message=error["message"], retryable=False)
        return Envelope(task=env.task, payload=None, metadata=metadata, error=info)
    payload: Any = result["final_text"]
    if wants_structured(ctx.output_type):
        payload = type_adapter(ctx.output_type).validate_python(result["final_structured"])
    return Envelope(task=env.task, context=env.context, payload=payload, metadata=metadata)


class _TokenStream:
    """The model's text of one durable LLM run, written to a stream of its run as it comes
    (``LLMEngine(stream_to=...)``): ``{"text": ...}`` values, the tokens that came while
    the previous value was written joined into the next, each carrying the run's attempt
    (1, then one more for every resume: a model call that runs again after a crash writes
    its text again)."""

    def __init__(self, store: Store, address: str, name: str, attempt: int, size: int) -> None:
        self.store = store
        self.address = address
        self.name = name
        self.attempt = attempt
        self.sink: asyncio.Queue[str | None] = asyncio.Queue(maxsize=size)
        self.task = asyncio.create_task(self._pump())

    @classmethod
    def start(cls, engine: Any, store: Store, address: str, attempt: int) -> _TokenStream | None:
        name = getattr(engine.settings, "stream_to", None)
        if not name:
            return None
        return cls(store, address, name, attempt, engine.settings.stream_buffer)

    async def _pump(self) -> None:
        backend = self.store.backend
        done = False
        while not done:
            parts: list[str] = []
            token = await self.sink.get()
            while token is not None:
                parts.append(token)
                if self.sink.empty():
                    break
                token = self.sink.get_nowait()
            done = token is None
            if parts:
                text = encode_value({"text": "".join(parts)}, f"stream {self.name!r}")
                await blocking_call(
                    self.store, backend.stream_append, self.address, self.name, text, self.attempt
                )

    async def close(self) -> None:
        """Write what is left and stop (the loop ended, or was stopped)."""
        await self.sink.put(None)
        try:
            await self.task
        except Exception:
            log.warning("stepstone: writing the stream %r failed", self.name, exc_info=True)
