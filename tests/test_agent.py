"""Agent: an engine with a tool map, a name and an output type, callable like a function.

Engines' behaviour is tested under tests/engines/; this file checks what Agent itself adds:
construction and its errors, how tasks become envelopes, the sync/async bridge, streaming,
and agents as tools of other agents.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import Agent, Envelope, LLMEngine, Plan, Step, Tool
from stepstone.exceptions import PlanCompileError
from stepstone.testing import FakeModel, Reply, call


class Verdict(BaseModel):
    ok: bool


def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def test_a_model_string_is_shorthand_for_an_llm_engine() -> None:
    agent = Agent("claude-sonnet-4-6", max_turns=3, name="writer")
    assert isinstance(agent.engine, LLMEngine)
    assert (agent.engine.model, agent.engine.provider, agent.engine.max_turns) == (
        "claude-sonnet-4-6",
        "anthropic",
        3,
    )
    assert repr(agent) == "Agent(name='writer', engine=LLMEngine)"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Agent(), r"Agent\(\) needs an engine: Agent\(engine=Plan"),
        (lambda: Agent(engine=object()), "needs an engine with .run()"),
        (
            lambda: Agent(engine=Plan(Step(shout)), temperature=0.2),
            r"unexpected keyword arguments \['temperature'\]; engine options belong",
        ),
    ],
)
def test_construction_errors_say_how_to_fix_the_call(make: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        make()


def test_tools_keep_their_order_and_names() -> None:
    helper = Agent(engine=Plan(Step(shout)), name="helper", description="Shouts.")
    explicit = Tool.from_function(shout, name="loud")
    agent = Agent(engine=Plan(Step("loud")), tools=[shout, helper, explicit])
    assert [t.name for t in agent.tools] == ["shout", "helper", "loud"]
    assert agent.name == "agent"  # the default name


def test_the_engine_is_compiled_against_the_tools_at_construction() -> None:
    # guarantee 60: an invalid plan fails when the Agent is built, before anything runs
    with pytest.raises(PlanCompileError, match="missing"):
        Agent(engine=Plan(Step("missing")), tools=[shout])


def test_str_and_envelope_tasks() -> None:
    agent = Agent(engine=Plan(Step(shout)))
    assert agent("hi").payload == "HI"
    env = Envelope.from_task("there", context="earlier")
    out = agent(env)
    assert out.ok and out.payload == "THERE"
    with pytest.raises(TypeError, match="Agent tasks are str or Envelope, got int: 3"):
        agent(3)  # type: ignore[arg-type]


async def test_context_is_added_to_the_envelope() -> None:
    model = FakeModel(["done"])
    agent = Agent(engine=LLMEngine(model))
    await agent.run(Envelope.from_task("task", context="first part"), context="second part")
    # the envelope's context and the call's are joined, in order, by a blank line
    assert model.requests[0].system == "first part\n\nsecond part"
    assert model.requests[0].messages[-1].text == "task"


async def test_the_sync_call_refuses_to_block_a_running_loop() -> None:
    agent = Agent(engine=Plan(Step(shout)), name="loud")
    with pytest.raises(RuntimeError, match=r"use `await loud.run\(...\)` instead"):
        agent("hi")
    assert (await agent.run("hi")).payload == "HI"  # the async form works here


async def test_output_type_per_agent_and_per_call() -> None:
    model = FakeModel([{"ok": True}, {"ok": False}])
    agent = Agent(engine=LLMEngine(model), output=Verdict)
    assert (await agent.run("judge")).payload == Verdict(ok=True)
    assert model.requests[0].output_schema is not None
    plain = FakeModel(["just text"])
    assert (await Agent(engine=LLMEngine(plain)).run("q", output=str)).payload == "just text"


async def test_stream_of_an_engine_without_streaming_yields_the_final_text_once() -> None:
    agent = Agent(engine=Plan(Step(shout)))
    assert [t async for t in agent.stream("hi")] == ["HI"]

    def broken(text: str) -> str:
        raise ValueError(f"cannot handle {text!r}")

    failing = Agent(engine=Plan(Step(broken)))
    with pytest.raises(RuntimeError, match="ValueError: cannot handle 'hi'"):
        [t async for t in failing.stream("hi")]


async def test_stream_of_an_llm_agent_yields_tokens() -> None:
    model = FakeModel([Reply(text="one two three", chunk_delay=0.0)])
    tokens = [t async for t in Agent(engine=LLMEngine(model)).stream("count")]
    assert "".join(tokens) == "one two three" and len(tokens) > 1


async def test_an_agent_as_a_tool_of_another_agent() -> None:
    helper = Agent(engine=Plan(Step(shout)), name="shouter", description="Shouts the task.")
    as_tool = helper.as_tool()
    assert (as_tool.name, as_tool.description) == ("shouter", "Shouts the task.")
    assert as_tool.parameters["required"] == ["task"]
    assert await as_tool.run(task="quiet") == "QUIET"
    model = FakeModel([call("shouter", task="psst"), "the helper said PSST"])
    boss = Agent(engine=LLMEngine(model), tools=[helper])
    env = await boss.run("ask the helper")
    assert env.payload == "the helper said PSST"
    (result,) = model.requests[1].messages[-1].tool_results
    assert (result.content, result.is_error) == ("PSST", False)
    renamed = helper.as_tool("yell", description="Yells.")
    assert (renamed.name, renamed.description) == ("yell", "Yells.")


def test_from_provider_picks_the_tier_model_of_the_provider() -> None:
    agent = Agent.from_provider("anthropic", tier="cheap", name="cheap", max_turns=2)
    assert isinstance(agent.engine, LLMEngine)
    assert agent.engine.provider == "anthropic" and agent.engine.max_turns == 2
    assert agent.name == "cheap"


def test_agents_run_concurrently_from_threads() -> None:
    # each sync call gets its own event loop: agents can be called from worker threads
    agent = Agent(engine=Plan(Step(shout)))

    async def main() -> list[Any]:
        return await asyncio.gather(*(asyncio.to_thread(agent, f"t{i}") for i in range(4)))

    assert [e.payload for e in asyncio.run(main())] == ["T0", "T1", "T2", "T3"]


def test_agent_like_recognises_agents_and_nothing_else() -> None:
    """Layers below the agent layer recognise an Agent through the AgentLike protocol: a Plan
    step, a tool list and the plan serializer all treat it as an agent, not as a callable."""
    from stepstone.core import AgentLike, build_tool_map, is_agent_like

    agent = Agent(engine=Plan(Step(shout)), name="shouter")
    assert isinstance(agent, AgentLike) and is_agent_like(agent)
    for other in (shout, Tool.from_function(shout), Plan(Step(shout)), "shouter", object()):
        assert not isinstance(other, AgentLike), other
        assert not is_agent_like(other), other
    assert list(build_tool_map([agent])) == ["shouter"]
    assert Plan(Step(agent)).to_dict()["steps"][0]["target"] == {"agent": "shouter"}
