"""Every adapter through its official SDK against a loopback server: the tool loop,
streaming, structured output, and the fault scripts (429 + retry-after, 500, connection
reset, a server that never answers, a stream that stalls, malformed JSON, invalid tool-call
arguments). Guarantee 78, 79, 81 on the wire."""

from __future__ import annotations

import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from stepstone import Agent, LLMEngine, StreamStallError
from stepstone.providers import ToolCall, Usage
from stepstone.testing import Hang, Reply, Reset, call
from tests.providers.conftest import Case, WireServer


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_for(case: Case, server: WireServer, **options: Any) -> Agent:
    options.setdefault("retry_delay", 0.01)
    engine = LLMEngine(case.model, provider=case.provider(server.base_url), **options)
    server.engines.append(engine)  # closed by the fixture
    return Agent(engine=engine, tools=[add])


async def test_tool_loop_round_trip(case: Case, server: WireServer) -> None:
    server.push(
        Reply(tool_calls=[call("add", a=1, b=2)], usage=Usage(input_tokens=50, output_tokens=7)),
        Reply(text="1 + 2 = 3", usage=Usage(input_tokens=70, output_tokens=9)),
    )
    env = await agent_for(case, server).run("what is 1 + 2?")
    assert env.ok, env.error
    assert env.payload == "1 + 2 = 3"
    assert (env.metadata["input_tokens"], env.metadata["output_tokens"]) == (120, 16)
    assert env.metadata["provider"] == case.name
    assert env.metadata["cost_usd"] is not None and env.metadata["cost_usd"] > 0
    first, second = (r.json() for r in server.requests)
    assert case.tool_results(second) == [("3", False if case.name != "openai" else None)]
    assert "what is 1 + 2?" in str(first)
    assert "add" in str(first) and "Add two integers." in str(first)


async def test_parallel_calls_results_in_order(
    case: Case, server: WireServer
) -> None:  # guarantee 79
    server.push([call("add", a=i, b=i) for i in range(4)], "done")
    env = await agent_for(case, server).run("q")
    assert env.payload == "done"
    contents = [c for c, _ in case.tool_results(server.requests[1].json())]
    assert contents == ["0", "2", "4", "6"]


async def test_tool_choice_any_on_the_wire(case: Case, server: WireServer) -> None:  # guarantee 78
    server.push(call("add", a=1, b=1), "two")
    await agent_for(case, server, tool_choice="any").run("q")
    assert [case.tool_choice(r.json()) for r in server.requests] == ["required", "auto"]


async def test_stream_across_tool_turns(case: Case, server: WireServer) -> None:  # guarantee 85
    server.push(
        Reply(tool_calls=[call("add", a=2, b=2)]),
        Reply(text="the answer is four", chunk_delay=0.001),
    )
    tokens = [t async for t in agent_for(case, server).stream("2+2")]
    assert "".join(tokens) == "the answer is four"
    assert len(tokens) == 4
    assert case.tool_results(server.requests[1].json())[0][0] == "4"


async def test_stream_tool_call_arguments_arrive_in_pieces(case: Case, server: WireServer) -> None:
    server.push(Reply(tool_calls=[call("add", a=12345, b=67890)]), "ok")
    tokens = [t async for t in agent_for(case, server).stream("q")]
    assert tokens == ["ok"]
    assert case.tool_results(server.requests[1].json())[0][0] == "80235"


async def test_429_honours_retry_after(case: Case, server: WireServer) -> None:
    server.push(server.dialect.error(429, "rate limited", retry_after=0.3), "after the wait")
    start = time.perf_counter()
    # retry_delay is large: only the server's retry-after can make this fast
    env = await agent_for(case, server, retry_delay=5.0).run("q")
    elapsed = time.perf_counter() - start
    assert env.payload == "after the wait", env.error
    assert 0.3 <= elapsed < 2.0
    assert len(server.requests) == 2


async def test_500_is_retried_with_backoff(case: Case, server: WireServer) -> None:
    server.push(server.dialect.error(500, "boom"), server.dialect.error(503, "busy"), "ok")
    env = await agent_for(case, server).run("q")
    assert env.payload == "ok", env.error
    assert len(server.requests) == 3


