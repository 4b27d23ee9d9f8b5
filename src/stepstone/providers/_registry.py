"""Provider factories by name; the built-in adapters import their SDK only when built."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stepstone.exceptions import UserError
from stepstone.providers._base import Provider

__all__ = ["create_provider", "provider_names", "register_provider"]

ProviderFactory = Callable[..., Provider]

_lock = threading.Lock()
_factories: dict[str, ProviderFactory] = {}


def _anthropic(**kwargs: Any) -> Provider:
    from stepstone.providers._anthropic import AnthropicProvider

    return AnthropicProvider(**kwargs)


def _openai(**kwargs: Any) -> Provider:
    from stepstone.providers._openai import OpenAIProvider

    return OpenAIProvider(**kwargs)


def _google(**kwargs: Any) -> Provider:
    from stepstone.providers._google import GoogleProvider

    return GoogleProvider(**kwargs)


def _ollama(**kwargs: Any) -> Provider:
    from stepstone.providers._openai import OpenAIProvider

    kwargs.setdefault("base_url", "http://localhost:11434/v1")
    kwargs.setdefault("api_key", "ollama")
    return OpenAIProvider(name="ollama", **kwargs)


_BUILTINS: dict[str, ProviderFactory] = {
    "anthropic": _anthropic,
    "openai": _openai,
    "google": _google,
    "ollama": _ollama,
}


def register_provider(name: str, factory: ProviderFactory) -> None:
    """Register (or replace) the factory that builds provider ``name``.

    Example::

        register_provider("vllm", lambda **kw: OpenAIProvider(
            name="vllm", base_url="http://gpu-box:8000/v1", api_key="none", **kw))
        LLMEngine.register_provider_rule("meta-llama/", "vllm", kind="startswith")
    """
    with _lock:
        _factories[name] = factory


def provider_names() -> list[str]:
    """Every provider name a model can be routed to."""
    with _lock:
        return sorted({*_BUILTINS, *_factories})


def create_provider(name: str, **kwargs: Any) -> Provider:
    """Build provider ``name`` (raises MissingExtraError when its SDK is missing)."""
    with _lock:
        factory = _factories.get(name) or _BUILTINS.get(name)
    if factory is None:
        raise UserError(
            f"unknown provider {name!r}; known: {', '.join(provider_names())}. Register one "
            "with stepstone.providers.register_provider(name, factory)"
        )
    return factory(**kwargs)
