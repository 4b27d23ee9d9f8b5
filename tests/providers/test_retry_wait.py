"""Retry waits as each provider states them (retry-after seconds or HTTP date,
retry-after-ms, x-should-retry, Gemini's RetryInfo in the body), the cap on the wait
(``max_retry_wait``) with ``retry_at`` beyond it, and the SDK's own timeout."""

from __future__ import annotations

import email.utils
import time
from typing import Any

from stepstone import Agent, LLMEngine, ModelRateLimitError
from stepstone.providers import AnthropicProvider
from stepstone.testing import Reply, Respond
from tests.providers.conftest import Case, WireServer


def agent_for(case: Case, server: WireServer, **options: Any) -> Agent:
    options.setdefault("retry_delay", 0.01)
    engine = LLMEngine(case.model, provider=case.provider(server.base_url), **options)
    server.engines.append(engine)
    return Agent(engine=engine)


def with_headers(response: Respond, headers: dict[str, str]) -> Respond:
    return Respond(
        status=response.status,
        body=response.body,
        headers={**response.headers, **headers},
        content_type=response.content_type,
    )


async def test_server_wait_is_honoured(case: Case, server: WireServer) -> None:
    # guarantee 207: Gemini states it in the body (RetryInfo.retryDelay), the others in headers
    server.push(server.dialect.error(429, "slow down", retry_after=0.6), "ok")
    start = time.perf_counter()
    env = await agent_for(case, server).run("q")
    assert env.payload == "ok", env.error
    assert time.perf_counter() - start >= 0.6
    assert len(server.requests) == 2


async def test_retry_after_http_date(case: Case, server: WireServer) -> None:
    # guarantee 207
    if case.name == "google":
        return  # Gemini states its wait in the body
    when = email.utils.formatdate(time.time() + 1.5, usegmt=True)
    server.push(with_headers(server.dialect.error(503, "busy"), {"retry-after": when}), "ok")
    start = time.perf_counter()
    env = await agent_for(case, server).run("q")
    assert env.payload == "ok", env.error
    assert time.perf_counter() - start >= 0.4  # the date has one-second resolution
    assert len(server.requests) == 2


async def test_retry_after_ms(case: Case, server: WireServer) -> None:
    if case.name == "google":
        return
    error = with_headers(server.dialect.error(429, "x"), {"retry-after-ms": "400"})
    server.push(error, "ok")
    start = time.perf_counter()
    env = await agent_for(case, server, retry_delay=5.0).run("q")
    assert env.payload == "ok", env.error
    assert 0.4 <= time.perf_counter() - start < 3.0


async def test_x_should_retry_wins_over_the_status(case: Case, server: WireServer) -> None:
    # guarantee 207
    if case.name == "google":
        return
    no = with_headers(server.dialect.error(500, "do not retry"), {"x-should-retry": "false"})
    server.push(no)
    env = await agent_for(case, server).run("q")
    assert env.error is not None and env.error.retryable is False
    assert len(server.requests) == 1
    yes = with_headers(server.dialect.error(400, "retry me"), {"x-should-retry": "true"})
    server.push(yes, "ok")
    env = await agent_for(case, server).run("q")
    assert env.payload == "ok", env.error
    assert len(server.requests) == 3


async def test_long_wait_ends_the_step_with_retry_at(case: Case, server: WireServer) -> None:
    # guarantee 208
    server.push(server.dialect.error(429, "quota", retry_after=3600))
    agent = agent_for(case, server)
    start = time.perf_counter()
    env = await agent.run("q")
    assert time.perf_counter() - start < 5
    assert env.error is not None and env.error.type == "ModelRateLimitError"
    assert env.error.retryable
    assert "retry_at" in env.error.message and "max_retry_wait=60.0" in env.error.message
    assert abs(env.metadata["retry_at"] - (time.time() + 3600)) < 30
    assert len(server.requests) == 1
    assert server.remaining == 0
    # the typed error, with retry_at, reaches a stream consumer
    server.push(server.dialect.error(429, "quota", retry_after=3600))
    try:
        async for _ in agent.stream("q"):
            pass
    except ModelRateLimitError as exc:
        assert exc.retry_after == 3600
        assert exc.retry_at is not None and abs(exc.retry_at - (time.time() + 3600)) < 30
    else:
        raise AssertionError("no error")


async def test_max_retry_wait_is_configurable(case: Case, server: WireServer) -> None:
    server.push(server.dialect.error(429, "wait", retry_after=0.5), "never")
    env = await agent_for(case, server, max_retry_wait=0.1).run("q")
    assert env.error is not None and env.error.type == "ModelRateLimitError"
    assert len(server.requests) == 1


async def test_anthropic_long_output_cap_works_without_stream(
    case: Case, server: WireServer
) -> None:
    # guarantee 209: the SDK refuses a non-streamed request this large; run() streams it
    if case.name != "anthropic":
        return
    provider = AnthropicProvider(base_url=server.base_url, api_key="k", max_tokens=32000)
    engine = LLMEngine(case.model, provider=provider)
    server.engines.append(engine)
    server.push("long answer")
    env = await Agent(engine=engine).run("q")
    assert env.payload == "long answer", env.error
    body = server.requests[0].json()
    assert body["stream"] is True and body["max_tokens"] == 32000
    # a long answer may take longer than request_timeout in all: only silence counts
    slow = LLMEngine(case.model, provider=provider, request_timeout=0.5, max_retries=0)
    server.engines.append(slow)
    server.push(Reply(text="one two three four five six seven", chunk_delay=0.2))
    env = await Agent(engine=slow).run("q")
    assert env.payload == "one two three four five six seven", env.error


async def test_gemini_retry_delay_in_body(case: Case, server: WireServer) -> None:
    if case.name != "google":
        return
    body = {
        "error": {
            "code": 429,
            "message": "quota",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.8s"}
            ],
        }
    }
    server.push(Respond(status=429, body=body), "ok")
    start = time.perf_counter()
    env = await agent_for(case, server).run("q")
    assert env.payload == "ok", env.error
    assert time.perf_counter() - start >= 0.8
