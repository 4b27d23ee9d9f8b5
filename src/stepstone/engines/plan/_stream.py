"""Streaming a Plan run: the text of its LLM steps as it comes, each piece tagged with its
step, while the run commits every step as ``Plan.run`` does."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any, Literal

from stepstone.core import Envelope
from stepstone.core._tokens import send_tokens_to

__all__ = ["StepToken", "step_stream", "stream_run", "streaming"]

TokenKind = Literal["text", "start", "end", "done"]


class StepToken(str):
    """A piece of a streamed Plan run: a ``str`` (the text), with where it comes from.

    Attributes:
        step: The step whose LLM produced the text (None for the final text of a run whose
            steps streamed nothing, and for the ``"done"`` marker).
        kind: ``"text"``; with ``boundaries=True`` also ``"start"`` and ``"end"`` around
            each step execution and ``"done"`` at the run's end (their text is ``""``).
        envelope: For ``"end"``: the step's result; for ``"done"``: the run's.

    Example::

        async for token in plan.stream(Envelope.from_task("q"), boundaries=True):
            if token.kind == "start":
                print(f"\\n== {token.step} ==")
            print(token, end="")
    """

    step: str | None
    kind: TokenKind
    envelope: Envelope[Any] | None

    def __new__(
        cls,
        text: str,
        *,
        step: str | None,
        kind: TokenKind = "text",
        envelope: Envelope[Any] | None = None,
    ) -> StepToken:
        token = super().__new__(cls, text)
        token.step = step
        token.kind = kind
        token.envelope = envelope
        return token

    def __repr__(self) -> str:
        return f"StepToken({str(self)!r}, step={self.step!r}, kind={self.kind!r})"


Feed = Callable[[StepToken], Awaitable[None]]

#: The stream a Plan run feeds (bound by :func:`stream_run`; hidden from nested Plans).
_FEED: contextvars.ContextVar[tuple[Feed, bool] | None] = contextvars.ContextVar(
    "stepstone_plan_stream", default=None
)


def streaming() -> bool:
    """Whether the Plan run in this context is streamed."""
    return _FEED.get() is not None


@contextlib.asynccontextmanager
async def step_stream(
    step: str,
) -> AsyncGenerator[Callable[[Envelope[Any]], Awaitable[None]], None]:
    """Around one step execution: its LLM text goes to the stream tagged with ``step``
    (with boundaries, between a start and an end marker). Yields the function that sends
    the end marker with the step's result. Nothing happens outside a stream."""
    bound = _FEED.get()
    if bound is None:

        async def nothing(out: Envelope[Any]) -> None:
            return None

        yield nothing
        return
    feed, boundaries = bound
    if boundaries:
        await feed(StepToken("", step=step, kind="start"))

    async def text(piece: str) -> None:
        await feed(StepToken(piece, step=step))

    async def end(out: Envelope[Any]) -> None:
        if boundaries:
            await feed(StepToken("", step=step, kind="end", envelope=out))

    with _hidden(), send_tokens_to(text):  # a nested Plan marks no steps of its own
        yield end


@contextlib.contextmanager
def _hidden() -> Iterator[None]:
    token = _FEED.set(None)
    try:
        yield
    finally:
        _FEED.reset(token)


async def stream_run(
    run: Callable[[], Awaitable[Envelope[Any]]], *, boundaries: bool, buffer: int = 64
) -> AsyncGenerator[StepToken, None]:
    """Run ``run()`` (a Plan's ``run``) in a task and yield what its steps stream, through
    a bounded queue: a slow consumer holds the run back instead of growing memory, and one
    that stops early cancels it (it is then resumable where it stopped, as after a crash).

    Raises:
        RuntimeError: the run failed or paused (``"<type>: <message>"``), after its tokens.
    """
    queue: asyncio.Queue[StepToken | None] = asyncio.Queue(maxsize=buffer)
    streamed = False

    async def feed(token: StepToken) -> None:
        await queue.put(token)

    async def go() -> Envelope[Any]:
        token = _FEED.set((feed, boundaries))
        try:
            return await run()
        finally:
            _FEED.reset(token)
            await queue.put(None)

    task = asyncio.create_task(go())
    try:
        while (item := await queue.get()) is not None:
            streamed = streamed or item.kind == "text"
            yield item
        result = await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not result.ok:
        assert result.error is not None
        raise RuntimeError(f"{result.error.type}: {result.error.message}")
    if not streamed:  # no step streamed anything: the run's text once, as before streams
        yield StepToken(result.text(), step=None)
    if boundaries:
        yield StepToken("", step=None, kind="done", envelope=result)
