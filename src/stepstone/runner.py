"""Runner: durable agent runs that survive crashes, restarts and pauses for approval.

Every model turn and every tool call of the agent's loop is an effect in the run's
journal (intent before, outcome after), committed through the durable kernel. A crashed
run resumes at its last committed turn: finished tool calls are replayed, not run again,
and the model is not asked again for a committed turn.

Example::

    agent = Agent(name="analyst", model="claude-sonnet-4-6", instructions="Analyze data.")
    runner = Runner(store=Store(db="agents.sqlite"))
    result = await runner.run(agent, user_message="Analyze Q4 revenue trends")
    resumed = await runner.resume(agent, run_id=result.run_id, thread_id=result.thread_id)
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from typing import Any, Literal

from stepstone.agent import Agent
from stepstone.core._checks import check_bool, check_number
from stepstone.core._serialization import to_json_value
from stepstone.core._sync import run_sync
from stepstone.durable import in_doubt_effects, list_runs, settle_effect
from stepstone.durable._agent_journal import corrupt_agent_run
from stepstone.durable._journal_format import Entry, read_entries
from stepstone.engines.llm import LLMEngine
from stepstone.engines.llm._durable import (
    DurableSettings,
    latest_record,
    location_key,
    read_run,
    run_durable,
)
from stepstone.exceptions import AgentCheckpointCorruptionError, UserError
from stepstone.store import JournalRow, Store

__all__ = ["AgentResult", "Runner", "RunnerConfig", "checkpoint_latest_key"]

RunState = Literal["completed", "failed", "paused", "cancelled"]


def checkpoint_latest_key(run_id: str) -> str:
    """The store key whose value is a run's latest checkpoint record.

    ``store.read(checkpoint_latest_key(run_id))`` returns ``{run_id, thread_id,
    schema_version, phase, payload, timestamp_ms}`` of the last committed phase.
    """
    if not isinstance(run_id, str) or not run_id:
        raise UserError(f"run_id must be a non-empty string, got {run_id!r}")
    return location_key(run_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunnerConfig:
    """How a :class:`Runner` writes its checkpoints.

    Attributes:
        checkpoint_async_writes: Phase records and runtime snapshots may be committed
            behind the loop (with the next effect commit, by a background flush within
            ``checkpoint_flush_interval_s``, or at the end). Effect records are never
            behind: a tool's outcome is committed before the model sees it. False: every
            phase is committed before the next model call.
        checkpoint_coalesce_runtime_state: Keep only the latest buffered runtime snapshot.
        checkpoint_flush_timeout_s: Bound on the terminal flush; a failed or timed-out
            flush makes the result ``failed`` with a ``CheckpointFlushError``.
        checkpoint_queue_maxsize: Buffered records beyond this are committed at once.
        checkpoint_flush_interval_s: Longest time a buffered record waits (async mode).
    """

    checkpoint_async_writes: bool = True
    checkpoint_coalesce_runtime_state: bool = True
    checkpoint_flush_timeout_s: float = 10.0
    checkpoint_queue_maxsize: int = 1024
    checkpoint_flush_interval_s: float = 0.05

    def __post_init__(self) -> None:
        """Refuse options of the wrong type or out of range, naming them and the fix.

        Raises:
            ConfigurationTypeError: a flag that is not a bool (``"no"`` would read as True),
                a number given as text or of the wrong kind.
            ConfigurationError: a number out of range (or NaN).
        """
        for flag in ("checkpoint_async_writes", "checkpoint_coalesce_runtime_state"):
            check_bool(f"RunnerConfig({flag}=...)", getattr(self, flag))
        check_number(
            "RunnerConfig(checkpoint_flush_timeout_s=...)",
            self.checkpoint_flush_timeout_s,
            least=0,
            inclusive=False,
            example=10.0,
        )
        check_number(
            "RunnerConfig(checkpoint_queue_maxsize=...)",
            self.checkpoint_queue_maxsize,
            integer=True,
            least=1,
            example=1024,
        )
        check_number(
            "RunnerConfig(checkpoint_flush_interval_s=...)",
            self.checkpoint_flush_interval_s,
            least=0,
            example=0.05,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentResult:
    """What a durable agent run ended with.

    Attributes:
        run_id: The run's id (its idempotency key: resume and lookups use it).
        thread_id: The conversation thread.
        state: ``completed``, ``failed``, ``paused`` (waiting for approvals) or
            ``cancelled`` (reserved: a cancelled task leaves the run resumable, like a
            crash).
        final_text: The model's last text.
        final_structured: The structured output (JSON form) when the agent has one.
        tool_executions: One dict per tool call (``call_id, tool, turn, index, content,
            error, input_hash, output_hash``).
        subagent_executions: The same for subagent (agent-as-tool) calls.
        usage: Token counts over the whole run (replayed turns included).
        total_cost_usd: Estimated cost (None when the model's price is unknown).
        replayed_effect_count: Effects (model turns and tool calls) satisfied from the
            journal instead of executed, over the last run or resume.
        pending_approvals: For a paused run: ``{call_id, tool, arguments, turn, index,
            reason}`` per call waiting for a person.
        error: For a failed run: ``{"type", "message"}``.
        llm_calls: Model turns of the run.
        tool_calls: Tool calls the model asked for.
    """

    run_id: str
    thread_id: str
    state: RunState
    final_text: str = ""
    final_structured: Any = None
    tool_executions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    subagent_executions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    usage: dict[str, int] = dataclasses.field(default_factory=dict)
    total_cost_usd: float | None = None
    replayed_effect_count: int = 0
    pending_approvals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: dict[str, str] | None = None
    llm_calls: int = 0
    tool_calls: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentResult:
        """Rebuild a result from its stored form (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored in the ``run_terminal`` record."""
        return dataclasses.asdict(self)


def _entries(key: str, run_id: str, rows: list[JournalRow]) -> list[Entry]:
    """The entries of the journal of the agent run ``run_id`` (under ``key``).

    Raises:
        AgentCheckpointCorruptionError: a row that does not decode.
    """
    try:
        return read_entries(rows)
    except ValueError as exc:
        raise corrupt_agent_run(key, run_id, f"a journal row does not decode ({exc})") from exc


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(
            f"{name} must be a non-empty string, got {value!r}; omit it to get a fresh one"
        )
    return value


class Runner:
    """Runs agents durably: every turn and tool call is journaled in ``store``.

    ``Runner()`` alone keeps runs in an in-memory store: they survive nothing but a
    pause within this process. Pass ``Store(db=...)`` (or a PostgreSQL URL) to survive
    crashes and to resume from another process.

    Args:
        store: Where runs live.
        config: How checkpoints are written (:class:`RunnerConfig`).

    Example::

        runner = Runner(store=Store(db="agents.sqlite"),
                        config=RunnerConfig(checkpoint_async_writes=False))
        result = runner.run_sync(agent, user_message="Refund order 42")
        if result.state == "paused":   # a tool requires approval
            runner.resume_sync(agent, run_id=result.run_id, thread_id=result.thread_id,
                               approvals={result.pending_approvals[0]["call_id"]: True})
    """

    def __init__(self, *, store: Store | None = None, config: RunnerConfig | None = None) -> None:
        if store is not None and not isinstance(store, Store):
            raise UserError(
                f"Runner(store=...) takes a Store, got {type(store).__name__} {store!r}; "
                "pass Store(db='runs.sqlite') or Store(url='postgresql://...')"
            )
        if config is not None and not isinstance(config, RunnerConfig):
            raise UserError(
                f"Runner(config=...) takes a RunnerConfig, got {type(config).__name__} "
                f"{config!r}; pass RunnerConfig(**settings)"
            )
        self.store = store if store is not None else Store()
        self.config = config or RunnerConfig()

    def __repr__(self) -> str:
        return f"Runner(store={self.store!r})"

    def _settings(self) -> DurableSettings:
        c = self.config
        return DurableSettings(
            async_writes=c.checkpoint_async_writes,
            coalesce=c.checkpoint_coalesce_runtime_state,
            flush_timeout_s=c.checkpoint_flush_timeout_s,
            queue_maxsize=c.checkpoint_queue_maxsize,
            flush_interval_s=c.checkpoint_flush_interval_s,
        )

    async def _go(
        self,
        agent: Agent,
        *,
        run_id: str,
        thread_id: str | None,
        user_message: str | None,
        context: dict[str, Any] | None,
        approvals: dict[str, Any] | None,
        must_exist: bool,
    ) -> AgentResult:
        if not isinstance(agent, Agent) or not isinstance(agent.engine, LLMEngine):
            raise UserError(
                f"Runner runs LLM agents (Agent(model=...) or Agent(engine=LLMEngine(...))), "
                f"got {agent!r}; a Plan is durable on its own (Plan(store=..., "
                "checkpoint_key=...))"
            )
        result = await run_durable(
            agent.engine,
            store=self.store,
            key=checkpoint_latest_key(run_id),
            run_id=run_id,
            thread_id=thread_id,
            user_message=user_message,
            context=context,
            ctx=agent.run_context(),
            approvals=approvals,
            settings=self._settings(),
            must_exist=must_exist,
            retry_failed=False,
            retry_retryable=must_exist,  # resume() tries a rate-limited run again
        )
        return AgentResult.from_dict(result)

    async def run(
        self,
        agent: Agent,
        *,
        user_message: str,
        context: dict[str, Any] | None = None,
        thread_id: str | None = None,
        run_id: str | None = None,
    ) -> AgentResult:
        """Run ``agent`` on ``user_message`` to a terminal state (or a pause).

        Args:
            agent: An LLM agent.
            user_message: The task.
            context: A JSON dict kept with the run (restored on resume).
            thread_id: The conversation thread (default: the stored run's thread, or a
                fresh id for a new run).
            run_id: The run's idempotency key (default: a fresh id). Running again with
                the id of a crashed run continues it; of a finished run returns its result.
                ``runner.runs()`` and ``stepstone runs`` list the ids a store holds.

        Raises:
            UserError: an empty id, ``run_id`` already used for another message, a
                ``thread_id`` other than the stored run's, or a ``context`` that is not a
                dict.
            SerializationError: ``context`` holds a value JSON cannot hold.
            ConcurrentRunError: a live process is running this ``run_id``.
        """
        if not isinstance(user_message, str):
            raise UserError(f"user_message must be a string, got {user_message!r}")
        if context is not None:
            if not isinstance(context, dict):
                raise UserError(f"context must be a dict of JSON values, got {context!r}")
            context = to_json_value(context, where="Runner.run(context=...)", strict=True)
        return await self._go(
            agent,
            run_id=_check_id("run_id", run_id if run_id is not None else uuid.uuid4().hex),
            thread_id=None if thread_id is None else _check_id("thread_id", thread_id),
            user_message=user_message,
            context=context,
            approvals=None,
            must_exist=False,
        )

    async def resume(
        self,
        agent: Agent,
        *,
        run_id: str,
        thread_id: str | None = None,
        approvals: dict[str, bool | str] | None = None,
    ) -> AgentResult:
        """Continue run ``run_id`` from its last committed phase.

        ``run_id`` alone names the run: ``thread_id`` defaults to the stored run's thread,
        and one that contradicts it is an error.

        A finished run returns its stored result (no model or tool call), except one that
        failed on a retryable error (a rate limit, a provider outage: ``result.error`` has
        ``retryable: True`` and ``retry_at``), which continues from where it stopped, its
        committed turns and tool calls kept. A paused run
        continues with ``approvals`` (``{call_id: True}`` runs the call; ``False`` or a
        reason string gives the model a refusal as the tool's result). Decisions recorded
        with ``stepstone approve`` (:func:`stepstone.durable.approve_call`) apply to the
        pending calls ``approvals`` does not name.

        Raises:
            AgentCheckpointCorruptionError: no checkpoint for ``run_id``, or a malformed
                one (nothing is written).
            UserError: a ``thread_id`` other than the stored run's.
            ConcurrentRunError: a live process owns the run.
        """
        return await self._go(
            agent,
            run_id=_check_id("run_id", run_id),
            thread_id=None if thread_id is None else _check_id("thread_id", thread_id),
            user_message=None,
            context=None,
            approvals=approvals,
            must_exist=True,
        )

    def run_sync(
        self,
        agent: Agent,
        *,
        user_message: str,
        context: dict[str, Any] | None = None,
        thread_id: str | None = None,
        run_id: str | None = None,
    ) -> AgentResult:
        """Synchronous :meth:`run` (not from inside a running event loop)."""
        return run_sync(
            self.run(
                agent,
                user_message=user_message,
                context=context,
                thread_id=thread_id,
                run_id=run_id,
            ),
            sync_name="runner.run_sync(...)",
            async_name="await runner.run(...)",
        )

    def resume_sync(
        self,
        agent: Agent,
        *,
        run_id: str,
        thread_id: str | None = None,
        approvals: dict[str, bool | str] | None = None,
    ) -> AgentResult:
        """Synchronous :meth:`resume` (not from inside a running event loop)."""
        return run_sync(
            self.resume(agent, run_id=run_id, thread_id=thread_id, approvals=approvals),
            sync_name="runner.resume_sync(...)",
            async_name="await runner.resume(...)",
        )

    # -- calls in doubt ----------------------------------------------------------------------
    def in_doubt(self, run_id: str) -> list[dict[str, Any]]:
        """The calls of run ``run_id`` (and its subagents) that started before a crash and
        have no recorded outcome: ``{run_key, position, kind, name, call_id, turn, index,
        live}`` each.

        Raises:
            UserError: no run ``run_id`` in this store.
        """
        return in_doubt_effects(self.store, checkpoint_latest_key(run_id))

    def settle(
        self,
        run_id: str,
        effect: str,
        *,
        happened: bool,
        result: Any = None,
        note: str | None = None,
    ) -> dict[str, Any]:
        """Record what a call in doubt of run ``run_id`` did, so the run can go on.

        A tool declared ``in_doubt="fail"`` that was running when its process died stops the
        run (``EffectInDoubtError``). Check the outside world, then settle the call:
        ``happened=True`` with the ``result`` it returned (the run's next resume gives it to
        the model as the call's result, without calling the tool), or ``happened=False``
        (the next resume calls the tool again). ``effect`` is the call id the error names,
        or its position (``"tool:2:0"``, from :meth:`in_doubt`). Then
        ``runner.resume(agent, run_id=...)`` continues the run from there.

        Returns:
            ``{key, run_key, position, kind, name, call_id, happened, result, status}``.

        Raises:
            UserError: no such run or call in doubt, or a result for a call that did not
                happen (see :func:`stepstone.durable.settle_effect`).
            ConcurrentRunError: a live process owns the run.
        """
        return settle_effect(
            self.store,
            checkpoint_latest_key(run_id),
            effect,
            happened=happened,
            result=result,
            note=note,
        )

    # -- inspection ------------------------------------------------------------------------
    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """Every phase record of ``run_id``, in order: the run's audit trail."""
        key = checkpoint_latest_key(run_id)
        _, rows = read_run(self.store, key)
        return [copy.deepcopy(e.data) for e in _entries(key, run_id, rows) if e.kind == "phase"]

    def snapshot(self, run_id: str) -> dict[str, Any]:
        """The full runtime snapshot of ``run_id``: counters, usage and cost, context,
        ``messages`` (the transcript, one journal row per message), ``pending_llm_response``,
        ``tool_executions`` and ``subagent_executions``.

        Raises:
            AgentCheckpointCorruptionError: no checkpoint for ``run_id``.
        """
        key = checkpoint_latest_key(run_id)
        head, rows = read_run(self.store, key)
        if head is None:
            raise AgentCheckpointCorruptionError(f"no checkpoint for agent run {run_id!r}")
        snap: dict[str, Any] = {}
        messages: list[dict[str, Any]] = []
        outcomes: dict[int, dict[str, Any]] = {}
        tools: list[dict[str, Any]] = []
        subs: list[dict[str, Any]] = []
        for row in _entries(key, run_id, rows):
            data = copy.deepcopy(row.data)
            if row.kind == "snapshot":
                snap = data
            elif row.kind == "message":
                messages.append(data)
            elif row.kind == "outcome" and data.get("kind") == "model":
                resp = data["data"]
                outcomes[data["turn"]] = resp
                messages.append(
                    {
                        "role": "assistant",
                        "text": resp.get("text"),
                        "tool_calls": resp.get("tool_calls"),
                    }
                )
            elif row.kind == "outcome":
                body = data.get("data") or {}
                entry = {
                    "call_id": data.get("call_id"),
                    "tool": data.get("name"),
                    "turn": data.get("turn"),
                    "content": body.get("content"),
                    "error": body.get("error"),
                }
                (subs if data.get("kind") == "subagent" else tools).append(entry)
                messages.append({"role": "tool", **entry})
        pending = None
        if outcomes:
            last = max(outcomes)
            calls = outcomes[last].get("tool_calls") or []
            done = {t["call_id"] for t in tools + subs if t["turn"] == last}
            if calls and not {c.get("id") for c in calls} <= done:
                pending = outcomes[last]
        return {
            **snap,
            "messages": messages,
            "pending_llm_response": pending,
            "tool_executions": tools,
            "subagent_executions": subs,
        }

    def runs(self, *, thread_id: str | None = None) -> list[dict[str, Any]]:
        """Runs in this store (of ``thread_id`` only, when given), each as ``{run_id,
        thread_id, status, phase, timestamp_ms}`` with its latest phase."""
        out: list[dict[str, Any]] = []
        for head in list_runs(self.store, "agent:"):
            if head.kind != "agent" or not head.key.endswith(":checkpoint:latest"):
                continue
            if thread_id is not None and head.meta.get("thread_id") != thread_id:
                continue
            found = read_run(self.store, head.key)
            record = (latest_record(head.key, found[1]) if found is not None else None) or {}
            out.append(
                {
                    "run_id": head.meta.get("run_id"),
                    "thread_id": head.meta.get("thread_id"),
                    "status": head.status,
                    "phase": record.get("phase"),
                    "timestamp_ms": record.get("timestamp_ms"),
                }
            )
        return out
