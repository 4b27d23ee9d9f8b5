"""Engines: Plan (deterministic steps), graph (typed state), LLM loop, replanning."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from stepstone.engines._protocol import (
        Engine,
        KeywordEngine,
        KeywordStreamingEngine,
        StreamingEngine,
    )

# Each name loads its module on first use (PEP 562): importing one module of the package
# does not import the others.
_LAZY: dict[str, str] = {
    "Engine": "stepstone.engines._protocol",
    "KeywordEngine": "stepstone.engines._protocol",
    "KeywordStreamingEngine": "stepstone.engines._protocol",
    "StreamingEngine": "stepstone.engines._protocol",
}


def __getattr__(name: str) -> _Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["Engine", "KeywordEngine", "KeywordStreamingEngine", "StreamingEngine"]
