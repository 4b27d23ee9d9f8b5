"""CompiledGraph: runs nodes, saves through the durable kernel, resumes by position."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from stepstone.core._serialization import from_typed_json, to_typed_json
from stepstone.core._sync import cancel_point, run_sync
from stepstone.durable import (
    OwnedRun,
    blocking_call,
    claim_run,
    database_now,
    owner_alive,
    run_head,
)
from stepstone.durable._effects import DurableScope, bind_scope
from stepstone.durable._operations import Call, OperationJournal, Outcome, current_journal
from stepstone.engines.graph._builder import _END_NAME, END, EdgeSpec, NodeSpec
from stepstone.engines.graph._checkpoint import StoreCheckpointer
from stepstone.engines.graph._codec import check_metadata
from stepstone.engines.graph._fanout import run_fan_out
from stepstone.engines.graph._migrate import MigrationRegistry
from stepstone.engines.graph._nodes import call_node, project_in, project_out, update_reducers
from stepstone.engines.graph._observe import (
    Observer,
    Observers,
    Pending,
    check_observers,
    drain,
)
from stepstone.engines.graph._protocol import Checkpointer
from stepstone.engines.graph._records import (
    LOCK_KIND,
    CheckpointRecord,
    FanOutAt,
    Frame,
    NodePosition,
    RawRecord,
)
from stepstone.engines.graph._run import GraphRun
from stepstone.engines.graph._sink import JournalSink, RecordSink, Sink, load_record
from stepstone.engines.graph._state import (
    State,
    apply_update,
    dump_state,
    reducers_of,
)
from stepstone.exceptions import (
    CheckpointNotFound,
    CheckpointRecordInvalid,
    CheckpointSaveFailed,
    CheckpointStateMigrationFailed,
    ConcurrentGraphResumeError,
    ConcurrentRunError,
    ConfigurationError,
    ConfigurationTypeError,
    EdgeException,
    NodeException,
    RoutingError,
    RunCancelledError,
    UserError,
)

__all__ = ["CompiledGraph"]

S = TypeVar("S", bound=State)


@dataclasses.dataclass(slots=True)
class _Resume:
    """Where one frame of a loaded record continues."""

    graph: CompiledGraph[Any]
    state: State
    initial: State | None
    node: str  # the node to run first ("__end__" when the frame is finished)
    step: int
    ns: tuple[str, ...] = ()
    last: tuple[str, int] | None = None  # the frame's last completed node, carried over


@dataclasses.dataclass
class _Begin:
    """How an invoke starts: the chain it belongs to and where its frames continue."""

    correlation_id: str
    origin: str
    resumes: list[_Resume]
    attempt: int
    positions: list[NodePosition]
    metadata: dict[str, Any]
    fan_outs: dict[FanOutAt, dict[int, Any]]

    @classmethod
    def resumed(
        cls, raw: RawRecord, resumes: list[_Resume], metadata: Mapping[str, Any] | None
    ) -> _Begin:
        return cls(
            correlation_id=raw.correlation_id,
            # chains started before origins were recorded keep their correlation id
            origin=raw.origin or raw.correlation_id,
            resumes=resumes,
            attempt=raw.attempt + 1,
            positions=list(raw.positions),
            metadata={**raw.metadata, **(metadata or {})},
            fan_outs=raw.fan_outs,
        )


class CompiledGraph(Generic[S]):
    """A validated graph, ready to run. Build it with ``GraphBuilder(...).compile()``.

    ``await graph.ainvoke(state)`` is canonical; ``graph.invoke(state)`` is its sync form.
    With a checkpointer, every completed node is committed before the next one starts.
    """

    def __init__(
        self,
        *,
        state_cls: type[S],
        nodes: dict[str, NodeSpec],
        edges: dict[str, EdgeSpec],
        entry: str,
        checkpointer: Checkpointer | None,
        migrations: MigrationRegistry,
        observers: tuple[Observer, ...] = (),
    ) -> None:
        self.state_cls = state_cls
        self.observers = observers
        self._deliveries = Pending()
        self.nodes = nodes
        self.edges = edges
        self.entry = entry
        self.checkpointer = checkpointer
        self.migrations = migrations
        self.reducers = reducers_of(state_cls)

    def __repr__(self) -> str:
        return f"CompiledGraph({self.state_cls.__name__}, nodes={list(self.nodes)})"

    # -- public API ----------------------------------------------------------------------
    def invoke(
        self,
        state: S | None = None,
        *,
        correlation_id: str | None = None,
        resume_invocation: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        observers: Sequence[Observer] | None = None,
    ) -> S:
        """Synchronous :meth:`ainvoke` (not from inside a running event loop). It returns
        once its observers were told everything (its event loop ends with the call)."""

        async def invoke_and_drain() -> S:
            try:
                return await self.ainvoke(
                    state,
                    correlation_id=correlation_id,
                    resume_invocation=resume_invocation,
                    metadata=metadata,
                    observers=observers,
                )
            finally:
                await self.drain_observers()

        return run_sync(
            invoke_and_drain(), sync_name="graph.invoke(...)", async_name="graph.ainvoke(...)"
        )

    async def drain_observers(self, timeout: float | None = None) -> bool:
        """Wait until the observers of this graph's invokes on this event loop were told
        every event so far. Call it before the loop ends (``asyncio.run`` cancels what is
        left); the sync :meth:`invoke` does it itself.

        Returns:
            False when ``timeout`` seconds passed first (the deliveries go on).
        """
        return await drain(self._deliveries, timeout)

    async def ainvoke(
        self,
        state: S | None = None,
        *,
        correlation_id: str | None = None,
        resume_invocation: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        observers: Sequence[Observer] | None = None,
    ) -> S:
        """Run the graph to ``END`` and return the final state.

        Every call mints a fresh ``invocation_id`` (resumes too); the previous record
        stays under its own id.

        Args:
            state: The initial state. Ignored when resuming (the saved state wins).
            correlation_id: Your join key across attempts (default: the first
                invocation_id); a resume keeps the saved one.
            resume_invocation: Continue the record of this ``invocation_id``: completed
                positions are skipped, the first uncompleted node runs (from a clean
                slate, against the loaded state), and the saved state is migrated first
                if its ``schema_version`` differs.
            metadata: JSON data stored with the record (str, int, float, bool, None,
                lists and dicts with str keys).
            observers: Functions ``fn(event)`` (sync or async) told of this invoke's
                node starts and ends, saves and end, after those of
                ``GraphBuilder.with_observer``; see :meth:`drain_observers`.

        Raises:
            ConfigurationError: ``correlation_id`` is not a non-empty str or None, or
                ``metadata`` is not a mapping or None (``ConfigurationTypeError`` for a
                wrong type); nothing runs.
            SerializationError: ``metadata`` holds a value JSON cannot hold; the message
                names its key; nothing runs.
            NodeException: a node raised; the nodes before it are saved.
            ConcurrentGraphResumeError: the record is being resumed, or still run, by
                another live invocation.
            CheckpointNotFound, CheckpointRecordInvalid, CheckpointStateMigrationError:
                ``resume_invocation`` cannot be loaded.
        """
        _check_invoke_options(correlation_id, metadata)
        journal = current_journal() if resume_invocation is None else None
        if journal is not None:  # in a workflow's body: one operation of the workflow
            return await self._journaled(
                journal,
                state,
                correlation_id=correlation_id,
                metadata=metadata,
                observers=observers,
            )
        return await self._ainvoke(
            state,
            correlation_id=correlation_id,
            resume_invocation=resume_invocation,
            metadata=metadata,
            observers=observers,
        )

    async def _journaled(self, journal: OperationJournal, state: S | None, **options: Any) -> S:
        """Run the graph as one operation of the workflow ``journal`` belongs to: its final
        state is recorded, so a replay of the workflow returns it without running a node;
        a graph cut short by a crash runs again from its start (guarantee 492)."""
        if state is None or not isinstance(state, self.state_cls):
            raise UserError(
                f"invoke() takes an initial {self.state_cls.__name__} instance, got "
                f"{type(state).__name__}"
            )
        name = f"graph {self.state_cls.__name__}"
        data = to_typed_json(state, where=f"{name} state", strict=True)

        async def invoke(call: Call) -> Outcome:
            # Nodes see a durable scope of their own (as a step's body does): an agent in
            # a node journals under the call's idempotency key, a step is a plain call.
            scope = DurableScope(
                store=journal.store,
                key=call.idempotency_key,
                address=journal.key,
                attempt=call.attempt,
            )
            with bind_scope(scope):
                final = await self._ainvoke(state, resume_invocation=None, **options)
            return Outcome.of(to_typed_json(final, where=f"{name} result", strict=True), final)

        result: S = await journal.operation("graph", name, data, invoke, decode=from_typed_json)
        return result

    async def _ainvoke(
        self,
        state: S | None,
        *,
        correlation_id: str | None,
        resume_invocation: str | None,
        metadata: Mapping[str, Any] | None,
        observers: Sequence[Observer] | None,
    ) -> S:
        told = Observers(
            (*self.observers, *check_observers(observers, "invoke(observers=...)")),
            self._deliveries,
        )
        cp = self.checkpointer
        invocation_id = str(uuid.uuid4())
        lock: OwnedRun | None = None
        try:
            if resume_invocation is not None:
                raw, resumes = await self._load_resume(cp, resume_invocation, correlation_id)
                if isinstance(cp, StoreCheckpointer):
                    lock = await blocking_call(
                        cp.store, self._lock_source, cp, resume_invocation, invocation_id, bulk=True
                    )
                    raw, resumes = await self._reload_if_saved(cp, resume_invocation, raw, resumes)
                begin = _Begin.resumed(raw, resumes, metadata)
            else:
                begin = self._fresh_begin(state, correlation_id, metadata, invocation_id)
            run = await self._first_save(begin, invocation_id, told, cp, resume_invocation)
            return await self._run_to_end(run, begin.resumes)
        finally:
            told.close()
            if lock is not None:
                await blocking_call(lock.store, _release_lock, lock)

    async def _first_save(
        self,
        begin: _Begin,
        invocation_id: str,
        told: Observers,
        cp: Checkpointer | None,
        resumed_from: str | None,
    ) -> GraphRun:
        """The new invocation's run, its first record saved (with a checkpointer)."""
        run = GraphRun(
            sink=None,
            invocation_id=invocation_id,
            correlation_id=begin.correlation_id,
            attempt=begin.attempt,
            positions=begin.positions,
            observers=told,
            fan_done={at: dict(done) for at, done in begin.fan_outs.items()},
        )
        run.sink = await self._start(
            run,
            cp,
            begin.resumes,
            resumed_from=resumed_from,
            metadata=begin.metadata,
            origin=begin.origin,
            fan_outs=begin.fan_outs,
        )
        return run

    async def _load_resume(
        self, cp: Checkpointer | None, resume_invocation: str, correlation_id: str | None
    ) -> tuple[RawRecord, list[_Resume]]:
        """The record to resume and where its frames continue, loaded and checked whole
        before the lock is written: a record that cannot be resumed leaves every byte as
        it was."""
        if cp is None:
            raise UserError(
                "resume_invocation needs a checkpointer; build the graph with "
                ".with_checkpointer(SQLiteCheckpointer(path))"
            )
        raw = await load_record(cp, resume_invocation)
        if correlation_id is not None and correlation_id != raw.correlation_id:
            raise UserError(
                f"invocation {resume_invocation!r} belongs to correlation_id "
                f"{raw.correlation_id!r}, not {correlation_id!r}; omit correlation_id "
                "when resuming"
            )
        return raw, self._prepare_resume(raw)

    async def _reload_if_saved(
        self,
        cp: StoreCheckpointer,
        resume_invocation: str,
        raw: RawRecord,
        resumes: list[_Resume],
    ) -> tuple[RawRecord, list[_Resume]]:
        """The record as it is under the lock: loaded again if saved since it was read."""
        current = await blocking_call(cp.store, run_head, cp.store, cp.key(resume_invocation))
        if current == raw.head:
            return raw, resumes
        raw = await load_record(cp, resume_invocation)
        return raw, self._prepare_resume(raw)

    def _fresh_begin(
        self,
        state: S | None,
        correlation_id: str | None,
        metadata: Mapping[str, Any] | None,
        invocation_id: str,
    ) -> _Begin:
        if state is None or not isinstance(state, self.state_cls):
            raise UserError(
                f"invoke() takes an initial {self.state_cls.__name__} instance, got "
                f"{type(state).__name__}"
            )
        return _Begin(
            correlation_id=invocation_id if correlation_id is None else correlation_id,
            origin=invocation_id,
            resumes=[_Resume(self, state, None, self.entry, 0)],
            attempt=0,
            positions=[],
            metadata=dict(metadata or {}),
            fan_outs={},
        )

    async def _run_to_end(self, run: GraphRun, resumes: list[_Resume]) -> S:
        """Run the graph from its first frame to ``END`` and save how the run ended."""
        top = resumes[0]
        try:
            final: S = await self._execute(
                run, self, top.state, (), top.node, top.step, resumes[1:]
            )
        except NodeException as exc:
            exc.invocation_id = run.invocation_id if run.sink is not None else None
            await self._finish(run, "failed", exc)
            run.emit("run_end", status="failed", error=exc)
            raise
        except BaseException as exc:
            await self._finish(run, "failed", exc)
            run.emit("run_end", status="failed", error=exc)
            raise
        try:
            await self._finish(run, "done", None)
        except BaseException as exc:
            run.emit("run_end", status="failed", error=exc)
            raise
        run.emit("run_end", status="done", state=final)
        await cancel_point()  # one held back while the last node's thread finished
        return final

    def submit(self, state: S, *, store: Any = None, **options: Any) -> Any:
        """Queue a run from ``state`` for a :class:`~stepstone.Worker`; returns its
        :class:`~stepstone.RunHandle` (``result().payload`` is the final state's JSON form).

        The worker imports this graph by its module-level name (or ``target=``) and runs
        it with a checkpointer in ``store`` (default: the graph's checkpointer's store);
        its invocations carry the run's key as ``correlation_id``, so a run whose worker
        died is resumed, not restarted. ``options``: those of :func:`stepstone.submit`.
        """
        from stepstone.durable._queue import submit

        where = store if store is not None else getattr(self.checkpointer, "store", None)
        if where is None:
            raise UserError(
                "graph.submit() needs a store the workers share: pass store=Store(...) or "
                "compile the graph with_checkpointer(StoreCheckpointer(store))"
            )
        return submit(where, options.pop("target", None) or self, state, **options)

    def load_record(self, invocation_id: str) -> CheckpointRecord:
        """The record of ``invocation_id`` with its state typed and migrated to this
        graph's state classes (the saved record itself is not rewritten)."""
        cp = self.checkpointer
        if cp is None:
            raise UserError("load_record needs a checkpointer (with_checkpointer(...))")
        raw = cp.load_raw(invocation_id) if isinstance(cp, StoreCheckpointer) else None
        if raw is None:
            loaded = cp.load(invocation_id)
            if loaded is None:
                raise CheckpointNotFound(
                    f"{type(cp).__name__}.load({invocation_id!r}) returned None: a "
                    "checkpointer raises CheckpointNotFound for a missing record"
                )
            raw = RawRecord.of(loaded)
        resumes = self._prepare_resume(raw)
        rec = raw.public()
        return dataclasses.replace(
            rec,
            state=resumes[-1].state,
            parent_states=tuple(r.state for r in resumes[:-1]),
            schema_version=resumes[-1].graph.state_cls.schema_version,
        )

    # -- resume --------------------------------------------------------------------------
    def _lock_source(self, cp: StoreCheckpointer, source: str, invocation_id: str) -> OwnedRun:
        """Own the source record's resume lock: a second concurrent resume is refused."""
        try:
            claim = claim_run(
                cp.store,
                cp.lock_key(source),
                kind=LOCK_KIND,
                resume=False,
                first_step=None,
                meta={"resumed_by": invocation_id},
                what="graph resume",
            )
        except ConcurrentRunError as exc:
            raise ConcurrentGraphResumeError(
                f"invocation {source!r} is being resumed by another live invocation; "
                "wait for it to finish (its result is a new record with the same "
                "correlation_id), then resume that record if needed"
            ) from exc
        assert claim.run is not None
        head = run_head(cp.store, cp.key(source))
        if head is not None and owner_alive(head, now=database_now(cp.store)):
            _release_lock(claim.run)
            raise ConcurrentGraphResumeError(
                f"invocation {source!r} is still running (pid {head.pid} on host "
                f"{head.host}); resume it after it stops"
            )
        return claim.run

    def _prepare_resume(self, raw: RawRecord) -> list[_Resume]:
        """Map each saved frame to its graph, migrate its state, find where it continues."""
        out: list[_Resume] = []
        graph: CompiledGraph[Any] = self
        for i, frame in enumerate(raw.frames):
            if i > 0:
                spec = graph.nodes.get(frame.node or "")
                if spec is None or spec.subgraph is None:
                    raise CheckpointRecordInvalid(
                        f"invocation {raw.invocation_id!r} stopped inside subgraph node "
                        f"{frame.node!r}, which this graph of {graph.state_cls.__name__} "
                        "does not have as a subgraph node; resume it with the graph that "
                        "saved it"
                    )
                graph = spec.subgraph
            where = f"invocation {raw.invocation_id!r}"
            state = graph._load_state(frame.state, frame.schema_version, where)
            initial = (
                graph._load_state(frame.initial, frame.schema_version, where)
                if frame.initial is not None
                else None
            )
            ns = frame.ns
            if i + 1 < len(raw.frames):
                inner = raw.frames[i + 1]
                node, step = inner.node or "", int(inner.step or 0)
            elif frame.last is None:
                steps = [p.step for p in raw.positions if p.namespace == ns]
                node, step = graph.entry, (max(steps) + 1 if steps else 0)
            else:
                last, last_step = frame.last
                if last not in graph.nodes:
                    raise CheckpointRecordInvalid(
                        f"{where} last completed node {last!r}, which this graph of "
                        f"{graph.state_cls.__name__} does not have; resume it with the "
                        "graph that saved it, or start a fresh invoke"
                    )
                node, step = graph._route(last, state, ns), last_step + 1
            out.append(_Resume(graph, state, initial, node, step, ns, frame.last))
        return out

    def _load_state(self, saved: Any, version: str, where: str) -> State:
        cls = self.state_cls
        if isinstance(saved, BaseModel):  # a pickle record
            if version != cls.schema_version:
                raise CheckpointStateMigrationFailed(
                    f"{where} was saved with serialization='pickle' at schema_version "
                    f"{version!r}; {cls.__name__} is at {cls.schema_version!r} and pickle "
                    "records cannot be migrated (use serialization='json')",
                    from_version=version,
                    to_version=cls.schema_version,
                )
            if not isinstance(saved, cls):
                raise CheckpointRecordInvalid(
                    f"{where} holds a {type(saved).__name__}, not a {cls.__name__}"
                )
            return saved
        if not isinstance(saved, dict):
            raise CheckpointRecordInvalid(f"{where} has no saved state")
        try:
            return self.migrations.migrate(saved, version, where=where)
        except ValidationError as exc:
            raise CheckpointRecordInvalid(
                f"{where}: the saved state does not validate as {cls.__name__} "
                f"(schema_version {version!r}): {exc}; register a migration with "
                "with_state_migration() or declare a new schema_version"
            ) from exc

    async def _start(
        self,
        run: GraphRun,
        cp: Any,
        resumes: list[_Resume],
        *,
        resumed_from: str | None,
        metadata: dict[str, Any],
        origin: str,
        fan_outs: dict[FanOutAt, dict[int, Any]],
    ) -> Sink | None:
        """Save the new invocation's first record (its frames, carried positions and
        unfinished fan-outs) before any node runs."""
        if cp is None:
            return None
        pickled = isinstance(cp, StoreCheckpointer) and cp.serialization == "pickle"

        def out(state: State | None) -> Any:
            return state if pickled or state is None else dump_state(state)

        frames = [
            Frame(
                node=None if i == 0 else resumes[i - 1].node,
                step=None if i == 0 else resumes[i - 1].step,
                ns=r.ns,
                state=out(r.state),
                initial=out(r.initial),
                schema_version=r.graph.state_cls.schema_version,
                last=r.last,
            )
            for i, r in enumerate(resumes)
        ]
        start: dict[str, Any] = {
            "invocation_id": run.invocation_id,
            "frames": frames,
            "positions": run.positions,
            "attempt": run.attempt,
            "correlation_id": run.correlation_id,
            "resumed_from": resumed_from,
            "metadata": metadata,
            "fan_outs": fan_outs,
        }
        if isinstance(cp, StoreCheckpointer):
            return await blocking_call(
                cp.store,
                lambda: JournalSink.start(cp, **start, origin=origin, first_node=resumes[0].node),
            )
        return await RecordSink.start(cp, **start)

    async def _finish(self, run: GraphRun, status: str, exc: BaseException | None) -> None:
        sink = run.sink
        if sink is None:
            return
        error = None
        if exc is not None:
            cause = exc.__cause__ if isinstance(exc, NodeException) else exc
            error = {
                "type": type(cause).__name__,
                "message": str(cause),
                "node": getattr(exc, "node_name", None),
            }
        try:
            async with run.lock:
                await sink.finish(status, error)
        except Exception:
            if exc is None:
                raise
            # The node's failure is what the caller must see; the record stays "running"
            # (with a dead owner, in a journal), which resumes exactly like "failed".
        finally:
            sink.release()

    # -- execution -----------------------------------------------------------------------
    def _route(self, node: str, state: State, ns: tuple[str, ...]) -> str:
        spec = self.edges[node]
        if spec.target is not None:
            return spec.target
        assert spec.router is not None
        try:
            chosen = spec.router(state)
        except Exception as exc:
            raise EdgeException(
                f"the router after node {node!r} raised {type(exc).__name__}: {exc}",
                node_name=node,
                recoverable_state=state,
                namespace=ns,
            ) from exc
        key = _END_NAME if chosen is END else chosen
        if spec.targets is not None:
            target = spec.targets.get(str(key)) if isinstance(key, str) else None
        else:
            target = key if isinstance(key, str) else None
        if target is None or (target != _END_NAME and target not in self.nodes):
            allowed = [*self.nodes, _END_NAME] if spec.targets is None else spec.targets
            raise RoutingError(
                f"the router after node {node!r} returned {chosen!r}, which is not one of "
                f"its targets {_choices(allowed)}",
                node_name=node,
                recoverable_state=state,
                namespace=ns,
            )
        return target

    async def _execute(
        self,
        run: GraphRun,
        graph: CompiledGraph[Any],
        state: Any,
        ns: tuple[str, ...],
        node: str,
        step: int,
        inner: list[_Resume],
    ) -> Any:
        extra = graph.observers if graph is not self else ()
        while node != _END_NAME:
            await cancel_point()  # a Ctrl-C during the last node stops the run here
            spec = graph.nodes[node]
            where = {"node_name": node, "namespace": ns, "step": step}
            run.emit("node_start", extra, state=state, **where)
            try:
                new, set_fields, extend, pop = await self._run_node(
                    run, graph, spec, state, ns, step, inner, extra
                )
                patch = run.patch(new, set_fields, extend)
            except Exception as exc:
                failed = _node_error(exc, node, state, ns)
                run.emit("node_end", extra, error=failed, **where)
                if failed is exc:
                    raise
                raise failed from exc
            if spec.fan is None and spec.subgraph is not None:
                inner = []  # the resumed subgraph frames are used up
            route_error: NodeException | None = None
            try:
                nxt: str | None = graph._route(node, new, ns)
            except NodeException as exc:
                route_error, nxt = exc, None
            run.emit("node_end", extra, state=new, error=route_error, **where)
            await run.save(NodePosition(ns, node, step, run.attempt), patch, pop, nxt)
            if run.saves:
                run.emit("checkpoint_saved", extra, state=new, **where)
            if route_error is not None:
                raise route_error
            assert nxt is not None
            state, node, step = new, nxt, step + 1
        return state

    async def _run_node(
        self,
        run: GraphRun,
        graph: CompiledGraph[Any],
        spec: NodeSpec,
        state: Any,
        ns: tuple[str, ...],
        step: int,
        inner: list[_Resume],
        extra: tuple[Observer, ...],
    ) -> tuple[Any, list[str], dict[str, list[Any]], int]:
        """Run one node: the new state, what it set and extended, and how many resumed
        frames it used (``pop``)."""
        if spec.fan is not None:
            new, set_fields, extend = await run_fan_out(
                self, run, graph, spec, state, ns, step, extra
            )
            return new, set_fields, extend, 0
        pop = 0
        if spec.subgraph is not None:
            update, pop = await self._run_subgraph(run, graph, spec, state, ns, step, inner)
        else:
            with bind_scope(run.scope(ns, spec.name, step)):
                update = await call_node(spec, state)
        if update is None:
            update = {}
        if not isinstance(update, Mapping):
            raise TypeError(
                f"node {spec.name!r} returned {type(update).__name__}; return a dict "
                "of the fields to update (or None)"
            )
        new, set_fields, extend = apply_update(
            state, update, node=spec.name, reducers=update_reducers(spec, graph)
        )
        return new, set_fields, extend, pop

    async def _run_subgraph(
        self,
        run: GraphRun,
        graph: CompiledGraph[Any],
        spec: NodeSpec,
        state: State,
        ns: tuple[str, ...],
        step: int,
        inner: list[_Resume],
    ) -> tuple[Mapping[str, Any], int]:
        sub = spec.subgraph
        assert sub is not None
        sub_ns = (*ns, spec.name)
        if inner:
            resumed = inner[0]
            sub_state, initial = resumed.state, resumed.initial or resumed.state
            start, sub_step, rest = resumed.node, resumed.step, inner[1:]
            frame = None
        else:
            initial = sub_state = project_in(spec, sub, state)
            start, sub_step, rest = sub.entry, run.next_step(sub_ns), []
            frame = Frame(
                node=spec.name,
                step=step,
                ns=sub_ns,
                state=run.state_out(sub_state),
                initial=run.state_out(initial),
                schema_version=sub.state_cls.schema_version,
            )
            run.pending_push.append(frame)
        final = await self._execute(run, sub, sub_state, sub_ns, start, sub_step, rest)
        pop = 1
        if frame is not None and run.pending_push and run.pending_push[-1] is frame:
            run.pending_push.pop()  # nothing inside was saved: the frame was never written
            pop = 0
        return project_out(spec, graph, initial, final), pop


