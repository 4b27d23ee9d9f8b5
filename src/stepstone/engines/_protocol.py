"""The Engine protocol: what ``Agent(engine=...)`` drives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stepstone.core import Envelope, Tool

if TYPE_CHECKING:
    from stepstone.observability import Session

__all__ = ["Engine", "StreamingEngine"]


@runtime_checkable
class Engine(Protocol):
    """Runs one invocation of an Agent.

    ``run`` returns an Envelope; recoverable failures come back as error envelopes rather
    than exceptions. Engines may also define ``compile(tools)`` (called once at Agent
    construction, to fail fast on invalid configuration) and ``stream(...)``.
    """

    async def run(
        self,
        env: Envelope[Any],
        *,
        tools: list[Tool],
        output_type: type,
        memory: Any,
        session: Session | None,
    ) -> Envelope[Any]:
        """Run once and return the result envelope."""
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that can also stream text tokens."""

    def stream(
        self,
        env: Envelope[Any],
        *,
        tools: list[Tool],
        output_type: type,
        memory: Any,
        session: Session | None,
    ) -> AsyncIterator[str]:
        """Yield text tokens as they are produced."""
        ...
