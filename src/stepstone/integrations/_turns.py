"""What people see of a model turn: model, tokens, cost and the tool calls it asked for.

Both framework adapters keep one such summary beside each model request's recorded
outcome (``Outcome.summary``); ``stepstone show``, ``store.read`` and the inspector show it
per turn. It is never replayed, so its shape may grow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stepstone.providers._pricing import estimate_cost
from stepstone.providers._types import Usage

__all__ = ["turn_summary"]

#: Characters of a turn's text and of each tool call's arguments kept in its summary.
SHOWN = 200


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _args_text(args: Any) -> str:
    if isinstance(args, str):
        return _cut(args)
    return _cut(json.dumps(args, ensure_ascii=False, default=str, separators=(",", ":")))


def turn_summary(
    *,
    model: str | None,
    provider: str | None,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    tool_calls: Sequence[tuple[str, Any]] = (),
    text: str | None = None,
) -> dict[str, Any]:
    """The summary of one model turn: ``model``, ``provider``, ``input_tokens``,
    ``output_tokens``, ``cost_usd`` (None when no price is known for the model),
    ``tool_calls`` (``[{"name", "args"}]``, arguments as JSON text, cut) and ``text``
    (cut)."""
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
        requests=1,
    )
    cost = estimate_cost(model, usage, _provider(provider)) if model else None
    out: dict[str, Any] = {
        "model": model,
        "provider": provider,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": None if cost is None else round(cost, 8),
        "tool_calls": [{"name": name, "args": _args_text(args)} for name, args in tool_calls],
    }
    if text:
        out["text"] = _cut(text)
    return out


def _provider(name: str | None) -> str:
    """The price table's provider name for a framework's provider name."""
    if not name:
        return ""
    low = name.lower()
    for known in ("openai", "anthropic", "google"):
        if known in low:
            return known
    return low
