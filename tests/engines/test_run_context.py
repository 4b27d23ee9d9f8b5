"""The run context: what an Agent gives its engine on every call, the keyword interface kept
for engines written to it, and run locations chosen by the caller (a worker's queue key)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import (
    Agent,
    Engine,
    Envelope,
    EventType,
    KeywordEngine,
    LLMEngine,
    Plan,
    PlanPaused,
    PlanRound,
    ReplanEngine,
    ReplanTask,
    RunContext,
    RunLocation,
    Runner,
    Session,
    Step,
    Store,
    submit,
)
from stepstone._worker_targets import queued_plan
from stepstone.core._run_context import takes_run_context
from stepstone.exceptions import PlanCompileError, StaleCheckpointError, UserError
from stepstone.graph import END, GraphBuilder, State
from stepstone.testing import FakeModel, call


class Verdict(BaseModel):
    ok: bool


def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


class Recorder:
    """An engine of the context interface: remembers every context it was given."""

    def __init__(self) -> None:
        self.seen: list[RunContext] = []

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        self.seen.append(ctx)
        return Envelope(task=env.task, payload=f"{ctx.agent_name}: {env.task}")

    async def stream(self, env: Envelope[Any], ctx: RunContext) -> AsyncIterator[str]:
        self.seen.append(ctx)
        for word in (ctx.agent_name, "streams"):
            yield word


class KeywordRecorder:
    """An engine written to the keyword interface (the one documented before the context)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def run(
        self,
        env: Envelope[Any],
        *,
        tools: list[Any],
        output_type: type,
        memory: Any,
        session: Session | None,
    ) -> Envelope[Any]:
        self.calls.append(
            {"tools": tools, "output_type": output_type, "memory": memory, "session": session}
        )
        return Envelope(task=env.task, payload=f"kw: {env.task}")

    async def stream(
        self,
        env: Envelope[Any],
        *,
        tools: list[Any],
        output_type: type,
        memory: Any,
        session: Session | None,
    ) -> AsyncIterator[str]:
        self.calls.append({"tools": tools, "stream": True})
        yield "kw"


class Forwarding:
    """A keyword engine that forwards whatever it gets to a built-in engine."""

    def __init__(self, inner: LLMEngine) -> None:
        self.inner = inner

    async def run(self, env: Envelope[Any], **kwargs: Any) -> Envelope[Any]:
        return await self.inner.run(env, **kwargs)


async def test_an_engine_gets_one_frozen_context_per_call() -> None:
    # guarantee 300
    engine = Recorder()
    session, other = Session(), Session()
    agent = Agent(engine=engine, name="crier", tools=[shout], output=Verdict, session=session)
    env = await agent.run("hello")
    assert env.payload == "crier: hello"
    (ctx,) = engine.seen
    assert ctx.agent_name == "crier"
    assert [t.name for t in ctx.tools] == ["shout"] and isinstance(ctx.tools, tuple)
    assert ctx.output_type is Verdict and ctx.session is session
    assert ctx.memory is None and ctx.location is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.agent_name = "someone else"  # type: ignore[misc]
    # per-call overrides reach the engine through the context, the agent keeps its own
    await agent.run("again", output=str, session=other)
    assert (engine.seen[1].output_type, engine.seen[1].session) == (str, other)
    assert agent.output is Verdict and agent.session is session
    # streaming gets the same context
    assert [t async for t in agent.stream("s")] == ["crier", "streams"]
    assert engine.seen[2].agent_name == "crier" and engine.seen[2].output_type is Verdict
    assert agent.run_context().replace(agent_name="x").agent_name == "x"


async def test_an_engine_written_to_the_keyword_interface_keeps_working() -> None:
    # guarantee 301
    engine = KeywordRecorder()
    assert isinstance(engine, KeywordEngine) and isinstance(Recorder(), Engine)
    session = Session()
    agent = Agent(engine=engine, tools=[shout], output=Verdict, session=session)
    assert (await agent.run("go")).payload == "kw: go"
    (got,) = engine.calls
    assert [t.name for t in got["tools"]] == ["shout"] and isinstance(got["tools"], list)
    assert (got["output_type"], got["memory"], got["session"]) == (Verdict, None, session)
    assert [t async for t in agent.stream("s")] == ["kw"]
    assert engine.calls[1]["stream"] is True
    # a keyword engine that forwards to a built-in one: the built-in takes the keywords too
    model = FakeModel(["forwarded"])
    fwd = Agent(engine=Forwarding(LLMEngine(model)), tools=[shout])
    assert (await fwd.run("q")).payload == "forwarded"
    assert [t.name for t in model.requests[0].tools] == ["shout"]


@pytest.mark.parametrize(
    ("source", "takes"),
    [
        ("async def run(self, env, ctx): ...", True),
        ("async def run(self, env, context, /): ...", True),
        ("async def run(self, env, *args): ...", True),
        ("async def run(self, env, ctx=None, *, tools=None): ...", True),
        ("async def run(self, env, *, tools, output_type, memory, session): ...", False),
        ("async def run(self, env, **kwargs): ...", False),
        ("async def run(self, env, tools, output_type, memory, session): ...", False),
        ("async def run(self, env): ...", False),
    ],
)
def test_the_agent_reads_the_run_signature_to_pick_the_interface(source: str, takes: bool) -> None:
    # guarantee 301
    namespace: dict[str, Any] = {}
    exec(f"class E:\n    {source}\n", namespace)
    assert takes_run_context(namespace["E"]().run) is takes


