"""One execution of a Plan: resolve inputs, call targets, route, commit every step."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import typing
from collections.abc import Mapping
from typing import Any

from stepstone.core import Envelope, ErrorInfo, Sentinel, Tool, is_agent_like
from stepstone.core._sync import cancel_point
from stepstone.core._threads import call_sync, is_awaitable
from stepstone.core._tool import is_async_callable
from stepstone.durable import OwnedRun
from stepstone.durable._effects import DurableScope, bind_scope
from stepstone.durable._kernel import Encoded
from stepstone.engines.plan._checkpoint import Replay, band_row, row_write_value, step_row
from stepstone.engines.plan._compiler import CompiledPlan, Unit, type_adapter
from stepstone.engines.plan._step import Step
from stepstone.engines.plan._stream import step_stream, streaming
from stepstone.exceptions import (
    ConcurrentPlanRunError,
    PlanPaused,
    PlanRuntimeError,
    RunParked,
    SerializationError,
)
from stepstone.observability import EventType, Session

__all__ = ["Advance", "PlanRun", "Stop"]

_TERMINAL = ("done", "failed", "paused")


class MaxIterationsExceeded(Exception):
    """Internal: the Plan hit ``max_iterations`` (surfaces as an error envelope)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Advance:
    """A unit completed: its output and the index of the unit to run next."""

    output: Envelope[Any]
    next_idx: int


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """The run stopped (failed or paused), already committed: the envelope to return."""

    envelope: Envelope[Any]


