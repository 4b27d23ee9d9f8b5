"""How a worker runs each kind of queued target durably under its queue entry's key.

Every adapter returns ``run(envelope) -> envelope``; running it again for the same entry
(after a worker died, or handed the run back) resumes the earlier attempt instead of
starting over:

* a Plan (or an Agent over one): the Plan run with a :class:`~stepstone.RunLocation` (the
  worker's store, the entry's key) in its run context, which resumes like ``resume=True``;
* a compiled graph: its invocations carry the entry's key as their ``correlation_id``, and
  their ids are noted under the entry's key (found by key, not by a scan of every graph
  record); the latest one is resumed (or, when done, its final state returned);
* an Agent over an ``LLMEngine``: a :class:`~stepstone.Runner` run whose ``run_id`` is the
  entry's key (a crashed run continues, a finished one returns its stored result);
* an Agent over a ``ReplanEngine``: the agent run with that same location;
* a workflow (``@workflow``): its run under the entry's key, with the arguments the
  submitted envelope carries (a crashed run resumes, a finished one returns its result).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from stepstone.agent import Agent
from stepstone.core import Envelope, RunContext, RunLocation
from stepstone.core._envelope import ErrorInfo
from stepstone.durable import blocking_call, run_head
from stepstone.engines.graph import (
    CheckpointFilter,
    CheckpointRecord,
    CompiledGraph,
    StoreCheckpointer,
)
from stepstone.engines.graph._records import GRAPH_KIND
from stepstone.engines.llm import LLMEngine
from stepstone.engines.plan import Plan
from stepstone.engines.replan import ReplanEngine
from stepstone.engines.workflow import Workflow, queued_args, run_workflow
from stepstone.exceptions import ConcurrentRunError, StoreError, UserError
from stepstone.runner import Runner
from stepstone.store import Store
from stepstone.store._queue_base import QueueEntry

__all__ = [
    "queued_agent",
    "queued_graph",
    "queued_plan",
    "queued_replan",
    "queued_run",
    "queued_workflow",
]

Run = Callable[[Envelope[Any]], Awaitable[Envelope[Any]]]


def queued_run(obj: Any, store: Store, entry: QueueEntry) -> Run:
    """The adapter for the target object ``obj`` (a factory is called first).

    Raises:
        UserError: ``obj`` is none of the kinds a worker runs.
    """
    if (
        not isinstance(obj, Plan | Agent | CompiledGraph)
        and callable(obj)
        and not hasattr(obj, "run")
    ):
        obj = obj()  # a factory
    if isinstance(obj, CompiledGraph):
        return queued_graph(obj, store, entry)
    if isinstance(obj, Workflow):
        return queued_workflow(obj, store, entry)
    agent = obj if isinstance(obj, Agent) else None
    engine = agent.engine if agent is not None else obj
    if isinstance(engine, Plan):
        return queued_plan(engine, agent, store, entry)
    if agent is not None and isinstance(engine, ReplanEngine):
        return queued_replan(engine, agent, store, entry)
    if agent is not None and isinstance(engine, LLMEngine):
        return queued_agent(agent, store, entry)
    raise UserError(
        f"target {entry.target!r} of queued run {entry.id} is a {type(obj).__name__}"
        + (f" over a {type(engine).__name__}" if agent is not None else "")
        + ", not a Plan, a compiled graph, an Agent over a Plan, an LLMEngine or a "
        "ReplanEngine, a workflow, or a function returning one"
    )


def _task_text(env: Envelope[Any]) -> str:
    return env.task if env.task is not None else env.text()


def queued_plan(plan: Plan, agent: Agent | None, store: Store, entry: QueueEntry) -> Run:
    """``plan`` (``agent``'s, with its tools, when it is an Agent's) recorded in ``store``
    under the entry's key: a :class:`RunLocation` in its run context, so the plan itself
    runs (its options kept), never a copy of it."""
    location = RunLocation(store=store, key=entry.run_key)
    if agent is None:
        ctx = RunContext(location=location)

        async def run_plan(env: Envelope[Any]) -> Envelope[Any]:
            return await plan.run(env, ctx)

        return run_plan
    return _agent_at(agent, location)


def queued_replan(engine: ReplanEngine, agent: Agent, store: Store, entry: QueueEntry) -> Run:
    """``agent`` (over a ReplanEngine) recorded in ``store`` under the entry's key."""
    return _agent_at(agent, RunLocation(store=store, key=entry.run_key))


def _agent_at(agent: Agent, location: RunLocation) -> Run:
    async def run(env: Envelope[Any]) -> Envelope[Any]:
        return await agent.run(env, location=location)

    return run


def queued_workflow(wf: Workflow[..., Any], store: Store, entry: QueueEntry) -> Run:
    """The workflow ``wf`` run under the entry's key with the arguments its task envelope
    carries (``wf.using(...).submit(*args)`` put them there).

    The result envelope's payload is the workflow's return value; a workflow that raised
    gives an error envelope (its entry ends ``failed``) and its run is recorded ``failed``,
    so a retry of the entry resumes it.
    """

    async def run(env: Envelope[Any]) -> Envelope[Any]:
        args, kwargs, data = queued_args(wf, env)
        try:
            value = await run_workflow(wf.name, wf.fn, store, entry.run_key, args, kwargs, data)
        except (UserError, ConcurrentRunError, StoreError):
            raise
        except Exception as exc:  # noqa: BLE001 - the workflow's own error: its envelope
            return Envelope.error_envelope(
                exc, task=env.task, metadata={"workflow": wf.name, "key": entry.run_key}
            )
        return Envelope(
            task=env.task, payload=value, metadata={"workflow": wf.name, "key": entry.run_key}
        )

    return run


