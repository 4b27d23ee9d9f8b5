"""LLMEngine construction: signature, defaults, validation, routing (guarantee 76-84)."""

from __future__ import annotations

import inspect
import threading
import warnings

import pytest

from stepstone import Agent, ConfigurationError, LLMEngine, NativeTool, UserError
from stepstone.engines.llm import DEFAULT_STREAM_IDLE_TIMEOUT, CacheConfig, ThinkingConfig
from stepstone.engines.llm._routing import ProviderRouting
from stepstone.testing import FakeModel


def test_signature_and_defaults() -> None:
    params = inspect.signature(LLMEngine.__init__).parameters
    expected = {
        "provider": None,
        "thinking": False,
        "max_turns": 20,
        "tool_choice": "auto",
        "temperature": None,
        "system": None,
        "native_tools": None,
        "allow_dangerous_native_tools": False,
        "max_retries": 3,
        "retry_delay": 1.0,
        "request_timeout": 120.0,
        "max_parallel_tools": 8,
        "max_tool_calls_per_turn": None,
        "tool_timeout": None,
        "stream_buffer": 64,
        "cache": False,
        "strict_multimodal": False,
    }
    for name, default in expected.items():
        assert params[name].default == default, name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    engine = LLMEngine("claude-sonnet-4-6")
    assert engine.stream_idle_timeout == DEFAULT_STREAM_IDLE_TIMEOUT == 90.0
    assert engine.provider == "anthropic"
    assert engine.cache is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_parallel_tools": 0}, "max_parallel_tools must be >= 1 or None"),
        ({"max_tool_calls_per_turn": 0}, "max_tool_calls_per_turn must be >= 1 or None"),
        ({"tool_timeout": 0}, "tool_timeout must be > 0 or None"),
        ({"tool_timeout": -1.0}, "tool_timeout must be > 0 or None"),
        ({"stream_idle_timeout": 0}, "stream_idle_timeout must be > 0 or None"),
        ({"stream_idle_timeout": -5.0}, "stream_idle_timeout must be > 0 or None"),
        ({"stream_buffer": 0}, "stream_buffer must be >= 1"),
        ({"tool_choice": "parallel"}, "tool_choice='parallel'"),
    ],
)
def test_value_errors(kwargs: dict[str, object], message: str) -> None:  # guarantee 76
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LLMEngine("claude-sonnet-4-6", **kwargs)  # type: ignore[arg-type]


def test_parallel_tool_choice_message_says_what_to_do() -> None:  # guarantee 76
    with pytest.raises(ValueError) as info:
        LLMEngine("gpt-4o", tool_choice="parallel")  # type: ignore[arg-type]
    assert "Concurrent tool execution is the default" in str(info.value)
    assert "'auto' / 'any'" in str(info.value)


def test_stream_idle_none_warns_once_at_init() -> None:  # guarantee 77
    with pytest.warns(UserWarning, match="disables stream stall detection") as record:
        engine = LLMEngine("claude-sonnet-4-6", stream_idle_timeout=None)
    assert len(record) == 1
    assert engine.stream_idle_timeout is None
    # the default and explicit floats do not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LLMEngine("claude-sonnet-4-6")
        assert LLMEngine("claude-sonnet-4-6", stream_idle_timeout=3.5).stream_idle_timeout == 3.5


@pytest.mark.parametrize(
    "tool", [NativeTool.CODE_EXECUTION, NativeTool.COMPUTER_USE, "code_execution"]
)
def test_dangerous_native_tools_need_opt_in(tool: NativeTool | str) -> None:  # guarantee 82
    with pytest.raises(ValueError, match="allow_dangerous_native_tools=True"):
        LLMEngine("claude-sonnet-4-6", native_tools=[tool])
    engine = LLMEngine("claude-sonnet-4-6", native_tools=[tool], allow_dangerous_native_tools=True)
    assert engine.native_tools == [NativeTool(tool)]


def test_safe_native_tools_need_no_opt_in() -> None:  # guarantee 82
    engine = LLMEngine("gpt-4o", native_tools=["web_search", NativeTool.FILE_SEARCH])
    assert engine.native_tools == [NativeTool.WEB_SEARCH, NativeTool.FILE_SEARCH]
    with pytest.raises(ValueError):
        LLMEngine("gpt-4o", native_tools=["teleport"])


def test_cache_and_thinking_forms() -> None:
    assert LLMEngine("claude-sonnet-4-6", cache=True).cache == CacheConfig()
    cfg = CacheConfig(ttl="1h")
    assert LLMEngine("claude-sonnet-4-6", cache=cfg).cache is cfg
    with pytest.raises(TypeError):
        LLMEngine("claude-sonnet-4-6", cache="yes")  # type: ignore[arg-type]
    thinking = ThinkingConfig(budget_tokens=2048)
    assert LLMEngine("claude-sonnet-4-6", thinking=thinking).thinking is thinking


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("claude-sonnet-4-6", "anthropic"),
        ("claude-opus-4-7", "anthropic"),
        ("gpt-4o", "openai"),
        ("o3-mini", "openai"),
        ("gemini-2.5-flash", "google"),
        ("grok-2", "anthropic"),  # the default provider catches the rest
    ],
)
def test_provider_inference(model: str, provider: str) -> None:
    assert LLMEngine(model).provider == provider


