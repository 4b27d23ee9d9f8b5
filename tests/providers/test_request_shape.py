"""Request details each provider gets right on the wire: effort values, Gemini's thinking
level, prompt caching of the growing history, and the SDK timeout."""

from __future__ import annotations

from stepstone import Agent, CacheConfig, LLMEngine, ThinkingConfig
from stepstone.providers import AnthropicProvider, GoogleProvider
from stepstone.testing import AnthropicDialect, GoogleDialect, LoopbackServer, call


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_anthropic_effort_minimal_becomes_low() -> None:  # guarantee 218
    with LoopbackServer(AnthropicDialect(), model="claude-sonnet-4-6") as server:
        server.push("ok")
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        engine = LLMEngine(
            "claude-sonnet-4-6", provider=provider, thinking=ThinkingConfig(effort="minimal")
        )
        env = await Agent(engine=engine).run("q")
        await engine.aclose()
    assert env.ok, env.error
    assert server.requests[0].json()["output_config"]["effort"] == "low"


async def test_gemini_effort_is_a_thinking_level() -> None:
    with LoopbackServer(GoogleDialect(), model="gemini-3-pro-preview") as server:
        server.push("ok")
        provider = GoogleProvider(base_url=server.base_url, api_key="k")
        engine = LLMEngine(
            "gemini-3-pro-preview", provider=provider, thinking=ThinkingConfig(effort="high")
        )
        env = await Agent(engine=engine).run("q")
        await engine.aclose()
    assert env.ok, env.error
    config = server.requests[0].json()["generationConfig"]["thinkingConfig"]
    # the API takes proto JSON field names in either spelling; this SDK sends snake_case
    assert config.get("thinkingLevel", config.get("thinking_level")) == "HIGH"
    assert env.metadata["raw_stop_reason"] == "STOP"


async def test_anthropic_cache_covers_the_growing_history() -> None:
    with LoopbackServer(AnthropicDialect(), model="claude-sonnet-4-6") as server:
        server.push(call("add", a=1, b=2), "3")
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        engine = LLMEngine(
            "claude-sonnet-4-6", provider=provider, cache=CacheConfig(ttl="1h"), system="Be exact."
        )
        env = await Agent(engine=engine, tools=[add]).run("1+2?")
        await engine.aclose()
    assert env.payload == "3", env.error
    second = server.requests[1].json()
    breakpoints = [
        block
        for message in second["messages"]
        for block in (message["content"] if isinstance(message["content"], list) else [])
        if "cache_control" in block
    ]
    # only the newest message carries the breakpoint (the API allows four in all)
    assert len(breakpoints) == 1
    assert second["messages"][-1]["content"][-1]["cache_control"]["ttl"] == "1h"
    assert second["system"][0]["cache_control"]["type"] == "ephemeral"
    assert "cache_control" in second["tools"][-1]


async def test_request_timeout_reaches_the_sdk() -> None:
    with LoopbackServer(AnthropicDialect(), model="claude-sonnet-4-6") as server:
        server.push("ok")
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        engine = LLMEngine("claude-sonnet-4-6", provider=provider, request_timeout=42)
        env = await Agent(engine=engine).run("q")
        await engine.aclose()
    assert env.ok, env.error
    # the SDK sends its read timeout with each request
    assert server.requests[0].headers.get("x-stainless-timeout") == "42"
