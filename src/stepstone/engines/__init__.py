"""Engines: Plan (deterministic steps), graph (typed state), LLM loop, replanning."""

from stepstone.engines._protocol import (
    Engine,
    KeywordEngine,
    KeywordStreamingEngine,
    StreamingEngine,
)

__all__ = ["Engine", "KeywordEngine", "KeywordStreamingEngine", "StreamingEngine"]
