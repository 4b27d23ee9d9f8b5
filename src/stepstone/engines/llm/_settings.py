"""LLMEngine's configuration as data: one frozen :class:`LLMSettings`, checked in one place."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Final, Literal, cast

from stepstone.exceptions import ConfigurationError, ConfigurationTypeError
from stepstone.providers._base import Provider
from stepstone.providers._registry import is_provider_name, route_model, routing_table
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
    stream_to: str | None = None
    #: True when no alias or rule named the model's provider: the default one was taken.
    routed_by_default: bool = False

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
        stream_to: str | None = None,
        stacklevel: int = 2,
    ) -> LLMSettings:
        """Check and normalise ``LLMEngine``'s arguments (same names, same defaults).

        ``stacklevel`` places the ``stream_idle_timeout=None`` warning, counted as
        :func:`warnings.warn` would count it in the code that calls this method.
        """
        _check_numbers(
            ("max_turns", max_turns, int, 1, False),
            ("max_retries", max_retries, int, 0, False),
            ("retry_delay", retry_delay, float, 0, False),
            ("max_retry_wait", max_retry_wait, float, 0, False),
            ("continue_on_length", continue_on_length, int, 0, False),
            ("max_parallel_tools", max_parallel_tools, int, 1, True),
            ("max_tool_calls_per_turn", max_tool_calls_per_turn, int, 1, True),
            ("tool_timeout", tool_timeout, float, None, True),
            ("request_timeout", request_timeout, float, None, True),
            ("stream_buffer", stream_buffer, int, 1, False),
            ("temperature", temperature, float, 0, True),
        )
        _check_types(usage_limits, system, stream_to)
        idle = _idle_timeout(stream_idle_timeout, stacklevel + 2)
        _check_tool_choice(tool_choice)
        natives = _native_tools(native_tools, allow_dangerous_native_tools)
        cache_config = _cache(cache)
        model_name, provider_name = _target(model, provider)
        return cls(
            model=model_name,
            provider=provider_name,
            routed_by_default=(
                provider is None and isinstance(model, str) and not routing_table().matches(model)
            ),
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
            stream_to=stream_to,
        )

    @property
    def thinking_config(self) -> ThinkingConfig | None:
        """``thinking`` as the config a request carries (None: thinking off)."""
        if isinstance(self.thinking, ThinkingConfig):
            return self.thinking
        return ThinkingConfig() if self.thinking else None


def _check_types(usage_limits: Any, system: Any, stream_to: Any) -> None:
    """The options that must be of one type (or None): ConfigurationTypeError if not."""
    if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
        raise ConfigurationTypeError(f"usage_limits must be a UsageLimits, got {usage_limits!r}")
    if system is not None and not isinstance(system, str):
        raise ConfigurationTypeError(f"system must be a str or None, got {system!r}")
    if stream_to is not None and (not isinstance(stream_to, str) or not stream_to):
        raise ConfigurationTypeError(
            f"stream_to must be the name of a stream (a non-empty str) or None, got "
            f"{stream_to!r:.80}"
        )


def _check_numbers(*checks: tuple[str, Any, type, float | None, bool]) -> None:
    """Each ``(name, value, int or float, least value, None allowed)``: the value must be a
    number of that kind (an int passes for a float; a bool for neither) and at least the
    least value (None: strictly positive)."""
    for name, value, kind, least, optional in checks:
        if value is None and optional:
            continue
        kinds = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            what = "an int" if kind is int else "a number"
            raise ConfigurationTypeError(
                f"{name} must be {what}{' or None' if optional else ''}, got {value!r} "
                f"({type(value).__name__}); pass the number itself, "
                f"e.g. {name}={2 if kind is int else 2.5}"
            )
        if least is None and not value > 0:
            raise ConfigurationError(
                f"{name} must be > 0{' or None' if optional else ''}, got {value!r}"
            )
        if least is not None and not value >= least:
            raise ConfigurationError(
                f"{name} must be >= {least}{' or None' if optional else ''}, got {value!r}"
            )


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
    _check_numbers(("stream_idle_timeout", value, float, None, True))
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