def queued_agent(agent: Agent, store: Store, entry: QueueEntry) -> Run:
    """A :class:`Runner` run of the LLM ``agent`` with ``run_id`` = the entry's key.

    The envelope's payload is the run's ``AgentResult`` in JSON form
    (``AgentResult.from_dict(payload)`` rebuilds it); a failed or paused run's envelope
    carries an error too, so its queue entry ends ``failed``.
    """
    runner = Runner(store=store)

    async def run(env: Envelope[Any]) -> Envelope[Any]:
        result = await runner.run(
            agent, user_message=_task_text(env), run_id=entry.run_key, thread_id=entry.run_key
        )
        error: ErrorInfo | None = None
        if result.state == "paused":
            error = ErrorInfo(
                type="RunPaused",
                message=(
                    f"agent run {result.run_id!r} paused for approvals "
                    f"({len(result.pending_approvals)} pending); continue it with "
                    f"Runner(store=...).resume(agent, run_id={result.run_id!r}, "
                    f"thread_id={result.thread_id!r}, approvals={{...}})"
                ),
                retryable=True,
            )
        elif result.state != "completed":
            info = result.error or {}
            error = ErrorInfo(
                type=str(info.get("type", result.state)),
                message=str(info.get("message", f"agent run ended {result.state}")),
            )
        return Envelope(
            task=env.task,
            payload=result.to_dict(),
            metadata={"run_id": result.run_id, "state": result.state},
            error=error,
        )

    return run


class _EntryCheckpointer(StoreCheckpointer):
    """A graph checkpointer for one queue entry: it notes each new invocation's id under
    the entry's checkpoint key (a plain value, ``{"graph_invocations": [ids]}``) before
    that invocation's record is claimed, so the entry's latest attempt is found by key,
    however many graph records the store holds."""

    def __init__(self, store: Store, pointer: str, own: StoreCheckpointer | None) -> None:
        # the graph's own prefix, serialization and pickle key, in the worker's store
        if own is None:
            super().__init__(store)
        else:
            super().__init__(
                store,
                prefix=own.prefix,
                serialization=own.serialization,
                pickle_key=own.codec.signer,
            )
        self.pointer = pointer
        self.noted: list[str] = []

    def invocations(self) -> list[str]:
        """The ids noted so far, oldest first."""
        value = self.store.read(self.pointer)
        ids = value.get("graph_invocations") if isinstance(value, dict) else None
        self.noted = [str(i) for i in ids] if isinstance(ids, list) else []
        return list(self.noted)

    def key(self, invocation_id: str) -> str:
        # The engine asks for a new invocation's key right before it claims the record.
        if invocation_id not in self.noted:
            self.noted.append(invocation_id)
            self.store.write(self.pointer, {"graph_invocations": self.noted})
        return super().key(invocation_id)

    def latest(self, taken_before: bool) -> CheckpointRecord | None:
        """The newest noted invocation that saved a record (one killed before its first
        save left none worth resuming), or None.

        An entry that a worker took before (``taken_before``) but that has no note was
        taken by a stepstone that did not note invocations yet: its invocations are then
        found by their ``correlation_id`` (a scan of the graph records, once per such
        entry), so it resumes rather than starts over."""
        noted = self.invocations()  # (a note is written with its first id: never empty)
        for invocation_id in reversed(noted):
            head = run_head(self.store, super().key(invocation_id))
            if head is None or head.kind != GRAPH_KIND or head.journal_len == 0:
                continue
            return self.load(invocation_id)
        if taken_before and not noted:
            attempts = self.list(CheckpointFilter(correlation_id=self.pointer))
            return attempts[-1] if attempts else None
        return None


def queued_graph(graph: CompiledGraph[Any], store: Store, entry: QueueEntry) -> Run:
    """``graph`` with a checkpointer in ``store`` (the graph's own prefix and codec); its
    invocations carry the entry's key as ``correlation_id``.

    The task envelope's payload is the initial state (its JSON form); the result's
    payload is the final state's JSON form.
    """
    own = graph.checkpointer if isinstance(graph.checkpointer, StoreCheckpointer) else None
    checkpointer = _EntryCheckpointer(store, entry.run_key, own)
    durable: CompiledGraph[Any] = CompiledGraph(
        state_cls=graph.state_cls,
        nodes=graph.nodes,
        edges=graph.edges,
        entry=graph.entry,
        checkpointer=checkpointer,
        migrations=graph.migrations,
        observers=graph.observers,
    )

    async def run(env: Envelope[Any]) -> Envelope[Any]:
        latest = await blocking_call(store, checkpointer.latest, entry.attempts > 1, bulk=True)
        if latest is not None and latest.status == "done":
            final = durable.load_record(latest.invocation_id).state  # an earlier attempt's
        elif latest is not None:
            final = await durable.ainvoke(resume_invocation=latest.invocation_id)
        else:
            try:
                state = graph.state_cls.model_validate(env.payload)
            except Exception as exc:
                raise UserError(
                    f"queued run {entry.id}: its task is not a {graph.state_cls.__name__} "
                    f"({type(exc).__name__}: {exc}); submit the initial state: "
                    f"submit(store, graph, {graph.state_cls.__name__}(...))"
                ) from exc
            final = await durable.ainvoke(
                state, correlation_id=entry.run_key, metadata={"queue_entry": entry.id}
            )
        return Envelope(
            task=env.task,
            payload=final.model_dump(mode="json"),
            metadata={"correlation_id": entry.run_key},
        )

    return run