@dataclasses.dataclass
class PlanRun:
    """The in-memory state of one run; :meth:`execute` drives it to a terminal status."""

    plan: CompiledPlan
    start: Envelope[Any]
    tools: Mapping[str, Tool]
    max_iterations: int
    run: OwnedRun | None = None
    session: Session | None = None
    strict: bool = False
    writes_prefix: str = ""
    # The max_iterations counter: routed re-visits (a unit entered again after it completed
    # in this run) that completed. First visits, failed and paused attempts don't count.
    iteration: int = 0
    position: int = 0  # units completed (history entries are numbered position + 1)
    visited: set[str] = dataclasses.field(default_factory=set)  # unit entries completed
    rejoin: str | None = None
    prev: Envelope[Any] | None = None
    outputs: dict[str, Envelope[Any]] = dataclasses.field(default_factory=dict)
    pending: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Journal rows the run's first commit carries (the plan's shape, on a fresh start).
    start_rows: list[tuple[str, str | None, Any]] = dataclasses.field(default_factory=list)
    approvals: dict[str, bool | str] = dataclasses.field(default_factory=dict)
    #: The ``writes=`` values committed so far (a resumed run starts from its journal's),
    #: latest per key, some still as the encoded text the commit sent.
    written: dict[str, Any] = dataclasses.field(default_factory=dict)
    _lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    _current: str | None = None

    @classmethod
    def fresh(
        cls,
        *,
        plan: CompiledPlan,
        start: Envelope[Any],
        tools: Mapping[str, Tool],
        max_iterations: int,
        session: Session | None,
        strict: bool,
        approvals: dict[str, bool | str],
        meta: dict[str, Any],
        run: OwnedRun | None = None,
        writes_prefix: str = "",
        shape: Encoded | None = None,
    ) -> PlanRun:
        """A run from the first step; ``run`` is None without a store. With a store, the
        first commit also journals ``shape`` (the data of the row naming the plan's steps,
        ``{"steps": [[name, parallel, writes], ...]}``) and later heads say so."""
        start_rows: list[tuple[str, str | None, Any]] = []
        if run is not None and shape is not None:
            start_rows = [("plan", "shape", shape)]
            meta = {**meta, "shape_rows": 1}
        return cls(
            plan=plan,
            start=start,
            tools=tools,
            max_iterations=max_iterations,
            run=run,
            session=session,
            strict=strict,
            writes_prefix=writes_prefix,
            meta=meta,
            start_rows=start_rows,
            approvals=approvals,
        )

    @classmethod
    def resumed(
        cls,
        *,
        plan: CompiledPlan,
        start: Envelope[Any],
        tools: Mapping[str, Tool],
        max_iterations: int,
        session: Session | None,
        strict: bool,
        approvals: dict[str, bool | str],
        meta: dict[str, Any],
        run: OwnedRun,
        writes_prefix: str,
        replay: Replay,
    ) -> PlanRun:
        """A run taken over where it stopped, its memory rebuilt from its journal
        (guarantee 13): outputs for the sentinels, pending band branches, the
        max_iterations counter (routed re-visits, counted from the journal) and the
        previous output."""
        head = run.head
        if replay.shape is not None:
            meta = {**meta, "shape_rows": 1}
        runs: dict[str, int] = {}
        for name, _ in replay.applied:
            if name in plan.unit_of:
                band = plan.band_of(name)
                if band.steps[0].step_name == name:
                    runs[band.entry] = runs.get(band.entry, 0) + 1
        out = cls(
            plan=plan,
            start=start,
            tools=tools,
            max_iterations=max_iterations,
            run=run,
            session=session,
            strict=strict,
            writes_prefix=writes_prefix,
            iteration=sum(n - 1 for n in runs.values()),
            position=int(head.meta.get("position") or 0),
            visited=set(runs),
            rejoin=_pending_rejoin(plan, replay, head.meta.get("rejoin")),
            outputs=replay.envelopes(),
            pending=replay.pending,
            meta=meta,
            approvals=approvals,
            written=dict(replay.kv),
        )
        out.prev = last_output(plan, replay, start)
        return out

    def kv(self) -> dict[str, Any]:
        """The run's ``writes=`` values, as ``store.read(key)["kv"]`` shows them."""
        return {k: json.loads(v.text) if type(v) is Encoded else v for k, v in self.written.items()}

    @property
    def run_id(self) -> str | None:
        return self.run.run_uid if self.run is not None else None

    def _emit(self, kind: EventType, **payload: Any) -> None:
        if self.session is not None:
            self.session.emit(kind, payload, run_id=self.run_id)

    # -- commits -------------------------------------------------------------------------
    async def _commit(
        self,
        *,
        status: str,
        next_step: str | None,
        rows: list[tuple[str, str | None, Any]] | None = None,
        writes: list[tuple[str, Any]] | None = None,
        error: dict[str, Any] | None = None,
        started: float | None = None,
    ) -> None:
        if self.run is None:
            return
        meta = self._meta(error)
        async with self._lock:
            start, self.start_rows = self.start_rows, []
            await self.run.commit(
                status=status,
                next_step=next_step,
                iteration=self.iteration,
                meta=meta,
                rows=start + (rows or []),
                writes=[(self.writes_prefix + k, v) for k, v in writes or []],
                started=started,
            )
            self.written.update(writes or [])
        if self.session is not None:
            self._emit(EventType.CHECKPOINT, key=self.run.key, status=status, next_step=next_step)

    def _meta(self, error: dict[str, Any] | None) -> dict[str, Any]:
        return {**self.meta, "rejoin": self.rejoin, "position": self.position, "error": error}

    async def _fail(self, entry: str, env: Envelope[Any], step: str) -> Envelope[Any]:
        assert env.error is not None
        error = {"step": step, **env.error.to_dict()}
        await self._commit(status="failed", next_step=entry, error=error)
        self._emit(EventType.STEP_ERROR, step=step, error=env.error.to_dict())
        env.metadata.setdefault("step", step)
        return self._stamp(env)

    async def _pause(self, entry: str, step: str, exc: PlanPaused) -> Envelope[Any]:
        # The message names the step that paused: the caller sees where the run waits
        # without reading the checkpoint (metadata["step"] carries the name alone).
        message = exc.message if isinstance(exc.message, str) else str(exc)
        error = ErrorInfo(
            type=type(exc).__name__,
            message=f"Plan paused at step {step!r}: {message}",
            retryable=True,
        )
        env: Envelope[Any] = Envelope(task=self.start.task, payload=None, error=error)
        await self._commit(
            status="paused", next_step=entry, error={"step": step, **error.to_dict()}
        )
        self._emit(EventType.PLAN_PAUSED, step=step, message=exc.message)
        env.metadata["step"] = step
        pending = getattr(exc, "pending_approvals", None)
        if pending:
            env.metadata["pending_approvals"] = pending
        return self._stamp(env)

    def _stamp(self, env: Envelope[Any]) -> Envelope[Any]:
        if self.run is not None:
            env.metadata.setdefault("checkpoint_key", self.run.key)
            env.metadata.setdefault("run_uid", self.run.run_uid)
        return env

    # -- the loop ------------------------------------------------------------------------
    async def execute(self, next_step: str | None) -> Envelope[Any]:
        """Run from ``next_step`` to a terminal status; returns the final envelope."""
        try:
            env = await self._loop(next_step)
            await cancel_point()  # one held back while the last step's thread finished
            return env
        except ConcurrentPlanRunError:
            raise  # we lost ownership: nothing of ours may be written
        except BaseException as exc:
            self._record_crash(exc)
            raise
        finally:
            if self.run is not None:
                self.run.release()

    def _record_crash(self, exc: BaseException) -> None:
        """A crash (KeyboardInterrupt, cancellation, a bug) leaves the run ``failed`` at the
        step it was in, so ``resume=True`` retries from there (best effort: a SIGKILL never
        gets here, and then the lease tells other processes the owner is dead)."""
        run = self.run
        if run is None or run.head.status in _TERMINAL or self._current is None:
            return
        error = {
            "step": self._current,
            "type": type(exc).__name__,
            "message": str(exc),
            "retryable": True,
        }
        try:
            run.commit_sync(
                # a wait its worker parked: resumed at that step when the worker takes it again
                status="paused" if isinstance(exc, RunParked) else "failed",
                next_step=self._current,
                iteration=self.iteration,
                meta=self._meta(error),
            )
        except Exception:  # noqa: BLE001 - the original exception matters more
            pass

    async def _loop(self, next_step: str | None) -> Envelope[Any]:
        units = self.plan.units
        idx = len(units) if next_step is None else self.plan.unit_of[next_step]
        last: Envelope[Any] = self.prev or self.start
        while idx < len(units):
            unit = units[idx]
            self._current = unit.entry
            await cancel_point()  # a Ctrl-C during the last step stops the run here
            if unit.entry in self.visited and self.iteration >= self.max_iterations:
                exc = MaxIterationsExceeded(
                    f"Plan hit max_iterations={self.max_iterations}: routes sent the run back "
                    f"to steps it had already completed {self.iteration} times, and step "
                    f"{unit.entry!r} would be one more. Only such routed re-visits count "
                    "(first visits, failed and paused attempts do not): a routing loop did "
                    "not end. Raise Plan(max_iterations=...) or fix the route predicates"
                )
                return await self._fail(unit.entry, Envelope.error_envelope(exc), unit.entry)
            if unit.is_band:
                outcome = await self._run_band(unit, idx)
            else:
                outcome = await self._run_step(unit.steps[0], idx)
            if isinstance(outcome, Stop):
                return outcome.envelope  # failed or paused, already committed
            last, idx = outcome.output, outcome.next_idx
        self._current = None
        return self._stamp(last)

    def _completed(self, entry: str) -> None:
        """Count a unit's successful execution (called just before its commit)."""
        if entry in self.visited:
            self.iteration += 1
        self.visited.add(entry)
        self.position += 1

    def _next_entry(self, idx: int) -> str | None:
        return self.plan.units[idx].entry if idx < len(self.plan.units) else None

    async def _run_step(self, step: Step, idx: int) -> Advance | Stop:
        name = step.step_name
        env_in = self._input(step)
        if self.session is not None:
            self._emit(EventType.STEP_START, step=name, iteration=self.position + 1)
        try:
            out = await self._invoke(step, env_in)
        except PlanPaused as exc:
            return Stop(await self._pause(name, name, exc))
        if not out.ok:
            return Stop(await self._fail(name, out, name))
        try:
            next_idx = self._route(step, out, idx)
        except PlanRuntimeError as exc:
            await self._fail(name, Envelope.error_envelope(exc), name)
            raise
        nxt = self._next_entry(next_idx)
        if self.run is not None:  # without a store nothing is encoded (and nothing warns)
            try:
                row, value = step_row(
                    name,
                    out,
                    iteration=self.position + 1,
                    band=None,
                    writes=step.writes,
                    strict=self.strict,
                )
            except SerializationError as exc:
                return Stop(
                    await self._fail(name, Envelope.error_envelope(exc, task=out.task), name)
                )
            writes = [(step.writes, value)] if step.writes else None
            self._completed(step.step_name)
            await self._commit(
                status="running" if nxt else "done", next_step=nxt, rows=[row], writes=writes
            )
        else:
            self._completed(step.step_name)
        if self.session is not None:
            self._emit(EventType.STEP_FINISH, step=name, iteration=self.position)
        self.outputs[name] = out
        self.prev = out
        return Advance(out, next_idx)

    async def _run_band(self, unit: Unit, idx: int) -> Advance | Stop:
        done: dict[str, Envelope[Any]] = {}
        values: dict[str, Any] = {}
        for name, data in self.pending.pop(unit.entry, {}).items():
            done[name] = Envelope.from_dict(data["envelope"])
            values[name] = row_write_value(data)  # plain JSON, as a straight run writes it
        todo = [s for s in unit.steps if s.step_name not in done]
        inputs = {s.step_name: self._input(s) for s in todo}
        paused: list[tuple[str, PlanPaused]] = []
        failed: list[tuple[str, Envelope[Any]]] = []
        nth = self.position + 1

        async def branch(step: Step) -> None:
            name = step.step_name
            # the branches run together: each row says when its own branch started
            began = self.run.clock() if self.run is not None else None
            self._emit(EventType.STEP_START, step=name, iteration=nth, band=unit.entry)
            try:
                out = await self._invoke(step, inputs[name])
            except PlanPaused as exc:
                paused.append((name, exc))
                return
            if not out.ok:
                failed.append((name, out))
                return
            if self.run is not None:
                try:
                    row, value = step_row(
                        name,
                        out,
                        iteration=nth,
                        band=unit.entry,
                        writes=step.writes,
                        strict=self.strict,
                    )
                except SerializationError as exc:
                    failed.append((name, Envelope.error_envelope(exc, task=out.task)))
                    return
                # Journal the branch now (not applied yet): a crash or a sibling's failure
                # must not cost this branch's work (guarantee 11).
                await self._commit(
                    status="running", next_step=unit.entry, rows=[row], started=began
                )
                values[name] = value
            self._emit(EventType.STEP_FINISH, step=name, iteration=nth, band=unit.entry)
            done[name] = out

        await asyncio.gather(*(branch(s) for s in todo))
        if failed:
            name, env = failed[0]
            return Stop(await self._fail(unit.entry, env, name))
        if paused:
            name, exc = paused[0]
            return Stop(await self._pause(unit.entry, name, exc))
        for step in unit.steps:
            self.outputs[step.step_name] = done[step.step_name]
        aggregate = self._aggregate(unit)
        next_idx = self._after(idx, target=None)
        nxt = self._next_entry(next_idx)
        writes = [(s.writes, values[s.step_name]) for s in unit.steps if s.writes and values]
        names = [s.step_name for s in unit.steps]
        self._completed(unit.entry)
        await self._commit(
            status="running" if nxt else "done",
            next_step=nxt,
            rows=[band_row(unit.entry, names)],
            writes=writes,
        )
        self.prev = aggregate
        return Advance(aggregate, next_idx)

    # -- routing -------------------------------------------------------------------------
    def _route(self, step: Step, out: Envelope[Any], idx: int) -> int:
        target: str | None = None
        name = step.step_name
        if step.routes is not None:
            for tname, pred in step.routes.items():
                try:
                    hit = pred(out)
                except Exception as exc:
                    raise PlanRuntimeError(
                        f"route predicate of step {name!r} for target {tname!r} raised "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                if hit:
                    target = tname
                    break
        elif step.routes_by is not None:
            field = step.routes_by
            payload = out.payload
            value = (
                payload.get(field) if isinstance(payload, dict) else getattr(payload, field, None)
            )
            if value is not None:
                if not isinstance(value, str) or value not in self.plan.step_of:
                    raise PlanRuntimeError(
                        f"step {name!r} routes_by={field!r} got {value!r}, which is not a step "
                        f"of this plan (steps: {', '.join(self.plan.step_of)})"
                    )
                target = value
        if step.after_branches is not None:
            self.rejoin = step.after_branches
            return self.plan.unit_of[target] if target is not None else idx + 1
        return self._after(idx, target)

    def _after(self, idx: int, target: str | None) -> int:
        """Where to go after the unit at ``idx``: a route target, a pending rejoin (this unit
        was the branch of an ``after_branches`` routing), or the next unit (a detour)."""
        if target is not None:
            self.rejoin = None
            return self.plan.unit_of[target]
        if self.rejoin is not None:
            rejoin, self.rejoin = self.rejoin, None
            return self.plan.unit_of[rejoin]
        return idx + 1

    # -- inputs --------------------------------------------------------------------------
    def _resolve(self, spec: Sentinel | str) -> Envelope[Any]:
        if isinstance(spec, str):
            return Envelope(task=spec, payload=spec)
        if spec.kind == "prev":
            return self.prev or self.start
        if spec.kind == "start":
            return self.start
        assert spec.name is not None
        if spec.kind == "parallel_all":
            return self._aggregate(self.plan.band_of(spec.name))
        return self.outputs.get(spec.name) or Envelope(task="", payload=None)

    def _aggregate(self, unit: Unit) -> Envelope[Any]:
        return _aggregate(unit, self.outputs, self.start)

    def _input(self, step: Step) -> Envelope[Any]:
        source = self._resolve(step.task)
        task = step.task if isinstance(step.task, str) else _as_text(source)
        parts: list[str] = []
        ctx = step.context
        for item in ctx if isinstance(ctx, list) else ([] if ctx is None else [ctx]):
            parts.append(item if isinstance(item, str) else _as_text(self._resolve(item)))
        parts.extend(str(src.text()) for src in step.sources)
        if source is self.start and self.start.context:
            parts.insert(0, self.start.context)  # the caller's context reaches the first step
        context = "\n\n".join(p for p in parts if p) or None
        metadata: dict[str, Any] = {"step": step.step_name, "iteration": self.position + 1}
        if self.run is not None:
            # The same for every attempt of this execution of the step (a failed attempt does
            # not move ``position``, and it is persisted), new for the next execution (a loop)
            # and in another run of the key (started over, rewound by a retry, or a fork):
            # pass it to external APIs so a retried side effect is deduplicated.
            nth = self.position + 1
            metadata["idempotency_key"] = self.run.derived_key(f"{step.step_name}:{nth}")
        return Envelope(task=task, context=context, payload=source.payload, metadata=metadata)

    # -- targets -------------------------------------------------------------------------
    def _scope(self, env: Envelope[Any]) -> DurableScope | None:
        """An LLM loop inside this step execution journals under its idempotency key."""
        key = env.metadata.get("idempotency_key")
        if self.run is None or not isinstance(key, str):
            return None
        return DurableScope(
            store=self.run.store, key=key, approvals=self.approvals, address=self.run.key
        )

    async def _invoke(self, step: Step, env: Envelope[Any]) -> Envelope[Any]:
        """Call the step's target (its LLM text streamed when the run is: ``Plan.stream``)."""
        if not streaming():
            return await self._call(step, env)
        async with step_stream(step.step_name) as end:
            out = await self._call(step, env)
            await end(out)
        return out

    async def _call(self, step: Step, env: Envelope[Any]) -> Envelope[Any]:
        """Call the step's target; exceptions become error envelopes (PlanPaused and
        BaseExceptions propagate)."""
        target: Any = step.target
        if isinstance(target, str):
            target = self.tools[target]
        if isinstance(target, Tool):
            target = target.agent if target.agent is not None else target.fn
        try:
            if step.input is not Any:
                env.payload = type_adapter(step.input).validate_python(env.payload)
            if is_agent_like(target):
                wanted = None if step.output is str else step.output
                with bind_scope(self._scope(env)):
                    out = await target.run(env, output=wanted)
                if not isinstance(out, Envelope):
                    raise TypeError(f"agent {target!r} returned {type(out).__name__}, not Envelope")
            else:
                with bind_scope(self._scope(env)):
                    result = await _call_target(target, env)
                out = (
                    result
                    if isinstance(result, Envelope)
                    else Envelope(task=env.task, payload=result)
                )
            if out.ok and step.output not in (str, Any):
                out.payload = type_adapter(step.output).validate_python(out.payload)
        except Exception as exc:  # noqa: BLE001 - a failing step is data, not a crash
            return Envelope.error_envelope(exc, task=env.task, metadata={"step": step.step_name})
        return out


def _as_text(env: Envelope[Any]) -> str:
    """An envelope as task or context text; a band's outputs read as ``[name]`` blocks."""
    if "band" in env.metadata and env.task is not None:
        return env.task
    return env.text()


@functools.lru_cache(maxsize=1024)
def _convention(fn: Any) -> tuple[str, bool, bool]:
    """How to call a plain function: ``("none"|"payload"|"envelope", wants_context,
    is_async)``."""
    mode, wants_context = _parameters(fn)
    return mode, wants_context, is_async_callable(fn)


def _parameters(fn: Any) -> tuple[str, bool]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "payload", False
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: call by position
        hints = {}
    params = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "context"
    ]
    wants_context = "context" in sig.parameters
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if not params and not var_pos:
        return "none", wants_context
    first = hints.get(params[0].name) if params else None
    if first is not None and (first is Envelope or typing.get_origin(first) is Envelope):
        return "envelope", wants_context
    return "payload", wants_context


