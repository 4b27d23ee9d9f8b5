"""Model string → provider routing: aliases, rules, a default, and the registry lock."""

from __future__ import annotations

import threading
from typing import ClassVar, Literal

from stepstone.exceptions import ConfigurationError

__all__ = ["ProviderRouting"]

RuleKind = Literal["contains", "startswith"]


class ProviderRouting:
    """Class-level routing tables shared by every :class:`LLMEngine`.

    Lookup order: an exact alias, then rules (newest first), then the default provider.
    Writers swap whole new tables in under a lock, so readers never see a half-written one
    and two threads registering at once never lose an entry.
    """

    _PROVIDER_REGISTRY_LOCK: ClassVar[threading.Lock] = threading.Lock()
    # An alias that maps to itself is a bare provider name (guarded at construction).
    _PROVIDER_ALIASES: ClassVar[dict[str, str]] = {
        "anthropic": "anthropic",
        "openai": "openai",
        "google": "google",
        "ollama": "ollama",
    }
    _PROVIDER_RULES: ClassVar[list[tuple[RuleKind, str, str]]] = [
        ("startswith", "claude", "anthropic"),
        ("startswith", "gpt", "openai"),
        ("startswith", "chatgpt", "openai"),
        ("startswith", "o1", "openai"),
        ("startswith", "o3", "openai"),
        ("startswith", "o4", "openai"),
        ("startswith", "gemini", "google"),
        ("startswith", "models/gemini", "google"),
    ]
    _PROVIDER_DEFAULT: ClassVar[str | None] = "anthropic"

    @classmethod
    def set_default_provider(cls, provider: str | None) -> None:
        """Set (or disable with None) the fallback provider used when no rule matches.

        Example::

            # Production hardening: an unknown model is a ValueError at construction,
            # not a cryptic "unknown model" error from a provider several round trips later.
            LLMEngine.set_default_provider(None)

            # Send unknown models to another built-in instead:
            LLMEngine.set_default_provider("openai")
        """
        with cls._PROVIDER_REGISTRY_LOCK:
            ProviderRouting._PROVIDER_DEFAULT = provider

    @classmethod
    def provider_aliases(cls) -> dict[str, str]:
        """A copy of the exact-match alias map (mutating it changes nothing)."""
        return dict(ProviderRouting._PROVIDER_ALIASES)

    @classmethod
    def register_provider_alias(cls, alias: str, provider: str) -> None:
        """Register an exact-match model string → provider alias (thread-safe).

        Example::

            LLMEngine.register_provider_alias("mistral", "mistral")
        """
        with cls._PROVIDER_REGISTRY_LOCK:
            ProviderRouting._PROVIDER_ALIASES = {
                **ProviderRouting._PROVIDER_ALIASES,
                alias.lower(): provider,
            }

    @classmethod
    def register_provider_rule(
        cls, pattern: str, provider: str, *, kind: RuleKind = "contains"
    ) -> None:
        """Register a substring / prefix routing rule; newer rules win over older ones.

        Example::

            LLMEngine.register_provider_rule("claude-opus-5", "anthropic")
            Agent("claude-opus-5-20260701")   # routed to anthropic

        Thread-safe: the rule list is replaced under a lock, never edited in place.
        """
        if kind not in ("contains", "startswith"):
            raise ConfigurationError(f"kind must be 'contains' or 'startswith', got {kind!r}")
        with cls._PROVIDER_REGISTRY_LOCK:
            ProviderRouting._PROVIDER_RULES = [
                (kind, pattern.lower(), provider),
                *ProviderRouting._PROVIDER_RULES,
            ]

    @classmethod
    def _infer_provider(cls, model: str) -> str:
        key = model.lower()
        aliases = ProviderRouting._PROVIDER_ALIASES
        if key in aliases:
            return aliases[key]
        for kind, pattern, provider in ProviderRouting._PROVIDER_RULES:
            if (kind == "startswith" and key.startswith(pattern)) or (
                kind == "contains" and pattern in key
            ):
                return provider
        default = ProviderRouting._PROVIDER_DEFAULT
        if default is None:
            raise ConfigurationError(
                f"no provider rule matches model {model!r} and the default provider is "
                f"disabled; pass provider='...', or register a rule: "
                f"LLMEngine.register_provider_rule({model.split('-')[0]!r}, '<provider>', "
                f"kind='startswith')"
            )
        return default
