"""ReplanEngine: a planner decides each round's tool calls; durable mid-round."""

from __future__ import annotations

import inspect
from typing import Any

from stepstone.core import Envelope, RunContext, RunLocation, Tool, build_tool_map
from stepstone.core._run_context import resolve_run_context
from stepstone.durable import aclaim_run, aread_run
from stepstone.engines.replan._prompt import PLANNER_ARGS
from stepstone.engines.replan._record import RECORD_VERSION, checked_replay, replay
from stepstone.engines.replan._run import ReplanRun
from stepstone.exceptions import PlanCompileError
from stepstone.observability import Session
from stepstone.store import Store

__all__ = ["ReplanEngine"]

KIND = "replan"


class ReplanEngine:
    """An adaptive engine: a planner tool decides, round after round, which tools to run.

    Each round the engine asks the planner (the tool named ``planner_name``: an Agent
    built with ``output=PlanRound``, or a function returning a :class:`PlanRound`), giving
    it the original task, every other tool's name and JSON schema, and the history of
    earlier rounds (each task's tool, kwargs and result or error). It then runs the
    round's tasks: ``parallel=True`` ones concurrently, then ``parallel=False`` ones in
    order. ``done=True`` ends the run with ``final_answer`` as the payload.

    A task naming an unknown tool, or with kwargs its schema refuses, becomes an error in
    the history (the planner can re-plan). A task whose tool raises fails the run; one
    that raises ``PlanPaused`` pauses it; both resume at that task.

    With ``store=`` and ``checkpoint_key=`` the run is durable: the planner's answer for a
    round and each task's outcome are committed as they happen, so a crash in the middle
    of a round resumes that round without running finished tasks again or asking the
    planner again. ``store.read(checkpoint_key)`` shows the run's record.

    Args:
        planner_name: The name of the planner in the Agent's tools.
        store: Where the run's record lives (needs ``checkpoint_key`` too).
        checkpoint_key: The run's identity in the store (or per call:
            ``agent.run(task, location=RunLocation(store=, key=))``).
        resume: Continue a failed, paused or crashed run where it stopped (and return the
            final answer of a done one). ``False`` starts fresh.
        max_rounds: How many planner rounds a run may take; reaching it is an error
            envelope (``MaxRoundsExceeded``), never a silent success.

    Example::

        planner = Agent(engine=LLMEngine(model), name="planner", output=PlanRound)
        agent = Agent(
            engine=ReplanEngine(store=Store(db="runs.sqlite"), checkpoint_key="report-7",
                                resume=True),
            tools=[planner, researcher, coder],
        )
        agent("write the migration report").payload
    """

    def __init__(
        self,
        *,
        planner_name: str = "planner",
        store: Store | None = None,
        checkpoint_key: str | None = None,
        resume: bool = False,
        max_rounds: int = 20,
    ) -> None:
        if not isinstance(planner_name, str) or not planner_name:
            raise PlanCompileError(
                f"ReplanEngine(planner_name={planner_name!r}): must be the non-empty name of "
                "the planner tool"
            )
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise PlanCompileError(f"ReplanEngine(max_rounds={max_rounds!r}): must be an int >= 1")
        if (store is None) != (checkpoint_key is None):
            missing = "checkpoint_key=" if store is not None else "store="
            raise PlanCompileError(
                f"ReplanEngine checkpointing needs both store= and checkpoint_key=; "
                f"{missing} is missing"
            )
        if checkpoint_key is not None and (
            not isinstance(checkpoint_key, str) or not checkpoint_key
        ):
            raise PlanCompileError(
                f"ReplanEngine(checkpoint_key={checkpoint_key!r}): must be a non-empty str"
            )
        if store is not None and not isinstance(store, Store):
            raise PlanCompileError(
                f"ReplanEngine(store=...) must be a stepstone Store, got {store!r}"
            )
        if resume and store is None:
            raise PlanCompileError("ReplanEngine(resume=True) needs store= and checkpoint_key=")
        self.planner_name = planner_name
        self.store = store
        self.checkpoint_key = checkpoint_key
        self.resume = resume
        self.max_rounds = max_rounds

    def __repr__(self) -> str:
        return (
            f"ReplanEngine(planner_name={self.planner_name!r}, "
            f"checkpoint_key={self.checkpoint_key!r}, max_rounds={self.max_rounds})"
        )

    def compile(self, tools: list[Tool], *, output_type: type = str) -> None:
        """Check the Agent's tools (called at Agent construction): the planner must be one
        of them, and a function planner may only require arguments the engine passes."""
        self._planner(build_tool_map(tools))

    def _planner(self, tool_map: dict[str, Tool]) -> Tool:
        planner = tool_map.get(self.planner_name)
        if planner is None:
            raise PlanCompileError(
                f"ReplanEngine: no tool named {self.planner_name!r} to be the planner (tools: "
                f"{', '.join(tool_map) or 'none'}). Add the planner to Agent(tools=[...]) or "
                "pass ReplanEngine(planner_name=...)"
            )
        if planner.fn is not None:
            required = _required_params(planner)
            extra = [p for p in required if p not in PLANNER_ARGS]
            if extra:
                raise PlanCompileError(
                    f"ReplanEngine: planner {self.planner_name!r} requires argument(s) "
                    f"{extra} the engine cannot give; a function planner may take "
                    f"{', '.join(PLANNER_ARGS)}"
                )
        return planner

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
        """Run the replan loop on ``env``'s task; the Engine protocol entry point.

        ``ctx`` is the :class:`~stepstone.RunContext` an Agent gives (or pass ``tools=``,
        ``session=``... as keywords instead). With ``ctx.location``, the run is recorded
        under that key in that store (resumed where it stopped, a done one giving its
        final answer) instead of under this engine's ``checkpoint_key``.

        Failures, pauses and ``max_rounds`` come back as error envelopes; a live
        concurrent owner of the checkpoint key raises ``ConcurrentRunError``.
        """
        ctx = resolve_run_context("ReplanEngine.run", ctx, tools, output_type, memory, session)
        tool_map = build_tool_map(ctx.tools)
        self._planner(tool_map)
        task = env.task if env.task is not None else env.text()
        settings: dict[str, Any] = dict(
            tools=tool_map,
            planner_name=self.planner_name,
            max_rounds=self.max_rounds,
            session=ctx.session,
        )
        store, key, resume = self._where(ctx.location)
        if store is None or key is None:
            return await ReplanRun.fresh(task=task, **settings).execute()
        if resume:  # the whole record is checked before anything is claimed
            found = await aread_run(store, key)
            if found is not None and found[0].kind == KIND:
                checked_replay(*found)
        claim = await aclaim_run(
            store,
            key,
            kind=KIND,
            resume=resume,
            first_step="round 1",
            meta={"checkpoint_version": RECORD_VERSION, "planner": self.planner_name},
            what="ReplanEngine",
        )
        if claim.run is None:  # resume=True on a done run: the cached final answer
            found = await aread_run(store, key)
            rep = replay(key, found[1] if found is not None else [])
            return Envelope(
                task=rep.task if rep.task is not None else task,
                payload=rep.final_answer,
                metadata={
                    "checkpoint_key": key,
                    "run_uid": claim.head.run_uid,
                    "status": "done",
                    "rounds": len(rep.rounds),
                    "cached": True,
                },
            )
        if claim.outcome != "resumed":
            return await ReplanRun.fresh(task=task, **settings, run=claim.run).execute()
        try:
            rep = replay(key, await claim.run.ajournal())
            runner = ReplanRun.resumed(task=task, **settings, run=claim.run, replay=rep)
        except BaseException:
            claim.run.release()  # a corrupt journal: leave the key to a later resume
            raise
        return await runner.execute()

    def _where(self, location: RunLocation | None) -> tuple[Store | None, str | None, bool]:
        """Where this run is recorded and whether it resumes: the caller's location (always
        resumed: the caller gives a key so that a retry continues), else this engine's."""
        if location is None:
            return self.store, self.checkpoint_key, self.resume
        if not isinstance(location.store, Store):
            raise PlanCompileError(
                f"ReplanEngine.run: RunLocation(store={location.store!r}) must be a stepstone Store"
            )
        return location.store, location.key, True


def _required_params(tool: Tool) -> list[str]:
    assert tool.fn is not None
    try:
        sig = inspect.signature(tool.fn)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