async def _call_target(fn: Any, env: Envelope[Any]) -> Any:
    mode, wants_context, is_async = _convention(fn)
    kwargs = {"context": env.context} if wants_context else {}
    args = () if mode == "none" else (env if mode == "envelope" else env.payload,)
    if is_async:
        return await fn(*args, **kwargs)
    result = await call_sync(fn, *args, **kwargs)
    return await result if is_awaitable(result) else result


def _aggregate(
    unit: Unit, outputs: Mapping[str, Envelope[Any]], start: Envelope[Any]
) -> Envelope[Any]:
    """A band's outputs together; the start envelope when none is known (a v1 checkpoint
    had no history, guarantee 26)."""
    outs = [(s.step_name, outputs[s.step_name]) for s in unit.steps if s.step_name in outputs]
    if not outs:
        return start
    text = "\n\n".join(f"[{name}]\n{env.text()}" for name, env in outs)
    return Envelope(
        task=text,
        payload={name: env.payload for name, env in outs},
        metadata={"band": unit.entry},
    )


def _pending_rejoin(plan: CompiledPlan, replay: Replay, recorded: Any) -> Any:
    """The ``after_branches`` step a resumed run goes to after its next unit: set by a
    routed step with ``after_branches`` that is the last unit the journal shows applied
    (then its branch is next), else as the head recorded it. Derived from the journal, so a
    run rewound or forked to just after such a step still rejoins after its branch."""
    if replay.applied:
        last = plan.step_of.get(replay.applied[-1][0])
        if last is not None and last.after_branches is not None:
            return last.after_branches
    return recorded


def last_output(plan: CompiledPlan, replay: Replay, start: Envelope[Any]) -> Envelope[Any] | None:
    """The output of the last unit the journal shows applied (a band's outputs together),
    or None before the first: what the run's next step is given, and a done run's result."""
    if not replay.applied:
        return None
    last = replay.applied[-1][0]
    unit = plan.band_of(last) if last in plan.unit_of else None
    outputs = replay.envelopes()
    if unit is not None and unit.is_band:
        return _aggregate(unit, outputs, start)
    return outputs.get(last)
