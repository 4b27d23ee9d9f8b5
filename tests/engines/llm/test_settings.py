"""LLMEngine's configuration is one frozen LLMSettings; routing lives in the provider registry."""

from __future__ import annotations

import dataclasses

import pytest

from stepstone import LLMEngine, NativeTool
from stepstone.engines.llm import CacheConfig, LLMSettings
from stepstone.engines.llm._routing import ProviderRouting
from stepstone.providers import _registry
from stepstone.testing import FakeModel


def test_engine_attributes_read_the_frozen_settings() -> None:
    engine = LLMEngine(
        "gpt-4o", max_turns=7, cache=True, native_tools=["web_search"], tool_timeout=2.5
    )
    settings = engine.settings
    assert isinstance(settings, LLMSettings)
    assert (settings.model, settings.provider) == ("gpt-4o", "openai")
    assert settings.cache == CacheConfig(enabled=True)
    assert settings.native_tools == (NativeTool.WEB_SEARCH,)
    assert (engine.max_turns, engine.tool_timeout, engine.cache) == (7, 2.5, settings.cache)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_turns = 1  # type: ignore[misc]


def test_assigning_an_engine_setting_is_refused_and_names_the_fix() -> None:
    engine = LLMEngine("claude-sonnet-4-6", max_turns=4)
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"LLMEngine\(\.\.\., max_turns=9\)"):
        engine.max_turns = 9
    assert engine.max_turns == 4
    engine.native_tools.append(NativeTool.WEB_FETCH)  # a copy: the settings do not change
    assert engine.native_tools == []


def test_settings_from_arguments_checks_like_the_engine() -> None:
    settings = LLMSettings.from_arguments("claude-sonnet-4-6", max_turns=3)
    assert settings == LLMEngine("claude-sonnet-4-6", max_turns=3).settings
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        LLMSettings.from_arguments("claude-sonnet-4-6", max_turns=0)
    with pytest.raises(TypeError, match="usage_limits must be a UsageLimits"):
        LLMSettings.from_arguments("claude-sonnet-4-6", usage_limits={"max_requests": 1})  # type: ignore[arg-type]


def test_a_provider_instance_is_kept_by_the_engine_not_the_settings() -> None:
    model = FakeModel(["x"], model_name="scripted-1")
    engine = LLMEngine(model)
    assert (engine.settings.model, engine.settings.provider) == ("scripted-1", "test")
    assert engine.get_provider() is model


def test_routing_lives_in_the_provider_registry(
    routing: type[ProviderRouting],
) -> None:  # guarantee 84
    before = _registry.routing_table()
    LLMEngine.register_provider_rule("acme-", "openai", kind="startswith")
    LLMEngine.register_provider_alias("Acme-Exact", "google")
    after = _registry.routing_table()
    assert after is not before  # a new table; the old one is unchanged
    assert ("startswith", "acme-", "openai") not in before.rules
    assert after.rules[0] == ("startswith", "acme-", "openai")
    assert _registry.route_model("ACME-7b") == "openai"
    assert _registry.route_model("acme-exact") == "google"
    assert LLMEngine("acme-7b").provider == "openai"
    assert ProviderRouting._PROVIDER_DEFAULT == "anthropic"
    LLMEngine.set_default_provider(None)
    assert _registry.routing_table().default is None
    with pytest.raises(ValueError, match="no provider rule matches model 'zeta-1'"):
        _registry.route_model("zeta-1")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("max_turns", "3", "max_turns must be an int, got '3' (str)"),
        ("max_turns", True, "max_turns must be an int, got True (bool)"),
        ("max_retries", 2.0, "max_retries must be an int, got 2.0 (float)"),
        ("retry_delay", "1", "retry_delay must be a number, got '1' (str)"),
        ("tool_timeout", "5", "tool_timeout must be a number or None, got '5' (str)"),
        ("stream_idle_timeout", "x", "stream_idle_timeout must be a number or None"),
        ("max_parallel_tools", [4], "max_parallel_tools must be an int or None"),
        ("system", 3, "system must be a str or None, got 3"),
    ],
)
def test_options_of_the_wrong_type_are_named(option: str, value: object, message: str) -> None:
    # guarantee 76
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        LLMEngine("claude-sonnet-4-6", **{option: value})  # type: ignore[arg-type]
    assert isinstance(err.value, ValueError)  # a ConfigurationTypeError: both


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("retry_delay", -1, "retry_delay must be >= 0, got -1"),
        ("retry_delay", float("nan"), "retry_delay must be >= 0, got nan"),
        ("temperature", -0.5, "temperature must be >= 0 or None, got -0.5"),
        ("request_timeout", 0, "request_timeout must be > 0 or None, got 0"),
    ],
)
def test_options_out_of_range_are_named(option: str, value: object, message: str) -> None:
    # guarantee 76
    with pytest.raises(ValueError, match=message):
        LLMEngine("claude-sonnet-4-6", **{option: value})  # type: ignore[arg-type]
