"""The Engine protocols: what ``Agent(engine=...)`` drives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stepstone.core import Envelope, RunContext, Tool

if TYPE_CHECKING:
    from stepstone.observability import Session

__all__ = ["Engine", "KeywordEngine", "KeywordStreamingEngine", "StreamingEngine"]


@runtime_checkable
class Engine(Protocol):
    """Runs one invocation of an Agent: ``run(env, ctx)``.

    ``ctx`` is the :class:`~stepstone.RunContext` the Agent built for this call (its name,
    tools, output type, session, and where a durable run is recorded when the caller
    decides it). ``run`` returns an Envelope; recoverable failures come back as error
    envelopes rather than exceptions. Engines may also define ``compile(tools, *,
    output_type)`` (called once at Agent construction, to fail fast on invalid
    configuration) and ``stream(env, ctx)``.

    Engines written to the keyword interface (:class:`KeywordEngine`) keep working: the
    Agent reads the signature of ``run`` once, at construction, and calls it that way.
    """

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        """Run once and return the result envelope."""
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that can also stream text tokens: ``stream(env, ctx)``."""

    def stream(self, env: Envelope[Any], ctx: RunContext) -> AsyncIterator[str]:
        """Yield text tokens as they are produced."""
        ...


@runtime_checkable
class KeywordEngine(Protocol):
    """The keyword engine interface: ``run(env, *, tools, output_type, memory, session)``.

    An Agent calls such an engine with its tools, output type and session as keywords
    (``memory`` is None). It gets no agent name and no :class:`~stepstone.RunLocation`:
    write ``run(env, ctx)`` for those.
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
class KeywordStreamingEngine(KeywordEngine, Protocol):
    """A :class:`KeywordEngine` that can also stream text tokens."""

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
