"""LLMEngine's configuration as data: one frozen :class:`LLMSettings`, checked in one place."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Final, Literal, cast

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError
from stepstone.providers._base import Provider
from stepstone.providers._registry import is_provider_name, route_model
from stepstone.providers._types import CacheConfig, NativeTool, ThinkingConfig, UsageLimits

__all__ = ["DEFAULT_STREAM_IDLE_TIMEOUT", "UNSET", "LLMSettings", "Unset"]

DEFAULT_STREAM_IDLE_TIMEOUT: Final = 90.0
"""Seconds of silence between stream chunks before :class:`StreamStallError`."""

_DANGEROUS: Final = frozenset({NativeTool.CODE_EXECUTION, NativeTool.COMPUTER_USE})


class Unset:
    """Marks "argument not given" where ``None`` has a meaning of its own."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset()


@dataclasses.dataclass(frozen=True, slots=True)
class LLMSettings:
    """Everything an :class:`LLMEngine` was configured with, normalised and checked.

    Build it with :meth:`from_arguments` (what ``LLMEngine(...)`` does), which takes the
    engine's arguments as they are given (``cache=True``, native tools as strings, an
    unset ``stream_idle_timeout``) and raises :class:`ConfigurationError` /
    :class:`ConfigurationTypeError` naming the bad value. ``model`` and ``provider`` are
    names: a provider instance passed to the engine is kept by the engine, not here.
    """

    model: str
    provider: str
    thinking: bool | ThinkingConfig = False
    max_turns: int = 20
    tool_choice: Literal["auto", "any"] = "auto"
    temperature: float | None = None
    system: str | None = None
    native_tools: tuple[NativeTool, ...] = ()
    allow_dangerous_native_tools: bool = False
    max_retries: int = 3
    retry_delay: float = 1.0
    request_timeout: float | None = 120.0
    max_retry_wait: float = 60.0
    usage_limits: UsageLimits | None = None
    continue_on_length: int = 0
    max_parallel_tools: int | None = 8
    max_tool_calls_per_turn: int | None = None
    tool_timeout: float | None = None
    stream_idle_timeout: float | None = DEFAULT_STREAM_IDLE_TIMEOUT
    stream_buffer: int = 64
    cache: CacheConfig | None = None
    strict_multimodal: bool = False

    @classmethod
    def from_arguments(
        cls,
        model: str | Provider,
        *,
        provider: str | Provider | None = None,
        thinking: bool | ThinkingConfig = False,
        max_turns: int = 20,
        tool_choice: Literal["auto", "any"] = "auto",
        temperature: float | None = None,
        system: str | None = None,
        native_tools: list[NativeTool | str] | None = None,
        allow_dangerous_native_tools: bool = False,
        max_retries: int = 3,
        retry_delay: float = 1.0,
        request_timeout: float | None = 120.0,
        max_retry_wait: float = 60.0,
        usage_limits: UsageLimits | None = None,
        continue_on_length: int = 0,
        max_parallel_tools: int | None = 8,
        max_tool_calls_per_turn: int | None = None,
        tool_timeout: float | None = None,
        stream_idle_timeout: float | Unset | None = UNSET,
        stream_buffer: int = 64,
        cache: bool | CacheConfig = False,
        strict_multimodal: bool = False,
        stacklevel: int = 2,
    ) -> LLMSettings:
        """Check and normalise ``LLMEngine``'s arguments (same names, same defaults).

        ``stacklevel`` places the ``stream_idle_timeout=None`` warning, counted as
        :func:`warnings.warn` would count it in the code that calls this method.
        """
        _check_loop(max_turns, max_retries, max_retry_wait, continue_on_length, usage_limits)
        _check_tools(max_parallel_tools, max_tool_calls_per_turn, tool_timeout)
        if request_timeout is not None and request_timeout <= 0:
            raise ConfigurationError(
                f"request_timeout must be > 0 or None, got {request_timeout!r}"
            )
        idle = _idle_timeout(stream_idle_timeout, stacklevel + 2)
        if stream_buffer < 1:
            raise ConfigurationError(f"stream_buffer must be >= 1, got {stream_buffer!r}")
        _check_tool_choice(tool_choice)
        natives = _native_tools(native_tools, allow_dangerous_native_tools)
        cache_config = _cache(cache)
        model_name, provider_name = _target(model, provider)
        return cls(
            model=model_name,
            provider=provider_name,
            thinking=thinking,
            max_turns=max_turns,
            tool_choice=tool_choice,
            temperature=temperature,
            system=system,
            native_tools=natives,
            allow_dangerous_native_tools=allow_dangerous_native_tools,
            max_retries=max_retries,
            retry_delay=retry_delay,
            request_timeout=request_timeout,
            max_retry_wait=max_retry_wait,
            usage_limits=usage_limits,
            continue_on_length=continue_on_length,
            max_parallel_tools=max_parallel_tools,
            max_tool_calls_per_turn=max_tool_calls_per_turn,
            tool_timeout=tool_timeout,
            stream_idle_timeout=idle,
            stream_buffer=stream_buffer,
            cache=cache_config,
            strict_multimodal=strict_multimodal,
        )

    @property
    def thinking_config(self) -> ThinkingConfig | None:
        """``thinking`` as the config a request carries (None: thinking off)."""
        if isinstance(self.thinking, ThinkingConfig):
            return self.thinking
        return ThinkingConfig() if self.thinking else None