async def test_retries_exhausted_is_an_error_envelope(case: Case, server: WireServer) -> None:
    server.push(*[server.dialect.error(500, "still down")] * 3)
    env = await agent_for(case, server, max_retries=2).run("q")
    assert env.error is not None
    assert "500" in env.error.message or "still down" in env.error.message
    assert len(server.requests) == 3


async def test_400_is_not_retried(case: Case, server: WireServer) -> None:
    server.push(server.dialect.error(400, "bad request"), "never")
    env = await agent_for(case, server).run("q")
    assert env.error is not None and "bad request" in env.error.message
    assert len(server.requests) == 1


async def test_connection_reset_is_retried(case: Case, server: WireServer) -> None:
    server.push(Reset(), "after reset")
    env = await agent_for(case, server).run("q")
    assert env.payload == "after reset", env.error
    assert len(server.requests) == 2


async def test_request_timeout_on_a_server_that_never_answers(
    case: Case, server: WireServer
) -> None:
    server.push(Hang())
    start = time.perf_counter()
    env = await agent_for(case, server, request_timeout=0.2, max_retries=0).run("q")
    assert time.perf_counter() - start < 2
    assert env.error is not None and env.error.type == "TimeoutError"
    assert "request_timeout=0.2" in env.error.message


async def test_timeout_then_retry_succeeds(case: Case, server: WireServer) -> None:
    server.push(Hang(), "second attempt")
    # generous: the second attempt must answer within it on a loaded machine too
    env = await agent_for(case, server, request_timeout=1.5, max_retries=1).run("q")
    assert env.payload == "second attempt", env.error


async def test_stream_stall_mid_way(case: Case, server: WireServer) -> None:  # guarantee 81
    server.push(Reply(text="alpha beta gamma delta", stall_after=2))
    agent = agent_for(case, server, stream_idle_timeout=0.2)
    got: list[str] = []
    start = time.perf_counter()
    with pytest.raises(StreamStallError):
        async for token in agent.stream("q"):
            got.append(token)
    assert got == ["alpha ", "beta "]
    assert time.perf_counter() - start < 2


async def test_malformed_json_is_an_error_not_a_crash(case: Case, server: WireServer) -> None:
    server.push(server.dialect.malformed(), "unused")
    env = await agent_for(case, server, max_retries=0).run("q")
    assert env.error is not None and env.error.type == "ModelAPIError"  # guarantee 219
    assert env.error.retryable  # a cut-off body is transient: retried, then retryable
    assert len(server.requests) == 1


async def test_invalid_tool_arguments_reported_to_the_model(case: Case, server: WireServer) -> None:
    bad = ToolCall(id="bad-1", name="add", raw_arguments='{"a": 1, "b": ')
    wrong = call("add", a="x", b=1)
    # Gemini's wire format carries arguments as a JSON object, so only type errors exist there
    calls = [wrong] if case.name == "google" else [bad, wrong]
    server.push(calls, "I will fix my arguments")
    env = await agent_for(case, server).run("q")
    assert env.payload == "I will fix my arguments", env.error
    results = case.tool_results(server.requests[1].json())
    assert len(results) == len(calls)
    for content, is_error in results:
        assert content.startswith("Error: InvalidArguments")
        assert is_error in (True, None)


async def test_invalid_tool_arguments_in_a_stream(case: Case, server: WireServer) -> None:
    bad = ToolCall(id="bad-2", name="add", raw_arguments='{"a": 1, "b": ')
    wrong = call("add", a=[1], b=1)
    server.push(Reply(tool_calls=[wrong if case.name == "google" else bad]), "recovered")
    assert [t async for t in agent_for(case, server).stream("q")] == ["recovered"]
    ((content, _),) = case.tool_results(server.requests[1].json())
    assert content.startswith("Error: InvalidArguments")


class Verdict(BaseModel):
    label: Literal["spam", "ham"]
    confidence: float


