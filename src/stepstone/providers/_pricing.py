"""Cost estimates (USD) for run metadata and ``UsageLimits(max_cost_usd=...)``.

Prices come, in this order, from prices you registered (:func:`register_price`), from the
maintained ``genai-prices`` table when it is installed (``pip install stepstone[prices]``;
it knows cache-read, cache-write and tiered prices), and from a small built-in list of
input/output prices. The built-in list has no cache prices, so a response that used the
prompt cache is priced only by the first two; otherwise the cost is ``None`` ("unknown")
rather than a wrong number.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from stepstone.providers._types import Usage

__all__ = ["Price", "estimate_cost", "price_source", "register_price"]


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. ``None`` cache prices mean "not known"."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


# model-id prefix -> input/output USD per 1M tokens (used without genai-prices)
_BUILTIN: dict[str, Price] = {
    "claude-opus": Price(15.0, 75.0),
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4-6": Price(5.0, 25.0),
    "claude-opus-4-7": Price(5.0, 25.0),
    "claude-sonnet": Price(3.0, 15.0),
    "claude-haiku": Price(1.0, 5.0),
    "claude-3-5-haiku": Price(0.8, 4.0),
    "gpt-4o": Price(2.5, 10.0),
    "gpt-4o-mini": Price(0.15, 0.6),
    "gpt-4.1": Price(2.0, 8.0),
    "gpt-4.1-mini": Price(0.4, 1.6),
    "gpt-5": Price(1.25, 10.0),
    "gpt-5-mini": Price(0.25, 2.0),
    "gpt-5-nano": Price(0.05, 0.4),
    "o3": Price(2.0, 8.0),
    "o4-mini": Price(1.1, 4.4),
    "gemini-2.5-pro": Price(1.25, 10.0),
    "gemini-2.5-flash": Price(0.3, 2.5),
    "gemini-2.5-flash-lite": Price(0.1, 0.4),
}
_REGISTERED: dict[str, Price] = {}

#: Provider names the price table knows; other named providers (``ollama``, your own) are
#: priced only by registered prices.
_TABLE_PROVIDERS = frozenset({"anthropic", "openai", "google"})
#: Scripted providers: priced by model id alone.
_ANY_PROVIDER = frozenset({"", "test"})


def register_price(
    model_prefix: str,
    input_per_mtok: float,
    output_per_mtok: float,
    *,
    cache_read_per_mtok: float | None = None,
    cache_write_per_mtok: float | None = None,
) -> None:
    """Price models whose id starts with ``model_prefix`` (USD per million tokens).

    Registered prices win over every table. Without cache prices, a response that read or
    wrote the prompt cache is priced as unknown.
    """
    for name, value in (("input_per_mtok", input_per_mtok), ("output_per_mtok", output_per_mtok)):
        if value < 0:
            raise ValueError(f"register_price({model_prefix!r}): {name}={value!r} must be >= 0")
    _REGISTERED[model_prefix] = Price(
        input_per_mtok, output_per_mtok, cache_read_per_mtok, cache_write_per_mtok
    )
    _PRICES.clear()


def _longest(table: dict[str, Price], model: str) -> Price | None:
    best = max((p for p in table if model.startswith(p)), key=len, default=None)
    return None if best is None else table[best]


def _from_price(price: Price, usage: Usage) -> float | None:
    read, write = usage.cache_read_tokens, usage.cache_write_tokens
    if (read and price.cache_read is None) or (write and price.cache_write is None):
        return None
    uncached = max(0, usage.input_tokens - read - write)
    total = (
        uncached * price.input
        + read * (price.cache_read or 0.0)
        + write * (price.cache_write or 0.0)
        + usage.output_tokens * price.output
    )
    return round(total / 1_000_000, 8)


@functools.lru_cache(maxsize=1)
def _genai_prices() -> Any:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices


@functools.lru_cache(maxsize=512)
def _table_knows(model: str, provider: str) -> bool:
    """Whether the genai-prices table prices ``model`` at all. Cached: a miss scans the
    whole table (~0.1 ms), and a durable agent run prices its usage at every phase."""
    return _calc_from_table(model, provider, Usage()) is not None


def _from_table(model: str, provider: str, usage: Usage) -> float | None:
    if not _table_knows(model, provider):
        return None
    return _calc_from_table(model, provider, usage)


def _calc_from_table(model: str, provider: str, usage: Usage) -> float | None:
    prices = _genai_prices()
    if prices is None:
        return None
    counts = prices.Usage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
    )
    try:
        result = prices.calc_price(
            counts, model_ref=model, provider_id=provider if provider else None
        )
    except LookupError:
        return None
    return round(float(result.total_price), 8)


def price_source(model: str, provider: str = "") -> str | None:
    """Where a price for ``model`` would come from: ``"registered"``, ``"genai-prices"``,
    ``"builtin"``, or None (unknown)."""
    if _longest(_REGISTERED, model) is not None:
        return "registered"
    if provider not in _TABLE_PROVIDERS | _ANY_PROVIDER:
        return None
    if _from_table(model, "" if provider in _ANY_PROVIDER else provider, Usage()) is not None:
        return "genai-prices"
    return "builtin" if _longest(_BUILTIN, model) is not None else None


def estimate_cost(model: str, usage: Usage, provider: str = "") -> float | None:
    """Estimated USD cost of ``usage`` on ``model`` (None when no price is known for it).

    Cached input is priced at the cache-read and cache-write rates; ``usage.input_tokens``
    counts every input token, cached or not.
    """
    found = _PRICES.get((model, provider))
    if found is None:
        found = _PRICES[(model, provider)] = _price_of(model, provider)
    registered, table, builtin = found
    if registered is not None:
        return _from_price(registered, usage)
    if table:
        cost = _from_table(model, "" if provider in _ANY_PROVIDER else provider, usage)
        if cost is not None:
            return cost
    return None if builtin is None else _from_price(builtin, usage)


#: Where the price of ``(model, provider)`` comes from: a registered price, whether the
#: table knows the model, a built-in price (a durable run prices its usage at every
#: phase: the prefix tables are looked up once). ``register_price`` clears it.
_PRICES: dict[tuple[str, str], tuple[Price | None, bool, Price | None]] = {}


def _price_of(model: str, provider: str) -> tuple[Price | None, bool, Price | None]:
    registered = _longest(_REGISTERED, model)
    if registered is not None:
        return registered, False, None
    if provider not in _TABLE_PROVIDERS | _ANY_PROVIDER:
        return None, False, None
    table = _table_knows(model, "" if provider in _ANY_PROVIDER else provider)
    return None, table, _longest(_BUILTIN, model)