def _check_loop(
    max_turns: int,
    max_retries: int,
    max_retry_wait: float,
    continue_on_length: int,
    usage_limits: UsageLimits | None,
) -> None:
    if max_turns < 1:
        raise ConfigurationError(f"max_turns must be >= 1, got {max_turns!r}")
    if max_retries < 0:
        raise ConfigurationError(f"max_retries must be >= 0, got {max_retries!r}")
    if max_retry_wait < 0:
        raise ConfigurationError(f"max_retry_wait must be >= 0, got {max_retry_wait!r}")
    if continue_on_length < 0:
        raise ConfigurationError(f"continue_on_length must be >= 0, got {continue_on_length!r}")
    if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
        raise ConfigurationTypeError(f"usage_limits must be a UsageLimits, got {usage_limits!r}")


def _check_tools(
    max_parallel_tools: int | None, max_tool_calls_per_turn: int | None, tool_timeout: float | None
) -> None:
    if max_parallel_tools is not None and max_parallel_tools < 1:
        raise ConfigurationError(
            f"max_parallel_tools must be >= 1 or None, got {max_parallel_tools!r}"
        )
    if max_tool_calls_per_turn is not None and max_tool_calls_per_turn < 1:
        raise ConfigurationError(
            f"max_tool_calls_per_turn must be >= 1 or None, got {max_tool_calls_per_turn!r}"
        )
    if tool_timeout is not None and tool_timeout <= 0:
        raise ConfigurationError(f"tool_timeout must be > 0 or None, got {tool_timeout!r}")


def _idle_timeout(value: float | Unset | None, stacklevel: int) -> float | None:
    if isinstance(value, Unset):
        return DEFAULT_STREAM_IDLE_TIMEOUT
    if value is None:
        warnings.warn(
            "LLMEngine(stream_idle_timeout=None) disables stream stall detection. A "
            "half-open provider stream (a TCP reset never delivered, a dropped HTTP/2 "
            "PING) will then pin a worker indefinitely. The safe default is "
            f"{DEFAULT_STREAM_IDLE_TIMEOUT}s; pass a positive float to tune it instead "
            "of disabling it.",
            UserWarning,
            stacklevel=stacklevel,
        )
        return None
    if value <= 0:
        raise ConfigurationError(f"stream_idle_timeout must be > 0 or None, got {value!r}")
    return float(value)


def _check_tool_choice(tool_choice: str) -> None:
    if cast(Any, tool_choice) == "parallel":
        raise ConfigurationError(
            "LLMEngine(tool_choice='parallel') was removed. Concurrent tool execution is "
            "the default and cannot be disabled; drop the argument (or use 'auto' / "
            "'any')."
        )
    if tool_choice not in ("auto", "any"):
        raise ConfigurationError(f"tool_choice must be 'auto' or 'any', got {tool_choice!r}")


def _native_tools(
    native_tools: list[NativeTool | str] | None, allow_dangerous: bool
) -> tuple[NativeTool, ...]:
    resolved = tuple(NativeTool(t) for t in (native_tools or []))
    found = [t for t in resolved if t in _DANGEROUS]
    if found and not allow_dangerous:
        raise ConfigurationError(
            f"Native tools {[t.value for t in found]!r} require explicit opt-in "
            "because they grant the model code-execution or computer-control "
            "capabilities. Pass allow_dangerous_native_tools=True to confirm."
        )
    return resolved


def _cache(cache: bool | CacheConfig | None) -> CacheConfig | None:
    if cache is True:
        return CacheConfig(enabled=True)
    if cache is False or cache is None:
        return None
    if isinstance(cache, CacheConfig):
        return cache
    raise ConfigurationTypeError(f"cache must be a bool or a CacheConfig, got {cache!r}")


def _target(model: str | Provider, provider: str | Provider | None) -> tuple[str, str]:
    """The model and provider names the engine's arguments select."""
    if isinstance(model, Provider):
        return model.model or model.name, model.name
    if isinstance(provider, Provider):
        return model, provider.name
    if not isinstance(model, str):
        raise ConfigurationTypeError(
            f"LLMEngine(model=...) takes a str or a Provider, got {model!r}"
        )
    provider_name = provider or route_model(model)
    if provider is None and is_provider_name(model):
        raise ConfigurationError(
            f"LLMEngine({model!r}) is ambiguous: {model!r} is a provider name, not a "
            f"model id. At request time the provider would be asked for the literal "
            f"model {model!r} and reject it.\n"
            f"  Fix (tier alias, tracks the provider's lineup):\n"
            f'      Agent.from_provider({model!r}, tier="medium")\n'
            f"  Fix (pinned model id):\n"
            f'      Agent(engine=LLMEngine("<model-id>"))   # e.g. "claude-sonnet-4-6"'
        )
    return model, provider_name
