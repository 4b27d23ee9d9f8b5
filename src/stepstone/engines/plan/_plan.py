"""Plan: the deterministic step engine, durable when given a store and a checkpoint key."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from stepstone.core import Envelope, RunContext, RunLocation, Tool, build_tool_map
from stepstone.core._ids import new_uid
from stepstone.core._run_context import resolve_run_context
from stepstone.core._serialization import dumps
from stepstone.core._sync import run_sync
from stepstone.durable import (
    aclaim_empty,
    aclaim_run,
    blocking_call,
    database_now,
    delete_run,
    list_runs,
    owner_alive,
    read_run,
)
from stepstone.durable._approvals import (
    check_approvals,
    decision_conflicts,
    plan_decisions,
    refusal_text,
)
from stepstone.durable._kernel import ClaimResult, Encoded
from stepstone.durable._operations import current_journal
from stepstone.durable._queue import RunHandle
from stepstone.engines.plan._checkpoint import (
    CHECKPOINT_VERSION,
    Replay,
    check_head,
    check_journal,
    corrupt_checkpoint,
    legacy_import,
    replay,
)
from stepstone.engines.plan._compiler import CompiledPlan, Unit, check_tools, compile_plan
from stepstone.engines.plan._runner import PlanRun, last_output
from stepstone.engines.plan._serialize import steps_from_dict, steps_to_dict
from stepstone.engines.plan._step import Step
from stepstone.engines.plan._stream import StepToken, stream_run
from stepstone.exceptions import (
    ConfigurationError,
    ConfigurationTypeError,
    PlanCompileError,
    StaleCheckpointError,
    UserError,
)
from stepstone.observability import Session
from stepstone.store import RunHead, Store
from stepstone.store._store import key_problem, shown_key

__all__ = ["Plan", "PlanChangePolicy"]

log = logging.getLogger("stepstone")

#: What ``resume=True`` does with a checkpoint written by a different plan.
PlanChangePolicy = Literal["fail", "restart", "continue"]
_POLICIES = ("fail", "restart", "continue")


class Plan:
    """A deterministic multi-step engine, with checkpoint and resume.

    Steps run in order; ``Step(parallel=True)`` neighbours run concurrently as a band;
    ``routes=`` / ``routes_by=`` jump (loops are routes back, capped by ``max_iterations``).
    Every invalid plan raises :class:`PlanCompileError` at construction, and again when an
    Agent binds its tools, before anything runs.

    With ``store=`` and ``checkpoint_key=``, every step is committed before the next one
    starts: the checkpoint head, the step's history entry and its ``writes=`` value in ONE
    transaction. ``store.read(checkpoint_key)`` shows the checkpoint (``next_step, kv,
    completed_steps, status, run_uid, checkpoint_version, history``).

    Args:
        *steps: The steps, in order.
        max_iterations: ``max_iterations`` (default 100) caps routed re-visits: each time
            a step, or a parallel band counted once, completes again after it already
            completed in the run; first visits and failed or paused attempts never count,
            and a resumed run goes on counting from its journal. Hitting it returns an
            error envelope (``MaxIterationsExceeded``).
        store: Where checkpoints live (needs ``checkpoint_key`` too).
        checkpoint_key: The run's identity in the store. A caller that chooses the key
            itself passes ``agent.run(task, location=RunLocation(store=, key=))`` instead
            (a worker does, with its queue entry's key).
        resume: Take over a failed, paused or dead run where it stopped (and return the
            cached ``kv`` of a done one). ``False`` starts fresh on any key not owned by a
            live run.
        on_concurrent: ``"fail"``: a second live run on the key raises
            ``ConcurrentPlanRunError``. ``"fork"``: each run gets its own key
            ``f"{checkpoint_key}:{run_uid}"`` and its ``writes=`` go under that key too.
        strict: Raise :class:`SerializationError` for values JSON cannot hold, instead of
            storing their ``str()`` with a warning.
        on_plan_change: What ``resume=True`` does when the checkpoint was written by a
            plan with other steps (added, removed, reordered, or other ``parallel=`` /
            ``writes=``). ``"fail"`` (default): raise :class:`StaleCheckpointError` naming
            what changed, before anything is claimed or written. ``"restart"``: start the
            run over under the same key (its history is replaced). ``"continue"``: resume
            by step name anyway (earlier outputs are reused as they are).
        approvals: Decisions for tool calls an LLM step paused on (``requires_approval``),
            by call id: ``True`` runs the call, ``False`` or a reason string refuses it.
            The paused envelope's ``metadata["pending_approvals"]`` lists them.

    Example::

        store = Store(db="run.sqlite")
        plan = Plan(
            Step(extract, writes="raw"),
            Step(transform, writes="clean"),
            store=store,
            checkpoint_key="etl-2026-04-30",
            resume=True,
        )
        Agent(engine=plan)("today's batch")   # continues where a crashed run stopped
    """

    def __init__(
        self,
        *steps: Step,
        max_iterations: int = 100,
        store: Store | None = None,
        checkpoint_key: str | None = None,
        resume: bool = False,
        on_concurrent: Literal["fail", "fork"] = "fail",
        strict: bool = False,
        on_plan_change: PlanChangePolicy = "fail",
        approvals: dict[str, bool | str] | None = None,
    ) -> None:
        _check_options(store, checkpoint_key, resume, on_concurrent, on_plan_change)
        checked = check_approvals(approvals, error=PlanCompileError)
        self.steps: tuple[Step, ...] = tuple(steps)  # compiled once: not to be mutated
        self.max_iterations = max_iterations
        self.store = store
        self.checkpoint_key = checkpoint_key
        self.resume = resume
        self.approvals: dict[str, bool | str] = checked
        self.on_concurrent = on_concurrent
        self.strict = strict
        self.on_plan_change: PlanChangePolicy = on_plan_change
        self._compiled: CompiledPlan = compile_plan(tuple(steps), max_iterations=max_iterations)
        self._shape_text: Encoded | None = None
        for step in self.steps:
            if checkpoint_key is not None and step.writes == checkpoint_key:
                raise PlanCompileError(
                    f"step {step.step_name!r} writes to {step.writes!r}, the checkpoint_key; "
                    "pick another writes= key"
                )

    def __repr__(self) -> str:
        names = ", ".join(s.step_name for s in self.steps)
        return f"Plan({names})"

    def compile(self, tools: list[Tool], *, output_type: type = str) -> None:
        """Check the plan against an Agent's tools (called at Agent construction)."""
        check_tools(self._compiled, {t.name: t for t in tools})

    # -- running -------------------------------------------------------------------------
    async def run(
        self,
        env: Envelope[Any],
        ctx: RunContext | None = None,
        *,
        tools: list[Any] | None = None,
        output_type: type | None = None,
        memory: Any = None,
        session: Session | None = None,
    ) -> Envelope[Any]:
        """Run the plan once on ``env``; the Engine protocol entry point.

        ``ctx`` is the :class:`~stepstone.RunContext` an Agent gives (or pass ``tools=``,
        ``session=``... as keywords instead). With ``ctx.location``, the run is recorded
        under that key in that store (resumed where it stopped, a done one giving its
        cached ``kv``) instead of under this plan's ``checkpoint_key``.

        Step failures and pauses come back as error envelopes; a live concurrent owner
        raises ``ConcurrentPlanRunError``; a route predicate that raises gives
        ``PlanRuntimeError``.
        """
        ctx = resolve_run_context("Plan.run", ctx, tools, output_type, memory, session)
        tool_map = build_tool_map(ctx.tools)
        check_tools(self._compiled, tool_map)
        first = self._compiled.units[0].entry
        settings: dict[str, Any] = dict(
            plan=self._compiled,
            start=env,
            tools=tool_map,
            max_iterations=self.max_iterations,
            session=ctx.session,
            strict=self.strict,
            approvals=self.approvals,
        )
        meta = {"checkpoint_version": CHECKPOINT_VERSION, "fingerprint": self._compiled.fingerprint}
        if ctx.location is None and self.store is None:
            ctx = _in_workflow(ctx)
        store, key, resume = self._where(ctx.location)
        if store is None or key is None:
            return await PlanRun.fresh(**settings, meta=meta).execute(first)
        uid: str | None = None
        writes_prefix = ""
        if self.on_concurrent == "fork" and ctx.location is None:
            uid = new_uid()
            key = f"{key}:{uid}"
            writes_prefix = f"{key}:"
        options: dict[str, Any] = dict(
            kind="plan", first_step=first, meta=meta, run_uid=uid, what="Plan"
        )
        claim, found = await self._claim(store, key, resume, options)
        if claim.run is None:  # resume=True on a done run: the cached kv
            rep = await self._replay_of(store, key, claim.head, found)
            return self._cached(key, claim.head, rep, env, ctx)
        if claim.outcome != "resumed":
            runner = PlanRun.fresh(
                **settings,
                meta=meta,
                run=claim.run,
                writes_prefix=writes_prefix,
                shape=self._shape_row(),
            )
            return self._result(await runner.execute(first), runner, ctx)
        try:
            assert claim.previous is not None
            runner = PlanRun.resumed(
                **settings,
                meta=meta,
                run=claim.run,
                writes_prefix=writes_prefix,
                replay=await self._replay_of(store, key, claim.previous, found),
            )
        except BaseException:
            claim.run.release()  # a corrupt journal: leave the key to a later resume
            raise
        return self._result(await runner.execute(claim.head.next_step), runner, ctx)

    async def stream(
        self,
        env: Envelope[Any],
        ctx: RunContext | None = None,
        *,
        boundaries: bool = False,
        tools: list[Any] | None = None,
        output_type: type | None = None,
        memory: Any = None,
        session: Session | None = None,
    ) -> AsyncGenerator[StepToken, None]:
        """Run the plan as :meth:`run` does (every step committed before the next starts)
        and yield the text of its LLM steps as it comes: :class:`StepToken` strings whose
        ``step`` names the step. ``agent.stream(task)`` over a Plan does the same.

        A step's LLM streams its own text only (an agent it calls as a tool streams
        nothing); parallel steps' text interleaves, each piece tagged with its step; a
        resumed run's committed steps stream nothing. A plan whose steps stream nothing
        yields the run's final text once.

        Args:
            boundaries: Also yield empty markers: ``kind="start"`` and ``"end"`` (with the
                step's result as ``envelope``) around each step execution, and
                ``kind="done"`` (with the run's result) at the end.

        Raises:
            RuntimeError: the run failed or paused (``"<type>: <message>"``), after the
                tokens it streamed; its checkpoint is resumable as after ``run``.
        """

        def run() -> Any:
            return self.run(
                env, ctx, tools=tools, output_type=output_type, memory=memory, session=session
            )

        # closed here, at once, when the consumer stops: its run task is cancelled then
        async with contextlib.aclosing(stream_run(run, boundaries=boundaries)) as tokens:
            async for token in tokens:
                yield token

    async def _claim(
        self, store: Store, key: str, resume: bool, options: dict[str, Any]
    ) -> tuple[ClaimResult, tuple[RunHead, Replay] | None]:
        """Claim the run under ``key``, and the checkpoint read to validate a resume.

        A resume of a key that holds nothing starts a fresh run in one claim. Else read
        and validate the checkpoint before claiming it: a resume that fails on a corrupt
        record must leave every byte as it was."""
        found: tuple[RunHead, Replay] | None = None
        claim = await aclaim_empty(store, key, resume=True, **options) if resume else None
        if claim is not None:
            return claim, found
        if resume:
            found = await blocking_call(store, _read_checkpoint, store, key, bulk=True)
            if found is not None and self.approvals:
                await blocking_call(store, self._check_approvals, store, found[0])
        # The steps of the plan that started the run, for naming what changed (the
        # head carries only their fingerprint: it is rewritten at every step).
        old_shape = found[1].shape if found is not None else None
        claim = await aclaim_run(
            store,
            key,
            resume=resume,
            legacy_import=legacy_import,
            check_resume=lambda head: self._check_resume(head, old_shape, found),
            **options,
        )
        return claim, found

    def _cached(
        self, key: str, head: RunHead, rep: Replay, env: Envelope[Any], ctx: RunContext
    ) -> Envelope[Any]:
        """The result of a done run asked again (``resume=True``): its cached kv.

        A caller's location (a queue's worker) asks for the run's result: the last
        step's output, as the run that finished it returned, with the kv beside it.
        Inline, the payload is the kv, with the last output beside it."""
        cached: dict[str, Any] = {
            "checkpoint_key": key,
            "run_uid": head.run_uid,
            "status": "done",
            "cached": True,
        }
        last = last_output(self._compiled, rep, env)
        if ctx.location is not None and last is not None:
            meta = {**last.metadata, **cached, "kv": rep.kv}
            return dataclasses.replace(last, metadata=meta)
        cached["last_output"] = last.payload if last is not None else None
        return Envelope(task=env.task, payload=rep.kv, metadata=cached)

    @staticmethod
    def _result(out: Envelope[Any], runner: PlanRun, ctx: RunContext) -> Envelope[Any]:
        """A finished run's envelope; for a caller's location (a queue's worker) with the
        run's kv in ``metadata["kv"]``, as a done run's cached result carries it."""
        if ctx.location is None or not out.ok:
            return out
        return dataclasses.replace(out, metadata={**out.metadata, "kv": runner.kv()})

    def _check_approvals(self, store: Store, head: RunHead) -> None:
        """Refuse decisions for calls the run's LLM steps do not wait on (a typo would
        otherwise resume the run only for it to pause again on the same calls), unless
        they applied that very decision already (the same resume retried after a crash or
        after it returned); a decision that contradicts what a step did (a refusal of a
        call that already ran) is refused too, paused run or finished."""
        waiting, applied = plan_decisions(store, head.key)
        unknown, contradicted = decision_conflicts(self.approvals, waiting, applied)
        if unknown:
            raise UserError(
                f"Plan run {head.key!r} is not waiting for approval of call id(s) {unknown}; "
                f"it waits for {waiting or 'nothing'}. Pass approvals={{call_id: True}} with "
                "ids from the paused envelope's metadata['pending_approvals']"
            )
        if contradicted:
            late = refusal_text(self.approvals, contradicted)
            raise UserError(
                f"Plan run {head.key!r}: {late}. Nothing was run or written; resume without "
                "approvals= to see what the call did"
            )

    def _where(self, location: RunLocation | None) -> tuple[Store | None, str | None, bool]:
        """Where this run is recorded and whether it resumes: the caller's location (always
        resumed: the caller gives a key so that a retry continues), else this plan's own."""
        if location is None:
            return self.store, self.checkpoint_key, self.resume
        if not isinstance(location.store, Store):
            raise PlanCompileError(
                f"Plan.run: RunLocation(store={location.store!r}) must be a stepstone Store"
            )
        for step in self.steps:
            if step.writes == location.key:
                raise PlanCompileError(
                    f"step {step.step_name!r} writes to {step.writes!r}, the key the run is "
                    "recorded under (RunLocation.key); pick another writes= key or location"
                )
        return location.store, location.key, True

    @staticmethod
    async def _replay_of(
        store: Store, key: str, head: RunHead, found: tuple[RunHead, Replay] | None
    ) -> Replay:
        """The journal of the run ``head`` describes: the one validated before the claim when
        nothing was committed since (the usual case), else read again."""
        if found is not None and found[0].version == head.version:
            return found[1]
        found = await blocking_call(store, _read_checkpoint, store, key, bulk=True)
        if found is not None:
            return found[1]
        rep = replay(key, [])  # deleted meanwhile: no journal, as the backend reports it
        rep.check(key)
        return rep

    def _shape(self) -> list[list[Any]]:
        return [[s.step_name, s.parallel, s.writes] for s in self.steps]

    def _shape_row(self) -> Encoded:
        """The data of the journal row a fresh run starts with (its steps), encoded once
        per plan."""
        if self._shape_text is None:
            self._shape_text = Encoded(dumps({"steps": self._shape()}))
        return self._shape_text

    def _check_resume(
        self,
        head: RunHead,
        old_shape: list[Any] | None,
        found: tuple[RunHead, Replay] | None = None,
    ) -> Literal["fresh"] | None:
        """Decide, inside the claim transaction, whether ``head`` may be resumed by this
        plan: None (resume), ``"fresh"`` (start over: ``on_plan_change="restart"``), or
        raise StaleCheckpointError (nothing is written)."""
        compiled = self._compiled
        nxt = head.next_step
        stored = head.meta.get("fingerprint")
        changed = stored is not None and stored != compiled.fingerprint
        rejoin = head.meta.get("rejoin")
        bad_next = nxt is not None and (
            nxt not in compiled.unit_of or compiled.band_of(nxt).entry != nxt
        )
        bad_rejoin = rejoin is not None and rejoin not in compiled.unit_of
        missing = head.status != "done" and (bad_next or bad_rejoin)
        if stored == compiled.fingerprint and not missing:
            self._check_stopped_at(head)
            if found is not None and found[0].version == head.version:
                self._check_units(head.key, found[1])
        if not changed and not missing:
            return None
        if missing and stored == compiled.fingerprint:  # the same plan: a damaged head
            raise corrupt_checkpoint(
                head.key,
                f"it was written by this very Plan but continues at step "
                f"{nxt if bad_next else rejoin!r}, which the Plan does not have as a step or "
                "band start",
            )
        if self.on_plan_change == "restart":
            log.info("stepstone: plan changed since checkpoint %r; starting over", head.key)
            return "fresh"
        if changed and self.on_plan_change == "fail":
            raise StaleCheckpointError(self._describe_change(head, old_shape))
        if missing:
            at = f"stopped at step {nxt!r} ({head.status})"
            if bad_rejoin:
                at += f" to continue at step {rejoin!r} after it"
            raise StaleCheckpointError(
                f"checkpoint {head.key!r} {at}, which this "
                f"Plan no longer has as a step or band start (steps: "
                f"{', '.join(compiled.step_of)}): it cannot continue by step name. Nothing "
                f"was claimed or written. To start over, remove it with "
                f"store.delete({head.key!r}), use a new checkpoint_key, or pass "
                "Plan(on_plan_change='restart')"
            )
        return None  # on_plan_change="continue": resume by step name, as asked

    def _check_stopped_at(self, head: RunHead) -> None:
        """A failed or paused run of this very plan records the step that stopped it: that
        step must be the one it continues at (or a branch of that band). A byte flipped in
        ``next_step`` to another step's name would otherwise skip or repeat steps."""
        error, nxt = head.meta.get("error"), head.next_step
        if head.status not in ("failed", "paused") or not isinstance(error, dict) or nxt is None:
            return
        steps = [s.step_name for s in self._compiled.band_of(nxt).steps]
        if error.get("step") not in steps:
            raise corrupt_checkpoint(
                head.key,
                f"it {head.status} at step {error.get('step')!r} but continues at step {nxt!r}",
            )

    def _check_units(self, key: str, rep: Replay) -> None:
        """The journal of a run of this very plan names its steps and bands as the plan has
        them: a step of a band journaled on its own, or a branch filed under a band (or a
        name) the plan does not have, would make a resume run that step again."""
        compiled = self._compiled
        if rep.shape is None:  # written before the journal named its steps as it does now
            return

        def band(entry: str) -> Unit | None:
            unit = compiled.band_of(entry) if entry in compiled.unit_of else None
            return unit if unit is not None and unit.is_band and unit.entry == entry else None

        wrong = [n for n in rep.direct if n not in compiled.unit_of or band(n) is not None]
        wrong += [e for e in rep.bands if band(e) is None]
        for entry, branches in rep.pending.items():
            unit = band(entry)
            names = {s.step_name for s in unit.steps} if unit is not None else set()
            wrong += [f"{entry}/{n}" for n in branches if n not in names]
        if wrong:
            raise corrupt_checkpoint(
                key,
                f"it was written by this very Plan, but its journal files "
                f"{sorted(set(wrong))} where the Plan has no such step or band",
            )

    def _describe_change(self, head: RunHead, old: list[Any] | None) -> str:
        new = self._shape()
        parts: list[str] = []
        if isinstance(old, list) and all(isinstance(s, list) and s for s in old):
            old_by = {str(s[0]): s for s in old}
            new_by = {str(s[0]): s for s in new}
            added = [n for n in new_by if n not in old_by]
            removed = [n for n in old_by if n not in new_by]
            if added:
                parts.append(f"steps added: {', '.join(map(repr, added))}")
            if removed:
                parts.append(f"steps removed: {', '.join(map(repr, removed))}")
            kept_old = [n for n in old_by if n in new_by]
            kept_new = [n for n in new_by if n in old_by]
            if kept_old != kept_new:
                parts.append(
                    f"steps reordered (were {' -> '.join(kept_old)}, now {' -> '.join(kept_new)})"
                )
            redefined = [n for n in kept_new if list(old_by[n]) != list(new_by[n])]
            if redefined:
                parts.append(f"parallel=/writes= changed for: {', '.join(map(repr, redefined))}")
        if not parts:
            parts.append("its steps, their order, parallel= or writes= differ")
        if head.status == "done":
            state = (
                "finished (status 'done'): resuming would return the old plan's results as "
                "this plan's, without running anything"
            )
        else:
            state = (
                f"stopped at step {head.next_step!r} ({head.status}): resuming would feed the "
                "old plan's outputs into this one"
            )
        key = head.key
        return (
            f"checkpoint {key!r} was written by a different plan ({'; '.join(parts)}). It "
            f"{state}. Nothing was claimed or written. To start over, remove it with "
            f"store.delete({key!r}), use a new checkpoint_key, or pass "
            "Plan(on_plan_change='restart'); to resume by step name anyway, pass "
            "Plan(on_plan_change='continue')"
        )

    async def arun_many(
        self,
        tasks: list[str | Envelope[Any]],
        *,
        concurrency: int | None = None,
        tools: list[Any] | None = None,
        memory: Any = None,
        session: Session | None = None,
        output_type: type = str,
    ) -> list[Envelope[Any]]:
        """Run the plan on every task concurrently; envelopes in input order, never raises.

        ``str`` tasks are wrapped with ``Envelope.from_task``. ``concurrency`` caps how many
        run at once (None: all). Failures, including ``ConcurrentPlanRunError``, become
        error envelopes in their slot. Pair with ``on_concurrent="fork"`` for fan-out.
        """
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigurationError(
                f"concurrency must be an int >= 1 or None, got {concurrency!r}"
            )
        if isinstance(tasks, str | Envelope) or not isinstance(tasks, Iterable):
            raise ConfigurationTypeError(
                f"run_many takes a list of tasks (str or Envelope), got {tasks!r:.200}; "
                "one task is run_many([task])"
            )
        sem = asyncio.Semaphore(concurrency) if concurrency else None

        async def one(task: str | Envelope[Any]) -> Envelope[Any]:
            env = task if isinstance(task, Envelope) else Envelope.from_task(str(task))
            if sem is None:
                return await self.run(env, tools=tools, output_type=output_type, session=session)
            async with sem:
                return await self.run(env, tools=tools, output_type=output_type, session=session)

        raw = await asyncio.gather(*(one(t) for t in tasks), return_exceptions=True)
        return [r if isinstance(r, Envelope) else Envelope.error_envelope(r) for r in raw]

    def run_many(
        self,
        tasks: list[str | Envelope[Any]],
        *,
        concurrency: int | None = None,
        tools: list[Any] | None = None,
        memory: Any = None,
        session: Session | None = None,
        output_type: type = str,
    ) -> list[Envelope[Any]]:
        """Synchronous :meth:`arun_many`."""
        return run_sync(
            self.arun_many(
                tasks,
                concurrency=concurrency,
                tools=tools,
                memory=memory,
                session=session,
                output_type=output_type,
            ),
            sync_name="Plan.run_many(...)",
            async_name="plan.arun_many(...)",
        )

    def submit(
        self,
        task: str | Envelope[Any],
        *,
        store: Store | None = None,
        target: str | None = None,
        key: str | None = None,
        queue: str = "default",
        priority: int = 0,
        delay: float = 0.0,
        not_before: float | datetime | None = None,
        dedupe_key: str | None = None,
        max_attempts: int = 3,
    ) -> RunHandle:
        """Queue a run of this plan for a :class:`~stepstone.Worker` instead of running it
        here; returns a :class:`~stepstone.RunHandle` (``status()``, ``result()``,
        ``cancel()``).

        The worker imports the plan by its module-level name (or ``target=
        "package.module:name"``) and runs it durably in ``store`` (default: this plan's)
        under checkpoint key ``key`` (default: one per run), resuming it where it stopped
        if a worker dies. See :func:`stepstone.submit` for the other arguments.
        """
        from stepstone.durable._queue import submit

        where = store if store is not None else self.store
        if where is None:
            raise PlanCompileError(
                "Plan.submit() needs a store the workers share: pass store=Store(url=...) "
                "or build the Plan with store="
            )
        return submit(
            where,
            target if target is not None else self,
            task,
            key=key,
            queue=queue,
            priority=priority,
            delay=delay,
            not_before=not_before,
            dedupe_key=dedupe_key,
            max_attempts=max_attempts,
        )

    def prune_forks(self, *, statuses: tuple[str, ...] = ("done",)) -> int:
        """Delete this plan's fork checkpoints in ``statuses`` (and their ``writes=`` keys).

        Fork runs keep their checkpoint so results stay inspectable; call this to clean up.
        Live runs are never touched. Returns how many runs were removed.
        """
        if self.store is None or self.checkpoint_key is None or self.on_concurrent != "fork":
            raise PlanCompileError(
                "prune_forks() needs a Plan with store=, checkpoint_key= and on_concurrent='fork'"
            )
        removed = 0
        now = database_now(self.store)
        for head in list_runs(self.store, f"{self.checkpoint_key}:"):
            if head.key != f"{self.checkpoint_key}:{head.run_uid}":
                continue  # a run of its own under a longer key, not one of this plan's forks
            if head.status in statuses and not owner_alive(head, now=now):
                for k in self.store.keys(prefix=f"{head.key}:"):
                    self.store.delete(k)
                delete_run(self.store, head.key)
                removed += 1
        return removed

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan's topology as JSON-ready data (``"version": 1``).

        Callables, Agents, route predicates and sources are saved by name: rebind them with
        :meth:`from_dict`'s ``registry``. Sentinels, writes, parallel flags, routing,
        types, order and ``max_iterations`` are kept. Store, key and resume are not: pass
        them to ``from_dict``.
        """
        return steps_to_dict(self.steps, self.max_iterations)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        registry: Mapping[str, Any] | None = None,
        **plan_options: Any,
    ) -> Plan:
        """Rebuild a plan from :meth:`to_dict` output.

        Args:
            data: The dict.
            registry: Maps saved names back to callables, Agents, predicates, sources and
                types. A missing entry for a non-tool target raises ``KeyError`` naming it.
            **plan_options: ``store=``, ``checkpoint_key=``, ``resume=`` ... for the new Plan.

        Example::

            plan = Plan.from_dict(saved, registry={"researcher": researcher, "fetch": fetch})
        """
        steps, max_iterations = steps_from_dict(data, registry)
        return cls(*steps, max_iterations=max_iterations, **plan_options)


def _read_checkpoint(store: Store, key: str) -> tuple[RunHead, Replay] | None:
    """The Plan run under ``key`` with its decoded, validated journal (None when there is
    none). Raises CheckpointCorruptError naming the key for any byte that cannot be
    decoded; nothing is written."""
    found = read_run(store, key)
    if found is None or found[0].kind != "plan":
        return None
    head, rows = found
    check_head(head)
    check_journal(head, rows)
    rep = replay(key, rows)
    rep.check(key)
    return head, rep


def _check_options(
    store: Store | None,
    checkpoint_key: str | None,
    resume: bool,
    on_concurrent: str,
    on_plan_change: str,
) -> None:
    """Raise PlanCompileError for Plan() options that contradict each other or are invalid."""
    if on_plan_change not in _POLICIES:
        raise PlanCompileError(
            f"Plan(on_plan_change={on_plan_change!r}): must be 'fail' (default: a changed "
            "plan refuses to resume), 'restart' (start over under the same key) or "
            "'continue' (resume by step name)"
        )
    if on_concurrent not in ("fail", "fork"):
        raise PlanCompileError(
            f"Plan(on_concurrent={on_concurrent!r}): must be 'fail' (default: raise on a "
            "collision) or 'fork' (isolate each run under a suffixed key)"
        )
    if on_concurrent == "fork" and resume:
        raise PlanCompileError(
            "Plan(on_concurrent='fork', resume=True) is not supported: 'fork' gives each "
            "run its own key, so there is no shared checkpoint to resume. Use "
            "on_concurrent='fail' with a unique checkpoint_key per run to resume"
        )
    if (store is None) != (checkpoint_key is None):
        missing = "checkpoint_key=" if store is not None else "store="
        raise PlanCompileError(
            f"checkpointing needs both store= and checkpoint_key=; {missing} is missing"
        )
    _check_checkpoint_key(checkpoint_key)
    if store is not None and not isinstance(store, Store):
        raise PlanCompileError(f"store= must be a stepstone Store, got {store!r}")
    if resume and store is None:
        raise PlanCompileError("resume=True needs store= and checkpoint_key=")


def _check_checkpoint_key(checkpoint_key: str | None) -> None:
    if checkpoint_key is None:
        return
    if not isinstance(checkpoint_key, str) or not checkpoint_key:
        raise PlanCompileError(f"checkpoint_key must be a non-empty str, got {checkpoint_key!r}")
    problem = key_problem(checkpoint_key, new=True)
    if problem is not None:
        raise PlanCompileError(f"checkpoint_key {shown_key(checkpoint_key)} {problem}")


def _in_workflow(ctx: RunContext) -> RunContext:
    """In a workflow's body, a plan without a store is a child run of the workflow, under a
    key of its position there: a replay of the workflow finds it again."""
    journal = current_journal()
    if journal is None:
        return ctx
    child = RunLocation(store=journal.store, key=journal.child_key("plan", "plan"))
    return dataclasses.replace(ctx, location=child)