async def test_a_nested_agent_sees_its_own_name() -> None:
    # guarantee 302
    inner_engine = Recorder()
    inner = Agent(engine=inner_engine, name="inner")
    outer = Agent(engine=Plan(Step(inner)), name="outer")
    env = await outer.run("task")
    assert env.payload == "inner: task"
    assert [c.agent_name for c in inner_engine.seen] == ["inner"]
    # an agent used as a tool by an LLM agent: both loops report their own names
    session = Session()
    helper = Agent(engine=LLMEngine(FakeModel(["helped"])), name="helper", session=session)
    model = FakeModel([call("helper", task="x"), "done"])
    boss = Agent(engine=LLMEngine(model), name="boss", tools=[helper], session=session)
    assert (await boss.run("go")).payload == "done"
    names = [e.payload["agent_name"] for e in session.of_type(EventType.AGENT_START)]
    assert names == ["boss", "helper"]


async def test_built_in_engines_take_a_context_or_keywords_not_both() -> None:
    # guarantee 303
    ctx = RunContext(agent_name="direct", tools=(Agent(engine=Plan(Step(shout))).as_tool("s"),))
    plan = Plan(Step("s"))
    assert (await plan.run(Envelope.from_task("a"), ctx)).payload == "A"
    assert (await plan.run(Envelope.from_task("b"), tools=list(ctx.tools))).payload == "B"
    with pytest.raises(TypeError, match=r"Plan.run got a RunContext and keyword arguments"):
        await plan.run(Envelope.from_task("c"), ctx, tools=list(ctx.tools))
    with pytest.raises(TypeError, match="must be a RunContext"):
        await plan.run(Envelope.from_task("c"), [shout])  # type: ignore[arg-type]
    session = Session()
    engine = LLMEngine(FakeModel(["one", "two"]))
    assert (await engine.run(Envelope.from_task("q"), RunContext(session=session))).ok
    assert (await engine.run(Envelope.from_task("q"), session=session)).ok
    starts = session.of_type(EventType.AGENT_START)
    assert [e.payload["agent_name"] for e in starts] == ["agent", "agent"]
    with pytest.raises(TypeError, match=r"LLMEngine.run got a RunContext and keyword"):
        await engine.run(Envelope.from_task("q"), RunContext(), session=session)


def test_a_location_records_a_plan_run_under_the_callers_key(tmp_path: Path) -> None:
    # guarantee 304
    store = Store(db=tmp_path / "runs.sqlite")
    calls: list[str] = []
    failing = [True]

    def first(text: str) -> str:
        calls.append("first")
        return text + "!"

    def second(text: str) -> str:
        calls.append("second")
        if failing[0]:
            raise RuntimeError("flaky")
        return text.upper()

    own_store = Store(db=tmp_path / "own.sqlite")
    plan = Plan(Step(first), Step(second), store=own_store, checkpoint_key="own")
    agent = Agent(engine=plan, name="etl")
    here = RunLocation(store=store, key="job-7")
    env = agent("go", location=here)
    assert not env.ok and env.metadata["checkpoint_key"] == "job-7"
    assert store.read("job-7")["status"] == "failed"
    assert own_store.keys() == []  # recorded where the caller said, not under "own"
    failing[0] = False
    env = agent("go", location=here)  # resumed at the failed step
    assert env.ok and env.payload == "GO!"
    assert calls == ["first", "second", "second"]
    cached = agent("go", location=here)  # done: its result again, nothing runs
    assert cached.ok and cached.metadata["cached"] is True and cached.payload == "GO!"
    assert calls == ["first", "second", "second"]
    with pytest.raises(TypeError, match="must be a stepstone Store"):
        RunLocation(store="runs.sqlite", key="k")
    with pytest.raises(ValueError, match="non-empty str"):
        RunLocation(store=store, key="")
    # a forking plan forks its own key only: the caller's key is used as it is
    fork = Plan(Step(first), store=own_store, checkpoint_key="own", on_concurrent="fork")
    assert Agent(engine=fork)("f", location=RunLocation(store=store, key="job-9")).ok
    assert store.read("job-9")["status"] == "done" and own_store.keys() == []
    clash = Plan(Step(first, writes="job-8"))
    with pytest.raises(PlanCompileError, match=r"RunLocation\.key"):
        Agent(engine=clash)("go", location=RunLocation(store=store, key="job-8"))


