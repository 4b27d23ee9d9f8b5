"""Model providers: the Provider interface, neutral message types, and SDK adapters.

The adapters (``AnthropicProvider``, ``OpenAIProvider``, ``GoogleProvider``) import their
official SDK only when built; a missing SDK raises ``MissingExtraError`` naming the extra
(``pip install stepstone[anthropic]``). Import them from here; attribute access is lazy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepstone.providers._base import (
    ModelRequestsBlockedError,
    Provider,
    RetryInfo,
    requests_blocked,
)
from stepstone.providers._pricing import Price, estimate_cost, price_source, register_price
from stepstone.providers._registry import create_provider, provider_names, register_provider
from stepstone.providers._types import (
    CacheConfig,
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ThinkingConfig,
    ToolCall,
    ToolDefinition,
    ToolResult,
    Usage,
    UsageLimits,
)

if TYPE_CHECKING:
    from stepstone.providers._anthropic import AnthropicProvider
    from stepstone.providers._google import GoogleProvider
    from stepstone.providers._openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "CacheConfig",
    "GoogleProvider",
    "Message",
    "ModelRequest",
    "ModelRequestsBlockedError",
    "ModelResponse",
    "NativeTool",
    "OpenAIProvider",
    "Price",
    "Provider",
    "RetryInfo",
    "ThinkingConfig",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "Usage",
    "UsageLimits",
    "create_provider",
    "estimate_cost",
    "price_source",
    "provider_names",
    "register_price",
    "register_provider",
    "requests_blocked",
]

_LAZY = {
    "AnthropicProvider": "stepstone.providers._anthropic",
    "OpenAIProvider": "stepstone.providers._openai",
    "GoogleProvider": "stepstone.providers._google",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stepstone.providers' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
