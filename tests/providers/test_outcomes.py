"""What real providers send besides a clean answer, through each official SDK against a
loopback server that counts requests: refusals, content filters, truncation at the token
cap, paused turns, malformed function calls, streams cut before their final event, error
events inside a stream, and connection resets mid-stream."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import (
    Agent,
    IncompleteStreamError,
    LLMEngine,
    ModelAPIError,
    ModelLengthError,
    ModelOverloadedError,
    ModelRefusalError,
)
from stepstone.testing import Reply, Respond, call
from tests.providers.conftest import Case, WireServer

RAW_STOP = {
    "anthropic": {"stop": "end_turn", "refusal": "refusal", "length": "max_tokens"},
    "openai": {"stop": "stop", "refusal": "stop", "length": "length"},
    "google": {"stop": "STOP", "refusal": "SAFETY", "length": "MAX_TOKENS"},
}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_for(case: Case, server: WireServer, **options: Any) -> Agent:
    options.setdefault("retry_delay", 0.01)
    engine = LLMEngine(case.model, provider=case.provider(server.base_url), **options)
    server.engines.append(engine)
    return Agent(engine=engine, tools=[add])


class Verdict(BaseModel):
    label: str


async def test_stop_reason_is_normalised_and_raw_kept(case: Case, server: WireServer) -> None:
    # guarantee 201
    server.push("fine")
    env = await agent_for(case, server).run("q")
    assert env.payload == "fine", env.error
    assert env.metadata["stop_reason"] == "stop"
    assert env.metadata["raw_stop_reason"] == RAW_STOP[case.name]["stop"]


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
async def test_refusal_is_a_typed_error_not_retried(
    case: Case, server: WireServer, stream: bool
) -> None:  # guarantee 200
    server.push(Reply(text="I can't help with that.", stop_reason="refusal"), "never sent")
    agent = agent_for(case, server)
    if stream:
        with pytest.raises(ModelRefusalError) as info:
            async for _ in agent.stream("q"):
                pass
        error = info.value
        assert error.text == "I can't help with that."
        assert error.raw_stop_reason == RAW_STOP[case.name]["refusal"]
        assert not error.retryable
    else:
        env = await agent.run("q")
        assert env.error is not None and env.error.type == "ModelRefusalError"
        assert "I can't help with that." in env.error.message
        expected = "content_filter" if case.name == "google" else "refusal"
        assert env.metadata["stop_reason"] == expected
        assert env.metadata["raw_stop_reason"] == RAW_STOP[case.name]["refusal"]
    assert len(server.requests) == 1


async def test_refusal_with_structured_output_ends_at_once(case: Case, server: WireServer) -> None:
    # before: each turn was spent repairing "JSON" that was a refusal, ending in MaxTurnsExceeded
    server.push(*[Reply(text="No.", stop_reason="refusal")] * 3)
    env = await agent_for(case, server, max_turns=3).run("q", output=Verdict)
    assert env.error is not None and env.error.type == "ModelRefusalError"
    assert len(server.requests) == 1


async def test_openai_content_filter(server: WireServer, case: Case) -> None:
    if case.name != "openai":
        pytest.skip("content_filter is an OpenAI finish reason")
    server.push(Reply(text="", stop_reason="content_filter"))
    env = await agent_for(case, server).run("q")
    assert env.error is not None and env.error.type == "ModelRefusalError"
    assert env.metadata["raw_stop_reason"] == "content_filter"


async def test_length_is_a_typed_error(case: Case, server: WireServer) -> None:  # guarantee 202
    server.push(Reply(text="The answer is", stop_reason="length"))
    env = await agent_for(case, server).run("q")
    assert env.error is not None and env.error.type == "ModelLengthError"
    assert env.metadata["stop_reason"] == "length"
    assert env.metadata["raw_stop_reason"] == RAW_STOP[case.name]["length"]
    assert len(server.requests) == 1


async def test_length_continuation_is_opt_in(case: Case, server: WireServer) -> None:
    server.push(Reply(text="The answer ", stop_reason="length"), "is 42.")
    env = await agent_for(case, server, continue_on_length=1).run("q")
    assert env.payload == "The answer is 42.", env.error
    assert len(server.requests) == 2
    assert "cut off" in str(server.requests[1].json())


async def test_length_continuation_is_bounded(case: Case, server: WireServer) -> None:
    server.push(*[Reply(text="more ", stop_reason="length")] * 3)
    agent = agent_for(case, server, continue_on_length=2)
    with pytest.raises(ModelLengthError):
        async for _ in agent.stream("q"):
            pass
    assert len(server.requests) == 3


async def test_anthropic_pause_turn_continues(case: Case, server: WireServer) -> None:
    # guarantee 203
    if case.name != "anthropic":
        pytest.skip("pause_turn is Anthropic's")
    server.push(Reply(text="Searching. ", stop_reason="pause"), "Found it.")
    env = await agent_for(case, server).run("q")
    assert env.payload == "Searching. Found it.", env.error
    assert len(server.requests) == 2
    last = server.requests[1].json()["messages"][-1]
    assert last["role"] == "assistant"  # the paused turn is sent back for the API to resume


async def test_gemini_malformed_function_call_is_retried(case: Case, server: WireServer) -> None:
    # guarantee 204
    if case.name != "google":
        pytest.skip("MALFORMED_FUNCTION_CALL is Gemini's")
    server.push(Reply(text="", stop_reason="malformed_tool_call"), call("add", a=1, b=2), "3")
    env = await agent_for(case, server).run("q")
    assert env.payload == "3", env.error
    assert len(server.requests) == 3
    assert "malformed" in str(server.requests[1].json()["contents"][-1])


async def test_gemini_blocked_prompt(case: Case, server: WireServer) -> None:
    if case.name != "google":
        pytest.skip("promptFeedback.blockReason is Gemini's")
    body = {"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": case.model}
    server.push(Respond(body=body))
    env = await agent_for(case, server).run("q")
    assert env.error is not None and env.error.type == "ModelRefusalError"
    assert env.metadata["raw_stop_reason"] == "prompt_blocked:SAFETY"
    assert len(server.requests) == 1


# -- streams -----------------------------------------------------------------------------


async def test_truncated_stream_after_text_is_an_error(case: Case, server: WireServer) -> None:
    # guarantee 205
    server.push(Reply(text="partial answer", truncate=True), "unused")
    got: list[str] = []
    with pytest.raises(IncompleteStreamError) as info:
        async for token in agent_for(case, server).stream("q"):
            got.append(token)
    assert "".join(got) == "partial answer"
    assert info.value.retryable and info.value.kind == "incomplete_stream"
    assert len(server.requests) == 1  # text already went out: not retried


async def test_truncated_stream_before_text_is_retried(case: Case, server: WireServer) -> None:
    # guarantee 205
    server.push(Reply(tool_calls=[call("add", a=1, b=1)], truncate=True), "complete")
    tokens = [t async for t in agent_for(case, server).stream("q")]
    assert tokens == ["complete"]
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", ["overloaded", "rate_limit", "server"])
async def test_stream_error_event_before_text_is_retried(
    case: Case, server: WireServer, kind: str
) -> None:  # guarantee 206
    server.push(Reply(text="never shown", stream_error=kind), "second try")
    tokens = [t async for t in agent_for(case, server).stream("q")]
    assert "".join(tokens) == "second try"
    assert len(server.requests) == 2


async def test_stream_error_event_bad_request_is_not_retried(
    case: Case, server: WireServer
) -> None:
    server.push(Reply(text="x", stream_error="bad_request"), "unused")
    with pytest.raises(ModelAPIError) as info:
        async for _ in agent_for(case, server).stream("q"):
            pass
    assert not info.value.retryable
    assert len(server.requests) == 1


async def test_stream_error_event_after_text_is_typed(case: Case, server: WireServer) -> None:
    server.push(Reply(text="one two three", stream_error="overloaded", error_after=1), "unused")
    got: list[str] = []
    with pytest.raises(ModelAPIError) as info:
        async for token in agent_for(case, server).stream("q"):
            got.append(token)
    assert got == ["one "]
    assert info.value.retryable and info.value.provider == case.name
    if case.name != "openai":  # OpenAI's stream error has no "overloaded" type
        assert isinstance(info.value, ModelOverloadedError)
    assert len(server.requests) == 1
    clone = pickle.loads(pickle.dumps(info.value))
    assert (clone.kind, clone.retryable, str(clone)) == (
        info.value.kind,
        True,
        str(info.value),
    )


async def test_connection_reset_mid_stream_before_text(case: Case, server: WireServer) -> None:
    # guarantee 206
    server.push(Reply(tool_calls=[call("add", a=2, b=2)], reset_after=0), "after reset")
    tokens = [t async for t in agent_for(case, server).stream("q")]
    assert "".join(tokens) == "after reset"
    assert len(server.requests) == 2


async def test_connection_reset_mid_stream_after_text(case: Case, server: WireServer) -> None:
    server.push(Reply(text="a b c d", reset_after=2), "unused")
    with pytest.raises(ModelAPIError) as info:
        async for _ in agent_for(case, server).stream("q"):
            pass
    assert info.value.kind == "connection" and info.value.retryable
    assert len(server.requests) == 1