def test_a_location_records_a_replan_run_under_the_callers_key(tmp_path: Path) -> None:
    # guarantee 304
    store = Store(db=tmp_path / "runs.sqlite")
    asked: list[int] = []

    def planner(task: str, round: int) -> PlanRound:
        asked.append(round)
        if round == 1:
            return PlanRound(
                reasoning="shout it", tasks=[ReplanTask(tool="shout", kwargs={"text": task})]
            )
        return PlanRound(reasoning="shouted", done=True, final_answer="shouted")

    agent = Agent(engine=ReplanEngine(), tools=[planner, shout])
    here = RunLocation(store=store, key="replan-9")
    assert agent("hey", location=here).payload == "shouted"
    assert store.read("replan-9")["status"] == "done"
    again = agent("hey", location=here)
    assert again.payload == "shouted" and again.metadata["cached"] is True
    assert asked == [1, 2]


async def test_an_llm_agent_at_a_location_is_the_durable_agent_run_of_that_id(
    tmp_path: Path,
) -> None:
    # guarantee 305
    store = Store(db=tmp_path / "agents.sqlite")
    model = FakeModel([call("shout", text="ticket"), "escalated TICKET"])
    agent = Agent(model=model, name="desk", tools=[shout])
    here = RunLocation(store=store, key="desk-1")
    env = await agent.run("escalate", location=here)
    assert env.ok and env.payload == "escalated TICKET" and env.metadata["run_id"] == "desk-1"
    runner = Runner(store=store)
    assert [r["run_id"] for r in runner.runs()] == ["desk-1"]
    assert runner.snapshot("desk-1")["tool_executions"][0]["content"] == "TICKET"
    again = await agent.run("escalate", location=here)  # finished: its stored result
    assert again.payload == "escalated TICKET" and len(model.requests) == 2
    result = await runner.resume(agent, run_id="desk-1", thread_id="desk-1")
    assert result.state == "completed" and len(model.requests) == 2
    with pytest.raises(UserError, match="a stream is not journaled"):
        async for _ in agent.engine.stream(  # type: ignore[union-attr]
            Envelope.from_task("s"), agent.run_context(location=here)
        ):
            pass


async def test_a_keyword_engine_refuses_a_location(tmp_path: Path) -> None:
    # guarantee 306
    engine = KeywordRecorder()
    here = RunLocation(store=Store(db=tmp_path / "x.sqlite"), key="k")
    with pytest.raises(UserError, match=r"KeywordRecorder takes the keyword interface"):
        await Agent(engine=engine, name="kw").run("go", location=here)
    assert engine.calls == []


def test_a_queued_plan_runs_as_itself_with_its_own_options(tmp_path: Path) -> None:
    # guarantee 307
    store = Store(db=tmp_path / "q.sqlite")
    entry = submit(store, "tests.workers.targets:plan", "t", key="queued-1").entry()
    old = Plan(Step(shout, name="a"), Step(shout, name="b"))
    asyncio.run(old.run(Envelope.from_task("x"), RunContext(location=_at(store, entry.run_key))))
    # the plan changed since; this one says to start over on a change, and the worker's
    # adapter runs this very plan (a copy would have lost on_plan_change)
    new = Plan(Step(shout, name="a"), Step(shout, name="c"), on_plan_change="restart")
    env = asyncio.run(queued_plan(new, None, store, entry)(Envelope.from_task("y")))
    assert env.ok and env.payload == "Y"
    strict = Plan(Step(shout, name="a"), Step(shout, name="d"))
    with pytest.raises(StaleCheckpointError):
        asyncio.run(queued_plan(strict, None, store, entry)(Envelope.from_task("z")))


def _at(store: Store, key: str) -> RunLocation:
    return RunLocation(store=store, key=key)


class Doc(State):
    text: str = ""


class CallableWithRun:
    """A callable node that happens to have an async ``run``: not an agent."""

    def __call__(self, state: Doc) -> dict[str, Any]:
        return {"text": state.text + " called"}

    async def run(self) -> None:
        raise AssertionError("a function node is called, not run")


def test_graph_nodes_use_the_same_agent_check_as_plans() -> None:
    # guarantee 308
    g = (
        GraphBuilder(Doc)
        .add_node("f", CallableWithRun())
        .add_edge("f", END)
        .set_entry("f")
        .compile()
    )
    assert g.invoke(Doc(text="x")).text == "x called"
    writer = Agent(engine=Recorder(), name="writer")
    g2 = (
        GraphBuilder(Doc)
        .add_node("w", writer, writes="text")
        .add_edge("w", END)
        .set_entry("w")
        .compile()
    )
    assert g2.invoke(Doc(text="x")).text.startswith("writer: ")

    class RunOnly:
        async def run(self, task: str) -> Envelope[Any]:
            return Envelope(task=task)

    from stepstone.exceptions import GraphCompileError

    with pytest.raises(GraphCompileError, match="expected a function state -> dict"):
        GraphBuilder(Doc).add_node("r", RunOnly())


def test_plan_paused_carries_its_pending_approvals() -> None:
    # guarantee 309
    pending = [{"call_id": "c1", "tool": "refund"}]
    paused = PlanPaused("waits", pending_approvals=pending)
    assert paused.pending_approvals == pending and PlanPaused().pending_approvals == []
    again = pickle.loads(pickle.dumps(paused))
    assert again.pending_approvals == pending and again.message == "waits"
