"""LLMEngine's routing methods: thin delegations to the provider registry's routing table.

The table itself (aliases, rules, default, and the lock that guards registration) lives in
:mod:`stepstone.providers._registry`; nothing here holds state.
"""

from __future__ import annotations

from stepstone.providers import _registry
from stepstone.providers._registry import RuleKind

__all__ = ["ProviderRouting", "RuleKind"]


class _TableViews(type):
    """Read-only class attributes showing the registry's current routing table."""

    @property
    def _PROVIDER_ALIASES(cls) -> dict[str, str]:  # noqa: N802 - kept name, read-only view
        return dict(_registry.routing_table().aliases)

    @property
    def _PROVIDER_RULES(cls) -> list[tuple[RuleKind, str, str]]:  # noqa: N802
        return list(_registry.routing_table().rules)

    @property
    def _PROVIDER_DEFAULT(cls) -> str | None:  # noqa: N802
        return _registry.routing_table().default


class ProviderRouting(metaclass=_TableViews):
    """Model string → provider routing as :class:`LLMEngine` class methods.

    Lookup order: an exact alias, then rules (newest first), then the default provider.
    Registration is thread-safe: the registry swaps in a whole new table under its lock.
    """

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
        _registry.set_default_provider(provider)

    @classmethod
    def provider_aliases(cls) -> dict[str, str]:
        """A copy of the exact-match alias map (mutating it changes nothing)."""
        return dict(_registry.routing_table().aliases)

    @classmethod
    def register_provider_alias(cls, alias: str, provider: str) -> None:
        """Register an exact-match model string → provider alias (thread-safe).

        Example::

            LLMEngine.register_provider_alias("mistral", "mistral")
        """
        _registry.register_model_alias(alias, provider)

    @classmethod
    def register_provider_rule(
        cls, pattern: str, provider: str, *, kind: RuleKind = "contains"
    ) -> None:
        """Register a substring / prefix routing rule; newer rules win over older ones.

        Example::

            LLMEngine.register_provider_rule("claude-opus-5", "anthropic")
            Agent("claude-opus-5-20260701")   # routed to anthropic

        Thread-safe: the registry replaces its whole table under a lock.
        """
        _registry.register_model_rule(pattern, provider, kind=kind)
