"""Scripted models: FakeModel, FunctionModel, Reply, call, block_model_requests."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from stepstone import Agent, LLMEngine
from stepstone.providers import ModelRequest, Usage
from stepstone.testing import (
    FakeModel,
    FunctionModel,
    Reply,
    ScriptExhaustedError,
    TransientModelError,
    call,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_fake_model_text_and_tool_call_turns() -> None:
    model = FakeModel([call("add", a=2, b=3), "2 + 3 = 5"])
    agent = Agent(engine=LLMEngine(model), tools=[add])
    env = await agent.run("add 2 and 3")
    assert env.ok, env.error
    assert env.payload == "2 + 3 = 5"
    assert len(model.requests) == 2
    result = model.requests[1].messages[-1].tool_results[0]
    assert (result.name, result.content, result.is_error) == ("add", "5", False)
    assert result.call_id == "call_0_0"
    assert model.remaining == 0


async def test_list_of_calls_is_one_turn() -> None:
    model = FakeModel([[call("add", a=1, b=1), call("add", a=2, b=2)], "done"])
    env = await Agent(engine=LLMEngine(model), tools=[add]).run("x")
    assert env.payload == "done"
    contents = [r.content for r in model.requests[1].messages[-1].tool_results]
    assert contents == ["2", "4"]


async def test_dict_and_model_items_are_json_answers() -> None:
    class Out(BaseModel):
        kind: str

    model = FakeModel([{"kind": "a"}, Out(kind="b")])
    agent = Agent(engine=LLMEngine(model), output=Out)
    assert (await agent.run("one")).payload == Out(kind="a")
    assert (await agent.run("two")).payload == Out(kind="b")


async def test_script_exhausted_is_an_error_envelope() -> None:
    model = FakeModel(["only"])
    agent = Agent(engine=LLMEngine(model))
    assert (await agent.run("a")).payload == "only"
    env = await agent.run("b")
    assert env.error is not None
    assert env.error.type == "ScriptExhaustedError"
    assert "exhausted" in env.error.message


async def test_repeat_last() -> None:
    model = FakeModel(["same"], repeat_last=True)
    agent = Agent(engine=LLMEngine(model))
    for _ in range(3):
        assert (await agent.run("q")).payload == "same"


async def test_exception_items_raise_and_transient_ones_are_retried() -> None:
    model = FakeModel([TransientModelError("busy", retry_after=0), "after retry"])
    env = await Agent(engine=LLMEngine(model, retry_delay=0.001)).run("q")
    assert env.payload == "after retry"
    assert len(model.requests) == 2

    model = FakeModel([ValueError("bad request")])
    env = await Agent(engine=LLMEngine(model)).run("q")
    assert env.error is not None and env.error.type == "ValueError"
    assert len(model.requests) == 1  # not transient: no retry


async def test_stream_chunks_delay_and_usage() -> None:
    model = FakeModel(
        [
            Reply(
                text="ignored",
                chunks=["a", "b", "c"],
                chunk_delay=0.001,
                usage=Usage(output_tokens=7),
            )
        ]
    )
    agent = Agent(engine=LLMEngine(model))
    tokens = [t async for t in agent.stream("q")]
    assert tokens == ["a", "b", "c"]
    env = await Agent(
        engine=LLMEngine(FakeModel([Reply(text="x", usage=Usage(output_tokens=7))]))
    ).run("q")
    assert env.metadata["output_tokens"] == 7


async def test_default_chunks_are_words() -> None:
    agent = Agent(engine=LLMEngine(FakeModel(["one two three"])))
    assert [t async for t in agent.stream("q")] == ["one ", "two ", "three"]


async def test_reply_delay_is_slept() -> None:
    agent = Agent(engine=LLMEngine(FakeModel([Reply(text="late", delay=0.05)])))
    start = asyncio.get_running_loop().time()
    assert (await agent.run("q")).payload == "late"
    assert asyncio.get_running_loop().time() - start >= 0.05


async def test_function_model_sync_and_async() -> None:
    def echo(request: ModelRequest) -> str:
        return "you said: " + request.messages[0].text

    assert (await Agent(engine=LLMEngine(FunctionModel(echo))).run("hi")).payload == "you said: hi"

    async def tooling(request: ModelRequest) -> object:
        if request.messages[-1].role == "tool":
            return "sum is " + request.messages[-1].tool_results[0].content
        return call("add", a=20, b=22)

    env = await Agent(engine=LLMEngine(FunctionModel(tooling)), tools=[add]).run("q")
    assert env.payload == "sum is 42"


def test_bad_script_item_is_a_type_error_envelope() -> None:
    env = Agent(engine=LLMEngine(FakeModel([3.5])))("q")
    assert env.error is not None and env.error.type == "TypeError"


def test_script_exhausted_error_type() -> None:
    assert issubclass(ScriptExhaustedError, RuntimeError)
