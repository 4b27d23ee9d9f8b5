"""Engines: Plan (deterministic steps), graph (typed state), LLM loop, replanning."""

from stepstone.engines._protocol import Engine, StreamingEngine

__all__ = ["Engine", "StreamingEngine"]
