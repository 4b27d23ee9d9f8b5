"""Provider factories by name, and the routing of model names to providers.

The built-in adapters import their SDK only when built. Routing (exact aliases, prefix and
substring rules, a default) is one immutable :class:`RoutingTable` that writers replace
whole under the registry's lock, so a reader never sees a half-written table and two
threads registering at once never lose an entry.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from stepstone.exceptions import ConfigurationError, UserError
from stepstone.providers._base import Provider

__all__ = [
    "RoutingTable",
    "RuleKind",
    "create_provider",
    "is_provider_name",
    "provider_names",
    "register_model_alias",
    "register_model_rule",
    "register_provider",
    "restore_routing",
    "route_model",
    "routing_table",
    "set_default_provider",
]

RuleKind = Literal["contains", "startswith"]

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


# -- model name -> provider routing ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RoutingTable:
    """How a model name picks its provider: an exact alias, then rules (newest first), then
    the default. Immutable: registration builds a new table."""

    # An alias that maps to itself is a bare provider name (rejected as a model id).
    aliases: Mapping[str, str]
    rules: tuple[tuple[RuleKind, str, str], ...]
    default: str | None

    def matches(self, model: str) -> bool:
        """Whether an alias or a rule routes ``model`` (False: only the default would)."""
        key = model.lower()
        return key in self.aliases or any(
            (kind == "startswith" and key.startswith(pattern))
            or (kind == "contains" and pattern in key)
            for kind, pattern, _ in self.rules
        )

    def describe(self) -> str:
        """The rules as one line: ``claude* -> anthropic, ..., otherwise anthropic``."""
        rules = [
            f"{pattern}* -> {provider}" if kind == "startswith" else f"*{pattern}* -> {provider}"
            for kind, pattern, provider in self.rules
        ]
        rest = f"otherwise {self.default}" if self.default else "otherwise an error"
        return ", ".join([*rules, rest])

    def route(self, model: str) -> str:
        """The provider for ``model``; ConfigurationError when nothing matches."""
        key = model.lower()
        if key in self.aliases:
            return self.aliases[key]
        for kind, pattern, provider in self.rules:
            if (kind == "startswith" and key.startswith(pattern)) or (
                kind == "contains" and pattern in key
            ):
                return provider
        if self.default is None:
            raise ConfigurationError(
                f"no provider rule matches model {model!r} and the default provider is "
                f"disabled; pass provider='...', or register a rule: "
                f"LLMEngine.register_provider_rule({model.split('-')[0]!r}, '<provider>', "
                f"kind='startswith')"
            )
        return self.default


_routing = RoutingTable(
    aliases=MappingProxyType({name: name for name in ("anthropic", "openai", "google", "ollama")}),
    rules=(
        ("startswith", "claude", "anthropic"),
        ("startswith", "gpt", "openai"),
        ("startswith", "chatgpt", "openai"),
        ("startswith", "o1", "openai"),
        ("startswith", "o3", "openai"),
        ("startswith", "o4", "openai"),
        ("startswith", "gemini", "google"),
        ("startswith", "models/gemini", "google"),
    ),
    default="anthropic",
)


def routing_table() -> RoutingTable:
    """The current routing table (immutable; later registrations build a new one)."""
    return _routing


def restore_routing(table: RoutingTable) -> None:
    """Put back a table taken with :func:`routing_table` (e.g. after a test)."""
    global _routing
    with _lock:
        _routing = table


def route_model(model: str) -> str:
    """The provider name a model string routes to."""
    return _routing.route(model)


def is_provider_name(model: str) -> bool:
    """Whether ``model`` is a bare provider name (an alias that maps to itself)."""
    key = model.lower()
    return _routing.aliases.get(key) == key


def set_default_provider(provider: str | None) -> None:
    """Set (or disable with None) the provider used when no alias or rule matches."""
    global _routing
    with _lock:
        _routing = dataclasses.replace(_routing, default=provider)


def register_model_alias(alias: str, provider: str) -> None:
    """Route the exact model string ``alias`` (case-insensitive) to ``provider``."""
    global _routing
    with _lock:
        aliases = MappingProxyType({**_routing.aliases, alias.lower(): provider})
        _routing = dataclasses.replace(_routing, aliases=aliases)


def register_model_rule(pattern: str, provider: str, *, kind: RuleKind = "contains") -> None:
    """Route model names containing (or starting with) ``pattern``; newer rules win."""
    if kind not in ("contains", "startswith"):
        raise ConfigurationError(f"kind must be 'contains' or 'startswith', got {kind!r}")
    global _routing
    with _lock:
        rules = ((kind, pattern.lower(), provider), *_routing.rules)
        _routing = dataclasses.replace(_routing, rules=rules)
