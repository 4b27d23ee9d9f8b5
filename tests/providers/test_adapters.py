"""Provider-specific wire details: thinking, caching, native tools, compatible servers,
request blocking, missing extras (guarantee 82 on the wire)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepstone import Agent, LLMEngine, NativeTool, UserError
from stepstone.engines.llm import CacheConfig, ThinkingConfig
from stepstone.providers import (
    AnthropicProvider,
    GoogleProvider,
    ModelRequestsBlockedError,
    OpenAIProvider,
    Provider,
)
from stepstone.testing import (
    AnthropicDialect,
    GoogleDialect,
    LoopbackServer,
    OpenAIDialect,
    Reply,
    call,
)


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@pytest.fixture
async def closing() -> AsyncIterator[list[Provider]]:
    providers: list[Provider] = []
    yield providers
    for p in providers:
        await p.aclose()


async def run_one(
    server: LoopbackServer,
    provider: Provider,
    closing: list[Provider],
    model: str,
    *items: Any,
    stream: bool = False,
    **options: Any,
) -> list[dict[str, Any]]:
    closing.append(provider)
    server.push(*items)
    agent = Agent(engine=LLMEngine(model, provider=provider, **options), tools=[add])
    if stream:
        [t async for t in agent.stream("q")]
    else:
        env = await agent.run("q")
        assert env.ok, env.error
    return [r.json() for r in server.requests]


async def test_anthropic_thinking_is_replayed_with_its_signature(closing: list[Provider]) -> None:
    with LoopbackServer(AnthropicDialect()) as server:
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        items = (Reply(thinking="let me think", tool_calls=[call("add", a=1, b=2)]), "3")
        for stream in (False, True):
            server.requests.clear()
            first, second = await run_one(
                server, provider, closing, "claude-sonnet-4-6", *items, stream=stream, thinking=True
            )
            assert first["thinking"] == {"type": "adaptive"}
            assert first["max_tokens"] == 16000
            replayed = second["messages"][1]["content"]
            assert replayed[0] == {
                "type": "thinking",
                "thinking": "let me think",
                "signature": "sig",
            }
            assert replayed[1]["type"] == "tool_use"


async def test_anthropic_thinking_budget_and_forced_tools(closing: list[Provider]) -> None:
    with LoopbackServer(AnthropicDialect()) as server:
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        (body,) = await run_one(
            server,
            provider,
            closing,
            "claude-sonnet-4-6",
            "ok",
            thinking=ThinkingConfig(budget_tokens=2048, display="omitted"),
            tool_choice="any",
            temperature=0.5,
        )
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}
        # thinking only allows "auto"; temperature is not sent with thinking
        assert body["tool_choice"] == {"type": "auto"}
        assert "temperature" not in body


async def test_anthropic_prompt_caching(closing: list[Provider]) -> None:
    with LoopbackServer(AnthropicDialect()) as server:
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        (body,) = await run_one(
            server, provider, closing, "claude-sonnet-4-6", "ok", system="Long prompt.", cache=True
        )
        assert body["system"] == [
            {
                "type": "text",
                "text": "Long prompt.",
                "cache_control": {"type": "ephemeral", "ttl": "5m"},
            }
        ]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
        server.requests.clear()
        (body,) = await run_one(
            server,
            provider,
            closing,
            "claude-sonnet-4-6",
            "ok",
            system="S",
            cache=CacheConfig(ttl="1h"),
        )
        assert body["system"][0]["cache_control"]["ttl"] == "1h"


async def test_anthropic_native_tools(closing: list[Provider]) -> None:  # guarantee 82
    with LoopbackServer(AnthropicDialect()) as server:
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        (body,) = await run_one(
            server,
            provider,
            closing,
            "claude-sonnet-4-6",
            "ok",
            native_tools=[NativeTool.WEB_SEARCH, NativeTool.CODE_EXECUTION],
            allow_dangerous_native_tools=True,
        )
        names = [t["name"] for t in body["tools"]]
        assert names == ["add", "web_search", "code_execution"]
        assert body["tools"][1]["type"] == "web_search_20250305"
        server.requests.clear()
        with pytest.warns(UserWarning, match="no native tool 'file_search'"):
            await run_one(
                server, provider, closing, "claude-sonnet-4-6", "ok", native_tools=["file_search"]
            )
        strict = AnthropicProvider(base_url=server.base_url, api_key="k", strict_native_tools=True)
        with pytest.raises(UserError, match="file_search"):
            await run_one(
                server, strict, closing, "claude-sonnet-4-6", "ok", native_tools=["file_search"]
            )


async def test_anthropic_cache_usage_is_read(closing: list[Provider]) -> None:
    from stepstone.testing import Respond

    body = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 10,
            "output_tokens": 2,
            "cache_read_input_tokens": 900,
            "cache_creation_input_tokens": 100,
        },
    }
    with LoopbackServer(AnthropicDialect()) as server:
        provider = AnthropicProvider(base_url=server.base_url, api_key="k")
        closing.append(provider)
        server.push(Respond(body=body))
        env = await Agent(engine=LLMEngine("claude-sonnet-4-6", provider=provider)).run("q")
        assert env.metadata["usage"]["cache_read_tokens"] == 900
        assert env.metadata["usage"]["cache_write_tokens"] == 100


async def test_openai_reasoning_and_native_tools(closing: list[Provider]) -> None:
    with LoopbackServer(OpenAIDialect()) as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="k")
        (body,) = await run_one(
            server,
            provider,
            closing,
            "gpt-5",
            "ok",
            thinking=ThinkingConfig(effort="high"),
            native_tools=["web_search"],
        )
        assert body["reasoning_effort"] == "high"
        assert body["web_search_options"] == {}
        assert body["tools"][0]["function"]["name"] == "add"
        server.requests.clear()
        with pytest.warns(UserWarning, match="no native tool 'web_fetch'"):
            await run_one(server, provider, closing, "gpt-5", "ok", native_tools=["web_fetch"])


async def test_openai_compatible_server_keeps_model_names(closing: list[Provider]) -> None:
    with LoopbackServer(OpenAIDialect(), model="llama3.2") as server:
        local = OpenAIProvider(base_url=server.base_url, api_key="none", name="ollama")
        (body,) = await run_one(server, local, closing, "medium", "ok")
        assert body["model"] == "medium"  # tier aliases are OpenAI's, not a local server's
        assert server.requests[0].path == "/v1/chat/completions"


async def test_google_thinking_and_native_tools(closing: list[Provider]) -> None:
    with LoopbackServer(GoogleDialect()) as server:
        provider = GoogleProvider(base_url=server.base_url, api_key="k")
        (body,) = await run_one(
            server,
            provider,
            closing,
            "gemini-2.5-pro",
            "ok",
            thinking=ThinkingConfig(budget_tokens=1024),
            native_tools=["web_search"],
            tool_choice="any",
        )
        # the SDK copies nested configs with proto field names; the API accepts both spellings
        thinking = body["generationConfig"]["thinkingConfig"]
        assert thinking in (
            {"includeThoughts": True, "thinkingBudget": 1024},
            {"include_thoughts": True, "thinking_budget": 1024},
        )
        assert {"googleSearch": {}} in body["tools"]
        assert body["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"
        assert "gemini-2.5-pro:generateContent" in server.requests[0].path


@pytest.mark.parametrize(
    ("factory", "model"),
    [
        (lambda: AnthropicProvider(api_key="k"), "claude-sonnet-4-6"),
        (lambda: OpenAIProvider(api_key="k"), "gpt-4o"),
        (lambda: GoogleProvider(api_key="k"), "gemini-2.5-flash"),
    ],
)
async def test_real_endpoints_are_blocked(factory: Any, model: str) -> None:
    # the provider conftest blocks model requests for this whole directory
    agent = Agent(engine=LLMEngine(model, provider=factory()))
    with pytest.raises(ModelRequestsBlockedError, match="while model requests are blocked"):
        await agent.run("q")


@pytest.mark.parametrize(
    ("factory", "env_var"),
    [
        (lambda url: AnthropicProvider(base_url=url), "ANTHROPIC_API_KEY"),
        (lambda url: OpenAIProvider(base_url=url), "OPENAI_API_KEY"),
        (lambda url: GoogleProvider(base_url=url), "GOOGLE_API_KEY"),
    ],
)
async def test_missing_api_key_is_a_user_error(
    factory: Any, env_var: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
        "GOOGLE_API_KEY",
        "GEMINI_API_KEY",
    ):
        monkeypatch.delenv(var, raising=False)
    with LoopbackServer(OpenAIDialect()) as server:
        agent = Agent(engine=LLMEngine("some-model", provider=factory(server.base_url)))
        with pytest.raises(UserError, match=env_var):
            await agent.run("q")
        assert server.requests == []


async def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-key-123")
    with LoopbackServer(OpenAIDialect()) as server:
        server.push("ok")
        engine = LLMEngine("gpt-4o", provider=OpenAIProvider(base_url=server.base_url))
        assert (await Agent(engine=engine).run("q")).payload == "ok"
        await engine.aclose()
        assert "env-key-123" in server.requests[0].headers["authorization"]


@pytest.mark.parametrize(
    ("module", "cls", "extra"),
    [
        ("anthropic", "AnthropicProvider", "anthropic"),
        ("openai", "OpenAIProvider", "openai"),
        ("google", "GoogleProvider", "google"),
    ],
)
def test_missing_sdk_names_the_extra(module: str, cls: str, extra: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules[{module!r}] = None  # the SDK is not installed
        from stepstone import Agent, MissingExtraError
        from stepstone.providers import {cls}
        try:
            {cls}()
        except MissingExtraError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"pip install stepstone[{extra}]" in out.stdout


def test_sync_calls_on_fresh_loops_reuse_nothing_stale() -> None:
    # each agent(...) runs on a new event loop; the SDK client must follow it
    with LoopbackServer(OpenAIDialect()) as server:
        server.push("one", "two")
        agent = Agent(
            engine=LLMEngine(
                "gpt-4o", provider=OpenAIProvider(base_url=server.base_url, api_key="k")
            )
        )
        assert agent("a").payload == "one"
        assert agent("b").payload == "two"


def test_missing_api_key_names_the_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepstone.exceptions import UserError
    from stepstone.providers import AnthropicProvider, GoogleProvider, OpenAIProvider

    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for cls, hint in (
        (AnthropicProvider, "ANTHROPIC_API_KEY"),
        (OpenAIProvider, "OPENAI_API_KEY"),
        (GoogleProvider, "GOOGLE_API_KEY or GEMINI_API_KEY"),
    ):
        with pytest.raises(UserError, match=f"set {hint} or pass {cls.__name__}"):
            cls()._build_client()
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    assert GoogleProvider()._resolve_api_key() == "from-env"
