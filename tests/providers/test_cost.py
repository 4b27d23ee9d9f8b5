"""Usage counted the same way on every provider, priced with cache rates, and budgets that
stop a run before the request that would go over them."""

from __future__ import annotations

from typing import Any

import pytest

from stepstone import Agent, LLMEngine, UsageLimitExceeded, UsageLimits
from stepstone.providers import Usage, estimate_cost, price_source, register_price
from stepstone.testing import Reply, call
from tests.providers.conftest import Case, WireServer

MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "google": "gemini-2.5-flash"}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_for(case: Case, server: WireServer, **options: Any) -> Agent:
    engine = LLMEngine(MODELS[case.name], provider=case.provider(server.base_url), **options)
    server.engines.append(engine)
    return Agent(engine=engine, tools=[add])


async def test_cached_usage_is_normalised_and_priced(case: Case, server: WireServer) -> None:
    # guarantee 212
    if case.name == "openai":
        usage = Usage(input_tokens=10_000, cache_read_tokens=9_000, output_tokens=100)
        # gpt-4o: $2.50 uncached, $1.25 cached input, $10 output per million
        expected = (1_000 * 2.5 + 9_000 * 1.25 + 100 * 10) / 1e6
    elif case.name == "anthropic":
        usage = Usage(
            input_tokens=12_000,
            cache_read_tokens=10_000,
            cache_write_tokens=2_000,
            output_tokens=100,
        )
        # claude-sonnet-4-6: $0.30 cache read, $3.75 cache write (5 min), $15 output
        expected = (10_000 * 0.3 + 2_000 * 3.75 + 100 * 15) / 1e6
    else:
        usage = Usage(input_tokens=10_000, cache_read_tokens=8_000, output_tokens=100)
        expected = None  # checked against the table below
    server.push(Reply(text="ok", usage=usage))
    env = await agent_for(case, server).run("q")
    assert env.ok, env.error
    md = env.metadata
    # input_tokens counts every input token on every provider (Anthropic reports uncached)
    assert md["input_tokens"] == usage.input_tokens
    assert md["usage"]["cache_read_tokens"] == usage.cache_read_tokens
    assert md["usage"]["cache_write_tokens"] == usage.cache_write_tokens
    assert md["usage"]["requests"] == 1
    if expected is None:
        expected = estimate_cost(MODELS[case.name], Usage(**md["usage"]), case.name)
        uncached = estimate_cost(MODELS[case.name], Usage(input_tokens=10_000, output_tokens=100))
        assert expected is not None and uncached is not None and expected < uncached
    assert md["cost_usd"] == pytest.approx(expected, rel=1e-6)


def test_price_sources() -> None:
    assert price_source("gpt-4o", "openai") == "genai-prices"
    assert price_source("llama3.2", "ollama") is None  # a local model is not guessed at
    assert estimate_cost("llama3.2", Usage(input_tokens=10), "ollama") is None
    register_price("house-model", 1.0, 2.0)
    assert price_source("house-model-v2", "ollama") == "registered"
    assert estimate_cost("house-model-v2", Usage(input_tokens=1_000_000), "ollama") == 1.0
    # no cache price registered: cached usage is unknown, not priced as if uncached
    assert estimate_cost("house-model", Usage(input_tokens=10, cache_read_tokens=5)) is None
    register_price("house-cached", 1.0, 2.0, cache_read_per_mtok=0.1, cache_write_per_mtok=1.5)
    cost = estimate_cost(
        "house-cached",
        Usage(input_tokens=3_000_000, cache_read_tokens=1_000_000, cache_write_tokens=1_000_000),
    )
    assert cost == pytest.approx(1.0 + 0.1 + 1.5)
    with pytest.raises(ValueError, match="input_per_mtok"):
        register_price("bad", -1.0, 1.0)


async def test_request_budget_stops_before_the_next_request(
    case: Case, server: WireServer
) -> None:  # guarantee 213
    server.push(call("add", a=1, b=1), call("add", a=2, b=2), "never requested")
    env = await agent_for(case, server, usage_limits=UsageLimits(max_requests=2)).run("q")
    assert env.error is not None and env.error.type == "UsageLimitExceeded"
    assert "max_requests=2" in env.error.message
    assert len(server.requests) == 2
    assert env.metadata["usage"]["requests"] == 2


async def test_token_budget(case: Case, server: WireServer) -> None:
    # guarantee 213, 410
    big = Usage(input_tokens=600, output_tokens=50)
    server.push(Reply(tool_calls=[call("add", a=1, b=1)], usage=big), "never requested")
    limits = UsageLimits(max_total_tokens=500)
    with pytest.raises(UsageLimitExceeded) as info:
        async for _ in agent_for(case, server, usage_limits=limits).stream("q"):
            pass
    assert (info.value.limit, info.value.value, info.value.maximum) == (
        "max_total_tokens",
        650,
        500,
    )
    assert len(server.requests) == 1


async def test_cost_budget(case: Case, server: WireServer) -> None:
    costly = Usage(input_tokens=1_000_000, output_tokens=10)
    server.push(Reply(tool_calls=[call("add", a=1, b=1)], usage=costly), "never requested")
    env = await agent_for(case, server, usage_limits=UsageLimits(max_cost_usd=0.01)).run("q")
    assert env.error is not None and env.error.type == "UsageLimitExceeded"
    assert "max_cost_usd=0.01" in env.error.message
    assert len(server.requests) == 1


async def test_cost_budget_with_an_unknown_price_sends_nothing(
    case: Case, server: WireServer
) -> None:
    engine = LLMEngine(
        "no-such-model-xyz",
        provider=case.provider(server.base_url),
        usage_limits=UsageLimits(max_cost_usd=1.0),
    )
    server.engines.append(engine)
    env = await Agent(engine=engine).run("q")
    assert env.error is not None and "price of model 'no-such-model-xyz' is unknown" in (
        env.error.message
    )
    assert server.requests == []


def test_usage_limits_validate() -> None:
    with pytest.raises(ValueError, match="max_requests=-1"):
        UsageLimits(max_requests=-1)
    with pytest.raises(TypeError, match="UsageLimits"):
        LLMEngine("gpt-4o", usage_limits={"max_requests": 1})  # type: ignore[arg-type]
