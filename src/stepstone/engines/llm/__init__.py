"""The LLM engine: the model ↔ tool-call loop, its knobs, and the effect seam."""

from stepstone.engines.llm._effects import (
    EffectHandler,
    EffectKey,
    PassThroughEffects,
    current_call_key,
)
from stepstone.engines.llm._engine import (
    DEFAULT_STREAM_IDLE_TIMEOUT,
    LLMEngine,
    LLMSettings,
    last_stream_result,
)
from stepstone.providers._types import CacheConfig, NativeTool, ThinkingConfig, UsageLimits

__all__ = [
    "DEFAULT_STREAM_IDLE_TIMEOUT",
    "CacheConfig",
    "EffectHandler",
    "EffectKey",
    "LLMEngine",
    "LLMSettings",
    "NativeTool",
    "PassThroughEffects",
    "ThinkingConfig",
    "UsageLimits",
    "current_call_key",
    "last_stream_result",
]