async def test_structured_output(case: Case, server: WireServer) -> None:  # guarantee 210
    server.push('{"label": "spam", "confidence": 0.93}')
    agent = agent_for(case, server)
    env = await agent.run("classify: WIN A PRIZE", output=Verdict)
    assert env.payload == Verdict(label="spam", confidence=0.93)
    body = server.requests[0].json()
    if case.name == "openai":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["name"] == "Verdict"
        assert fmt["json_schema"]["strict"] is True
        schema = fmt["json_schema"]["schema"]
        assert schema["properties"]["label"]["enum"] == ["spam", "ham"]
        assert schema["additionalProperties"] is False
    elif case.name == "anthropic":
        fmt = body["output_config"]["format"]
        assert fmt["type"] == "json_schema"
        assert fmt["schema"]["properties"]["label"]["enum"] == ["spam", "ham"]
        assert "JSON schema" not in str(body.get("system", ""))
    else:
        # gemini-2.5 rejects a response schema next to function tools: the answer is asked
        # for as the arguments of one more function, which must be called
        config = body["generationConfig"]
        assert "responseMimeType" not in config
        (declarations,) = (t["functionDeclarations"] for t in body["tools"])
        final = next(d for d in declarations if d["name"] == "final_result")
        params = final.get("parametersJsonSchema") or final["parameters_json_schema"]
        assert params["properties"]["label"]["enum"] == ["spam", "ham"]
        assert body["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
async def test_gemini_answers_through_the_output_function(
    case: Case, server: WireServer, stream: bool
) -> None:  # guarantee 210
    if case.name != "google":
        pytest.skip("the output function is the fallback for Gemini 1.x/2.x with tools")
    server.push(call("add", a=1, b=2), call("final_result", label="ham", confidence=0.5))
    agent = agent_for(case, server)
    if stream:
        agent.output = Verdict
        tokens = [t async for t in agent.stream("q")]
        assert Verdict.model_validate_json("".join(tokens)) == Verdict(label="ham", confidence=0.5)
    else:
        env = await agent.run("q", output=Verdict)
        assert env.payload == Verdict(label="ham", confidence=0.5), env.error
    # the answer is replayed as text, never as a call without a function response
    assert len(server.requests) == 2
    server.push(call("final_result", result=[1, 2, 3]))
    env = await agent.run("numbers", output=list[int])
    assert env.payload == [1, 2, 3], env.error


async def test_structured_output_without_tools_is_native(case: Case, server: WireServer) -> None:
    server.push('{"label": "ham", "confidence": 0.5}')
    engine = LLMEngine(case.model, provider=case.provider(server.base_url))
    server.engines.append(engine)
    env = await Agent(engine=engine).run("classify: hello", output=Verdict)
    assert env.payload == Verdict(label="ham", confidence=0.5), env.error
    body = server.requests[0].json()
    if case.name == "google":
        config = body["generationConfig"]
        assert config["responseMimeType"] == "application/json"
        schema = config.get("responseJsonSchema") or config.get("response_json_schema")
        assert schema["properties"]["label"]["enum"] == ["spam", "ham"]
    elif case.name == "anthropic":
        assert body["output_config"]["format"]["type"] == "json_schema"
    else:
        assert body["response_format"]["json_schema"]["strict"] is True


async def test_system_and_temperature_on_the_wire(case: Case, server: WireServer) -> None:
    server.push("ok")
    await agent_for(case, server, system="Be terse.", temperature=0.25).run("q", context="ctx")
    body = server.requests[0].json()
    text = str(body)
    assert "Be terse.\\n\\nctx" in text or "Be terse.\n\nctx" in text
    if case.name == "google":
        assert body["generationConfig"]["temperature"] == 0.25
    else:
        assert body["temperature"] == 0.25


async def test_api_key_header(case: Case, server: WireServer) -> None:
    server.push("ok")
    await agent_for(case, server).run("q")
    headers = server.requests[0].headers
    assert "test-key" in (
        headers.get("x-api-key", "")
        + headers.get("authorization", "")
        + headers.get("x-goog-api-key", "")
    )


async def test_openai_list_output_is_wrapped_in_an_object(case: Case, server: WireServer) -> None:
    # guarantee 410
    if case.name != "openai":
        pytest.skip("OpenAI wants an object at the root of a response schema")
    server.push('{"result": [1, 2, 3]}', "[4, 5]")
    agent = agent_for(case, server)
    env = await agent.run("numbers", output=list[int])
    assert env.payload == [1, 2, 3], env.error
    fmt = server.requests[0].json()["response_format"]["json_schema"]
    assert fmt["strict"] is True and fmt["schema"]["required"] == ["result"]
    assert (await agent.run("numbers", output=list[int])).payload == [4, 5]  # unwrapped too
