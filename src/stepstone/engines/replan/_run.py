"""One execution of a ReplanEngine run: ask the planner, run its tasks, commit each."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from stepstone.core import Envelope, Tool
from stepstone.core._serialization import to_typed_json
from stepstone.durable import OwnedRun
from stepstone.durable._effects import DurableScope, bind_scope, current_scope
from stepstone.engines.replan._prompt import planner_kwargs, planner_prompt
from stepstone.engines.replan._record import (
    RECORD_VERSION,
    Replay,
    Round,
    Row,
    task_row,
)
from stepstone.engines.replan._schema import PlanRound, Task
from stepstone.exceptions import (
    ConcurrentRunError,
    MaxRoundsExceeded,
    PlannerOutputError,
    PlanPaused,
)
from stepstone.observability import EventType, Session

__all__ = ["ReplanRun"]

log = logging.getLogger("stepstone")

_TERMINAL = ("done", "failed", "paused")


class _Stop(Exception):
    """Internal: the run stops at ``where`` with ``status`` (failed or paused)."""

    def __init__(self, status: str, where: dict[str, Any], env: Envelope[Any]) -> None:
        super().__init__(status)
        self.status, self.where, self.env = status, where, env


@dataclasses.dataclass
class ReplanRun:
    """The in-memory state of one run; :meth:`execute` drives it to a terminal status.

    Build one with :meth:`fresh` (from round 1) or :meth:`resumed` (rebuilt from its
    journal)."""

    task: str
    tools: Mapping[str, Tool]
    planner_name: str
    max_rounds: int
    rounds: list[Round] = dataclasses.field(default_factory=list)
    run: OwnedRun | None = None
    session: Session | None = None
    started: bool = False  # the ``start`` row is journaled
    _lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    @classmethod
    def fresh(
        cls,
        *,
        task: str,
        tools: Mapping[str, Tool],
        planner_name: str,
        max_rounds: int,
        session: Session | None,
        run: OwnedRun | None = None,
    ) -> ReplanRun:
        """A run from round 1; ``run`` is None without a store."""
        return cls(
            task=task,
            tools=tools,
            planner_name=planner_name,
            max_rounds=max_rounds,
            run=run,
            session=session,
        )

    @classmethod
    def resumed(
        cls,
        *,
        task: str,
        tools: Mapping[str, Tool],
        planner_name: str,
        max_rounds: int,
        session: Session | None,
        run: OwnedRun,
        replay: Replay,
    ) -> ReplanRun:
        """A run taken over where it stopped: its rounds (planner answers and task
        outcomes) from its journal, and the task it started with (``task``, given now, is
        used only when the journal has none)."""
        if replay.task is not None and replay.task != task:
            log.warning(
                "stepstone: resuming replan run %r with its own task %r, not the task given "
                "now (%r)",
                run.key,
                replay.task[:80],
                task[:80],
            )
        return cls(
            task=replay.task if replay.task is not None else task,
            tools=tools,
            planner_name=planner_name,
            max_rounds=max_rounds,
            rounds=replay.rounds,
            run=run,
            session=session,
            started=replay.task is not None,
        )

    @property
    def workers(self) -> list[Tool]:
        """The tools the planner can dispatch (every tool but itself)."""
        return [t for name, t in self.tools.items() if name != self.planner_name]

    def _emit(self, kind: EventType, **payload: Any) -> None:
        if self.session is not None:
            run_id = self.run.run_uid if self.run is not None else None
            self.session.emit(kind, payload, run_id=run_id)

    # -- commits -------------------------------------------------------------------------
    def _meta(self, error: dict[str, Any] | None) -> dict[str, Any]:
        return {"checkpoint_version": RECORD_VERSION, "planner": self.planner_name, "error": error}

    async def _commit(
        self,
        status: str,
        rows: list[Row],
        *,
        error: dict[str, Any] | None = None,
        started: float | None = None,
    ) -> None:
        if self.run is None:
            return
        number = len(self.rounds)
        nxt = None if status == "done" else f"round {self._next_round()}"
        if not self.started:
            rows = [("start", None, {"task": self.task}), *rows]
        async with self._lock:
            await self.run.commit(
                status=status,
                next_step=nxt,
                iteration=number,
                meta=self._meta(error),
                rows=rows,
                started=started,
            )
        self.started = True
        self._emit(EventType.CHECKPOINT, key=self.run.key, status=status, round=number)

    def _scope(self, where: str) -> contextlib.AbstractContextManager[None]:
        """Bind the durable scope an LLM loop of the planner or a task journals in: a key
        of its position in this run (``round2:task0``), the same on every resume. A
        resume replays the planner answers this run journaled, so a counter of the loops
        started (what an enclosing scope gives) would hand a task the planner's key.
        Without a store of its own the run keeps the enclosing scope, if any."""
        if self.run is None:
            return contextlib.nullcontext()
        outer = current_scope()
        return bind_scope(
            DurableScope(
                store=self.run.store,
                key=self.run.derived_key(where),
                approvals=outer.approvals if outer is not None else {},
            )
        )

    def _next_round(self) -> int:
        """The round a resumed run continues: the last one if it has tasks left to run."""
        if self.rounds and not self.rounds[-1].complete:
            return self.rounds[-1].number
        return len(self.rounds) + 1

    def _stamp(self, env: Envelope[Any]) -> Envelope[Any]:
        env.metadata.setdefault("rounds", len(self.rounds))
        if self.run is not None:
            env.metadata.setdefault("checkpoint_key", self.run.key)
            env.metadata.setdefault("run_uid", self.run.run_uid)
        return env

    # -- the loop ------------------------------------------------------------------------
    async def execute(self) -> Envelope[Any]:
        """Run to a terminal status (done, failed, paused); returns the final envelope."""
        try:
            return await self._loop()
        except _Stop as stop:
            await self._commit(stop.status, [], error=stop.where)
            return self._stamp(stop.env)
        except ConcurrentRunError:
            raise  # we lost ownership: nothing of ours may be written
        except BaseException as exc:
            self._record_crash(exc)
            raise
        finally:
            if self.run is not None:
                self.run.release()

    def _record_crash(self, exc: BaseException) -> None:
        """A crash that reaches Python (KeyboardInterrupt, cancellation, a bug) leaves the
        run ``failed`` where it was, so ``resume=True`` continues from there (a SIGKILL
        never gets here: then the lease tells other processes the owner is dead)."""
        run = self.run
        if run is None or run.head.status in _TERMINAL:
            return
        error = {"round": self._next_round(), "type": type(exc).__name__, "message": str(exc)}
        try:
            run.commit_sync(
                status="failed",
                next_step=f"round {self._next_round()}",
                iteration=len(self.rounds),
                meta=self._meta(error),
            )
        except Exception:  # noqa: BLE001 - the original exception matters more
            pass

    async def _loop(self) -> Envelope[Any]:
        while True:
            current = self.rounds[-1] if self.rounds else None
            if current is not None and current.plan.done:
                env = Envelope(task=self.task, payload=current.plan.final_answer)
                env.metadata["status"] = "done"
                return self._stamp(env)
            if current is None or current.complete:
                current = await self._plan_round(len(self.rounds) + 1)
                if current.plan.done:
                    continue
            await self._run_round(current)

    # -- the planner ---------------------------------------------------------------------
    async def _plan_round(self, number: int) -> Round:
        if number > self.max_rounds:
            exc = MaxRoundsExceeded(
                f"ReplanEngine hit max_rounds={self.max_rounds}: planner "
                f"{self.planner_name!r} did not answer done=True in {self.max_rounds} rounds. "
                "Raise ReplanEngine(max_rounds=...) (with resume=True a checkpointed run "
                "continues from its last round) or make the planner finish sooner"
            )
            where = {"round": number, "step": "planner", **_error(exc)}
            raise _Stop("failed", where, Envelope.error_envelope(exc, task=self.task))
        self._emit(EventType.STEP_START, step=self.planner_name, round=number)
        plan = await self._ask_planner(number)
        new = Round(number, plan)
        self.rounds.append(new)
        await self._commit("done" if plan.done else "running", [new.row()])
        self._emit(EventType.STEP_FINISH, step=self.planner_name, round=number)
        return new

    async def _ask_planner(self, number: int) -> PlanRound:
        planner = self.tools[self.planner_name]
        workers = self.workers
        where = {"round": number, "step": "planner"}
        try:
            if planner.agent is not None:
                prompt = planner_prompt(
                    self.task, workers, self.rounds, number=number, max_rounds=self.max_rounds
                )
                with self._scope(f"round{number}:planner"):
                    env = await planner.agent.run(
                        Envelope(task=prompt, payload=prompt, metadata={"round": number})
                    )
                if not env.ok:
                    assert env.error is not None
                    err = {**where, **env.error.to_dict()}
                    raise _Stop("failed", err, _with_meta(env, where))
                answer: Any = env.payload
            else:
                args = planner_kwargs(
                    planner,
                    task=self.task,
                    tools=workers,
                    rounds=self.rounds,
                    number=number,
                    max_rounds=self.max_rounds,
                )
                with self._scope(f"round{number}:planner"):
                    answer = await planner.invoke(args)
        except PlanPaused as exc:
            env = Envelope.error_envelope(exc, retryable=True, task=self.task, metadata=where)
            self._emit(EventType.PLAN_PAUSED, step="planner", round=number, message=exc.message)
            raise _Stop("paused", {**where, **_error(exc)}, env) from None
        except (_Stop, ConcurrentRunError):
            raise
        except Exception as exc:  # noqa: BLE001 - a failing planner ends the run, resumable
            env = Envelope.error_envelope(exc, task=self.task, metadata=where)
            raise _Stop("failed", {**where, **_error(exc)}, env) from None
        if isinstance(answer, Envelope) and answer.ok:
            answer = answer.payload
        if not isinstance(answer, PlanRound):
            shown = repr(answer)
            shown = shown if len(shown) <= 200 else shown[:199] + "…"
            exc2 = PlannerOutputError(
                f"planner {self.planner_name!r} returned {type(answer).__name__} {shown} in "
                f"round {number}, not a PlanRound. Build an agent planner with "
                "Agent(..., output=PlanRound), or return PlanRound(...) from a function planner"
            )
            env = Envelope.error_envelope(exc2, task=self.task, metadata=where)
            raise _Stop("failed", {**where, **_error(exc2)}, env)
        return answer

    # -- tasks ---------------------------------------------------------------------------
    async def _run_round(self, current: Round) -> None:
        """Run the round's tasks that have no outcome yet: parallel ones together, then the
        sequential ones in order. Each outcome is committed as soon as it exists."""
        todo = [(i, t) for i, t in enumerate(current.plan.tasks) if i not in current.outcomes]
        stops: list[tuple[int, _Stop]] = []

        async def one(index: int, task: Task) -> None:
            # parallel tasks run together: each row says when its own task started
            began = self.run.clock() if self.run is not None else None
            try:
                outcome = await self._dispatch(current.number, index, task)
            except _Stop as stop:
                stops.append((index, stop))
                return
            current.outcomes[index] = outcome
            row = task_row(current.number, index, task.tool, outcome)
            await self._commit("running", [row], started=began)
            self._emit(EventType.STEP_FINISH, step=task.tool, round=current.number, index=index)

        # Let every sibling finish (and commit) before anything propagates: a lost lease
        # or a crash in one task must not leave the others running unobserved.
        outcomes = await asyncio.gather(
            *(one(i, t) for i, t in todo if t.parallel), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        if not stops:
            for i, t in todo:
                if not t.parallel:
                    await one(i, t)
                    if stops:
                        break
        if stops:
            stops.sort(key=lambda s: (s[1].status != "failed", s[0]))
            raise stops[0][1]

    async def _dispatch(self, number: int, index: int, task: Task) -> dict[str, Any]:
        """Run one task; its outcome (``result`` or planner-visible ``error``) as journal
        data. A tool that raises, pauses or returns an error envelope stops the run
        (``_Stop``), resumable here."""
        where = {"round": number, "task": index, "tool": task.tool}
        self._emit(EventType.STEP_START, step=task.tool, round=number, index=index)
        tool = self.tools.get(task.tool)
        if tool is None or task.tool == self.planner_name:
            names = ", ".join(t.name for t in self.workers) or "none"
            why = "is the planner itself" if tool is not None else "is not a tool of this agent"
            return {
                "error": {
                    "type": "UnknownTool",
                    "message": f"tool {task.tool!r} {why}; the tools are: {names}",
                }
            }
        try:
            args = _validate(tool, task.kwargs)
        except Exception as exc:  # noqa: BLE001 - bad kwargs are the planner's to fix
            return {"error": {"type": "InvalidArguments", "message": f"{task.tool}: {exc}"}}
        try:
            with self._scope(f"round{number}:task{index}"):
                result = await tool.invoke(args)
        except PlanPaused as exc:
            env = Envelope.error_envelope(exc, retryable=True, task=self.task, metadata=where)
            self._emit(EventType.PLAN_PAUSED, step=task.tool, round=number, message=exc.message)
            raise _Stop("paused", {**where, **_error(exc)}, env) from None
        except ConcurrentRunError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing task fails the run, resumable
            env = Envelope.error_envelope(exc, task=self.task, metadata=where)
            self._emit(EventType.STEP_ERROR, step=task.tool, round=number, error=_error(exc))
            raise _Stop("failed", {**where, **_error(exc)}, env) from None
        if isinstance(result, Envelope) and result.error is not None:
            # An error envelope is the task's error, as a Plan step returning one fails.
            error = {**where, **result.error.to_dict()}
            env = Envelope(task=self.task, payload=None, metadata=dict(where), error=result.error)
            self._emit(
                EventType.STEP_ERROR, step=task.tool, round=number, error=result.error.to_dict()
            )
            raise _Stop("failed", error, env)
        value = to_typed_json(result, where=f"round {number} task {index} ({task.tool}) result")
        return {"result": value}


def _validate(tool: Tool, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check ``kwargs`` against the tool's schema; names it does not take are errors too
    (verbatim kwargs must not be dropped silently)."""
    props = tool.parameters.get("properties")
    if isinstance(props, dict) and not _takes_var_kwargs(tool):
        unknown = sorted(k for k in kwargs if k not in props)
        if unknown:
            raise TypeError(
                f"unexpected argument(s) {unknown}; the parameters are {sorted(props) or 'none'}"
            )
    try:
        args = tool.validate_args(dict(kwargs))
    except ValidationError as exc:  # one line per field, without pydantic's doc links
        raise TypeError(
            "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ())) or '(root)'}: {e.get('msg')}"
                for e in exc.errors()
            )
        ) from None
    return args


def _takes_var_kwargs(tool: Tool) -> bool:
    import inspect

    if tool.fn is None:
        return False
    try:
        sig = inspect.signature(tool.fn)
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def _error(exc: BaseException) -> dict[str, Any]:
    message = getattr(exc, "message", None)
    return {
        "type": type(exc).__name__,
        "message": message if isinstance(message, str) else str(exc),
    }


def _with_meta(env: Envelope[Any], where: dict[str, Any]) -> Envelope[Any]:
    for k, v in where.items():
        env.metadata.setdefault(k, v)
    return env
