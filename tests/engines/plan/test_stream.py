"""Plan.stream / Agent.stream over a Plan: LLM step text as it comes, tagged with its step,
each step still committed before the next starts (guarantees 605-607)."""

from __future__ import annotations

from typing import Any

import pytest

from stepstone import Agent, LLMEngine, Plan, Step, Store
from stepstone.core import Envelope
from stepstone.engines.plan import StepToken
from stepstone.testing import FakeModel, Reply, call


def _llm(*replies: Any, name: str = "writer", tools: Any = None) -> Agent:
    return Agent(engine=LLMEngine(FakeModel(list(replies))), name=name, tools=tools or [])


async def test_llm_steps_stream_their_text_tagged_with_the_step() -> None:
    # guarantee 605
    plan = Plan(
        Step(_llm(Reply(text="red green blue", chunk_delay=0.0)), name="colours"),
        Step(lambda text: text.upper(), name="shout"),
        Step(_llm(Reply(text="done and dusted", chunk_delay=0.0)), name="close"),
    )
    tokens = [t async for t in plan.stream(Envelope.from_task("go"))]
    assert all(isinstance(t, StepToken) and t.kind == "text" for t in tokens)
    assert "".join(t for t in tokens if t.step == "colours") == "red green blue"
    assert "".join(t for t in tokens if t.step == "close") == "done and dusted"
    assert {t.step for t in tokens} == {"colours", "close"}  # a function step streams nothing
    assert len(tokens) > 2


async def test_boundaries_mark_every_step_and_the_end() -> None:
    # guarantee 605
    plan = Plan(
        Step(lambda t: f"<{t}>", name="wrap"),
        Step(_llm(Reply(text="a b", chunk_delay=0.0)), name="say"),
    )
    agent = Agent(engine=plan)
    tokens = [t async for t in agent.stream("x", boundaries=True)]
    shape = [(t.kind, t.step) for t in tokens if t.kind != "text"]
    assert shape == [
        ("start", "wrap"),
        ("end", "wrap"),
        ("start", "say"),
        ("end", "say"),
        ("done", None),
    ]
    ends = [t for t in tokens if t.kind == "end"]
    assert ends[0].envelope is not None and ends[0].envelope.payload == "<x>"
    assert tokens[-1].envelope is not None and tokens[-1].envelope.payload == "a b"
    assert "".join(tokens) == "a b"  # the markers are empty strings


async def test_each_step_is_committed_before_the_next_streams(tmp_path: Any) -> None:
    # guarantee 606
    store = Store(db=tmp_path / "s.sqlite")
    plan = Plan(
        Step(_llm(Reply(text="first words", chunk_delay=0.0)), name="draft", writes="draft"),
        Step(_llm(Reply(text="second words", chunk_delay=0.0)), name="edit", writes="final"),
        store=store,
        checkpoint_key="streamed",
    )
    seen_when_edit_streamed: list[Any] = []
    async for token in plan.stream(Envelope.from_task("go")):
        if token.step == "edit" and not seen_when_edit_streamed:
            seen_when_edit_streamed.append(store.read("streamed"))
    (state,) = seen_when_edit_streamed
    assert state["completed_steps"] == ["draft"] and state["kv"] == {"draft": "first words"}
    done = store.read("streamed")
    assert done["status"] == "done" and done["kv"]["final"] == "second words"
    store.close()


async def test_an_agent_called_as_a_tool_streams_nothing_into_the_plan() -> None:
    # guarantee 605
    helper = _llm(Reply(text="secret helper text", chunk_delay=0.0), name="helper")
    lead = _llm(
        call("helper", task="help"),
        Reply(text="lead answer", chunk_delay=0.0),
        name="lead",
        tools=[helper],
    )
    tokens = [t async for t in Plan(Step(lead, name="lead")).stream(Envelope.from_task("q"))]
    assert "".join(tokens) == "lead answer"


async def test_parallel_steps_stream_tagged_pieces() -> None:
    # guarantee 605
    plan = Plan(
        Step(_llm(Reply(text="left side", chunk_delay=0.001)), name="left", parallel=True),
        Step(_llm(Reply(text="right side", chunk_delay=0.001)), name="right", parallel=True),
    )
    tokens = [t async for t in plan.stream(Envelope.from_task("q"))]
    assert "".join(t for t in tokens if t.step == "left") == "left side"
    assert "".join(t for t in tokens if t.step == "right") == "right side"


async def test_a_failed_run_raises_after_its_tokens_and_resumes() -> None:
    # guarantee 607
    store = Store()
    flaky = {"fail": True}

    def check(text: str) -> str:
        if flaky.pop("fail", False):
            raise ValueError("not yet")
        return f"checked {text}"

    def plan() -> Plan:
        return Plan(
            Step(_llm(Reply(text="some draft", chunk_delay=0.0)), name="draft"),
            Step(check, name="check"),
            store=store,
            checkpoint_key="k",
            resume=True,
        )

    got: list[str] = []
    with pytest.raises(RuntimeError, match="ValueError: not yet"):
        async for token in plan().stream(Envelope.from_task("go")):
            got.append(token)
    assert "".join(got) == "some draft"
    assert store.read("k")["status"] == "failed"
    again = [t async for t in plan().stream(Envelope.from_task("go"), boundaries=True)]
    assert [(t.kind, t.step) for t in again] == [
        ("start", "check"),
        ("end", "check"),
        ("text", None),  # nothing streamed in this run: the final text once
        ("done", None),
    ]
    assert again[2] == "checked some draft"


async def test_a_consumer_that_stops_early_leaves_a_resumable_run() -> None:
    # guarantee 607
    store = Store()
    words = " ".join(f"w{i}" for i in range(40))

    def plan() -> Plan:
        return Plan(
            Step(_llm(Reply(text=words, chunk_delay=0.002)), name="long"),
            Step(lambda t: "after", name="after"),
            store=store,
            checkpoint_key="cut",
            resume=True,
        )

    stream = plan().stream(Envelope.from_task("go"))
    async for _ in stream:
        break
    await stream.aclose()
    assert store.read("cut")["status"] == "failed"  # a crash of the step, resumable
    env = await plan().run(Envelope.from_task("go"))
    assert env.ok and env.payload == "after"


async def test_an_agent_stream_closed_early_stops_the_plan_at_once() -> None:
    # guarantee 607: through Agent.stream too, without waiting for garbage collection
    store = Store()
    words = " ".join(f"w{i}" for i in range(40))
    plan = Plan(
        Step(_llm(Reply(text=words, chunk_delay=0.002)), name="long"),
        store=store,
        checkpoint_key="agent-cut",
    )
    stream = Agent(engine=plan).stream("go")
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert store.read("agent-cut")["status"] == "failed"