@pytest.mark.parametrize("bare", ["anthropic", "openai", "google", "Anthropic"])
def test_bare_provider_alias_is_rejected_with_both_fixes(bare: str) -> None:  # guarantee 83
    with pytest.raises(ValueError) as info:
        LLMEngine(bare)
    text = str(info.value)
    assert "is a provider name, not a model id" in text
    assert f'Agent.from_provider({bare!r}, tier="medium")' in text
    assert 'Agent(engine=LLMEngine("<model-id>"))' in text


def test_tier_alias_with_explicit_provider_is_allowed() -> None:  # guarantee 83
    engine = LLMEngine("medium", provider="anthropic")
    assert engine.provider == "anthropic"
    assert engine.wire_model == "claude-sonnet-4-6"
    agent = Agent.from_provider("openai", tier="cheap", max_turns=3)
    assert isinstance(agent.engine, LLMEngine)
    assert agent.engine.wire_model == "gpt-5-nano"
    assert agent.engine.max_turns == 3
    assert Agent.from_provider("google").engine.wire_model == "gemini-2.5-flash"  # type: ignore[attr-defined]


def test_default_provider_none_makes_unknown_models_raise(
    routing: type[ProviderRouting],
) -> None:  # guarantee 83
    LLMEngine.set_default_provider(None)
    with pytest.raises(ValueError, match="no provider rule matches model 'grok-2'"):
        LLMEngine("grok-2")
    with pytest.raises(ValueError):
        Agent("grok-2")
    assert LLMEngine("claude-sonnet-4-6").provider == "anthropic"  # rules still route
    LLMEngine.set_default_provider("openai")
    assert LLMEngine("grok-2").provider == "openai"


def test_new_rules_win_and_aliases_register(routing: type[ProviderRouting]) -> None:  # guarantee 84
    assert LLMEngine("claude-opus-5-20260701").provider == "anthropic"
    LLMEngine.register_provider_rule("claude-opus-5", "openai")
    assert LLMEngine("claude-opus-5-20260701").provider == "openai"
    LLMEngine.register_provider_rule("claude", "google", kind="startswith")
    assert LLMEngine("claude-opus-5-20260701").provider == "google"  # newest first
    LLMEngine.register_provider_alias("Mistral", "mistral")
    assert LLMEngine.provider_aliases()["mistral"] == "mistral"
    with pytest.raises(ValueError, match="provider name"):
        LLMEngine("mistral")  # a self-alias is a bare provider name
    with pytest.raises(ValueError, match="kind must be"):
        LLMEngine.register_provider_rule("x", "openai", kind="endswith")  # type: ignore[arg-type]


def test_provider_aliases_returns_a_copy(routing: type[ProviderRouting]) -> None:  # guarantee 84
    aliases = LLMEngine.provider_aliases()
    aliases["hacked"] = "openai"
    aliases["anthropic"] = "openai"
    fresh = LLMEngine.provider_aliases()
    assert "hacked" not in fresh
    assert fresh["anthropic"] == "anthropic"


def test_registration_is_thread_safe(routing: type[ProviderRouting]) -> None:  # guarantee 84
    barrier = threading.Barrier(8)

    def register(n: int) -> None:
        barrier.wait()
        for i in range(50):
            LLMEngine.register_provider_alias(f"m-{n}-{i}", "openai")
            LLMEngine.register_provider_rule(f"r-{n}-{i}", "openai")

    threads = [threading.Thread(target=register, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    aliases = LLMEngine.provider_aliases()
    patterns = {p for _, p, _ in ProviderRouting._PROVIDER_RULES}
    for n in range(8):
        for i in range(50):
            assert f"m-{n}-{i}" in aliases
            assert f"r-{n}-{i}" in patterns


def test_provider_instance_is_used_as_is() -> None:
    model = FakeModel(["x"], model_name="scripted-1")
    engine = LLMEngine(model)
    assert engine.get_provider() is model
    assert (engine.model, engine.provider) == ("scripted-1", "test")
    engine = LLMEngine("my-local-model", provider=model)
    assert engine.model == "my-local-model" and engine.get_provider() is model
    with pytest.raises(TypeError):
        LLMEngine(42)  # type: ignore[arg-type]


def test_agent_string_shorthand_passes_options() -> None:
    agent = Agent("gpt-4o", max_turns=4, temperature=0.2)
    assert isinstance(agent.engine, LLMEngine)
    assert (agent.engine.max_turns, agent.engine.temperature) == (4, 0.2)


def test_a_model_no_rule_routes_is_reported_as_unrecognised(
    routing: type[ProviderRouting], monkeypatch: pytest.MonkeyPatch
) -> None:
    """guarantee 435: a model name no alias or rule routes goes to the default provider;
    when that one cannot be used (no API key), the error names the model and the routing
    rules, instead of only asking for an Anthropic key."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigurationError) as info:
        Agent(engine=LLMEngine("llama3-70b"))("hi")
    said = str(info.value)
    assert "no provider recognises model 'llama3-70b'" in said
    assert "claude* -> anthropic" in said and "otherwise anthropic" in said  # the rules
    assert "no API key for anthropic" in said  # why the default could not take it
    assert "register_provider_rule('llama3'" in said  # the fix
    with pytest.raises(UserError) as known:  # a model a rule routes: not "unrecognised"
        Agent(engine=LLMEngine("claude-sonnet-4-6"))("hi")
    assert not isinstance(known.value, ConfigurationError)
    assert "recognises" not in str(known.value)