def _check_invoke_options(correlation_id: Any, metadata: Any) -> None:
    """Refuse an ``invoke`` option of the wrong type before anything runs."""
    if correlation_id is not None and not isinstance(correlation_id, str):
        raise ConfigurationTypeError(
            f"correlation_id must be a str or None, got {correlation_id!r}; pass your job's "
            "key as text, e.g. correlation_id='order-42'"
        )
    if correlation_id == "":
        raise ConfigurationError(
            "correlation_id must not be empty; pass your job's key, or None to use the "
            "first invocation's id"
        )
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigurationTypeError(
            f"metadata must be a dict (JSON-able) or None, got {metadata!r}; pass "
            "metadata={'key': value}"
        )
    if metadata is not None:
        check_metadata(metadata)


def _choices(allowed: Collection[str]) -> str:
    """What a router may return (END shown as END), for its error message."""
    names = [repr(k) for k in sorted(allowed) if k != _END_NAME]
    return f"[{', '.join([*names, *(['END'] if _END_NAME in allowed else [])])}]"


def _release_lock(lock: OwnedRun) -> None:
    try:
        lock.commit_sync(status="done", next_step=None)
    except ConcurrentRunError:
        pass
    finally:
        lock.release()


def _node_error(exc: Exception, node: str, state: Any, ns: tuple[str, ...]) -> Exception:
    """What a node's failure raises: the run's own failures (a save, its ownership, a
    cancel) and NodeExceptions as they are, anything else as a NodeException."""
    if isinstance(exc, CheckpointSaveFailed | ConcurrentRunError | RunCancelledError):
        return exc  # the run's own failure (a save, its ownership), not the node's
    if isinstance(exc, NodeException):
        if exc.node_name == node and not exc.namespace:
            exc.namespace = ns
        return exc
    return NodeException(
        f"node {node!r} raised {type(exc).__name__}: {exc}",
        node_name=node,
        recoverable_state=state,
        namespace=ns,
    )
