"""Rough list prices (USD per million tokens) for cost estimates in run metadata.

Estimates only: prices change and cached/reasoning tokens are billed differently by each
provider. Unknown models report ``cost_usd=None``. Longer prefixes win.
"""

from __future__ import annotations

from stepstone.providers._types import Usage

__all__ = ["estimate_cost", "register_price"]

# model-id prefix -> (input, output) USD per 1M tokens
_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus": (15.0, 75.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-7": (5.0, 25.0),
    "claude-sonnet": (3.0, 15.0),
    "claude-haiku": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "gpt-4o": (2.5, 10.0),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "gpt-5": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.4),
    "o3": (2.0, 8.0),
    "o4-mini": (1.1, 4.4),
    "gemini-2.5-pro": (1.25, 10.0),
    "gemini-2.5-flash": (0.3, 2.5),
    "gemini-2.5-flash-lite": (0.1, 0.4),
}


def register_price(model_prefix: str, input_per_mtok: float, output_per_mtok: float) -> None:
    """Add or change the price used to estimate cost for models starting with the prefix."""
    _PRICES[model_prefix] = (input_per_mtok, output_per_mtok)


def estimate_cost(model: str, usage: Usage) -> float | None:
    """Estimated USD cost of ``usage`` on ``model`` (None when the model's price is unknown)."""
    best = ""
    for prefix in _PRICES:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    if not best:
        return None
    inp, out = _PRICES[best]
    return round((usage.input_tokens * inp + usage.output_tokens * out) / 1_000_000, 8)
