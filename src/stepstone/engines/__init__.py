"""Engines: Plan (deterministic steps), graph (typed state), LLM loop, replanning."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from stepstone.core._lazy import lazy_attributes as _lazy_attributes

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


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())


__all__ = ["Engine", "KeywordEngine", "KeywordStreamingEngine", "StreamingEngine"]
