"""Model calls of the LLM loop: retries with backoff, deadlines, streaming with stall
detection, and the per-run bookkeeping they share with the engine."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

from stepstone.exceptions import StreamStallError, UserError
from stepstone.observability import EventType, Session
from stepstone.providers._base import Provider, RetryInfo
from stepstone.providers._types import ModelRequest, ModelResponse, Usage

__all__ = ["ModelCalls", "RunState"]

log = logging.getLogger("stepstone")


@dataclasses.dataclass(slots=True)
class RunState:
    """Mutable bookkeeping of one run (usage, turns, the emitted-text flag for retries)."""

    run_id: str
    agent_name: str
    session: Session | None
    usage: Usage = dataclasses.field(default_factory=Usage)
    turns: int = 0
    tool_calls: int = 0
    emitted: bool = False
    model: str | None = None

    def emit(self, type: EventType, payload: dict[str, Any]) -> None:
        if self.session is not None:
            self.session.emit(type, {"agent_name": self.agent_name, **payload}, run_id=self.run_id)


class ModelCalls:
    """One model turn with the engine's retry, deadline and streaming policy."""

    max_retries: int
    retry_delay: float
    request_timeout: float | None
    stream_idle_timeout: float | None

    async def _with_retries(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        sink: asyncio.Queue[str | None] | None,
    ) -> ModelResponse:
        attempt = 0
        while True:
            state.emitted = False
            try:
                if sink is None:
                    return await self._complete(provider, request)
                return await self._stream_turn(provider, request, state, sink)
            except UserError:
                raise
            except Exception as exc:
                info = (
                    RetryInfo(True)
                    if isinstance(exc, TimeoutError | StreamStallError)
                    else provider.retry_info(exc)
                )
                # Text already handed to a stream consumer cannot be taken back, so a turn
                # that failed mid-stream is not retried.
                if not info.retryable or attempt >= self.max_retries or state.emitted:
                    # The verdict travels with the error: an exhausted transient failure is
                    # still retryable later (ErrorInfo.retryable), a permanent one is not.
                    with contextlib.suppress(AttributeError, TypeError):
                        exc.retryable = info.retryable  # type: ignore[attr-defined]
                    raise
                delay = self._backoff(attempt, info.retry_after)
                log.info(
                    "stepstone: %s request failed (%s: %s); retry %d/%d in %.2fs",
                    provider.name,
                    type(exc).__name__,
                    exc,
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                state.emit(
                    EventType.MODEL_RESPONSE,
                    {
                        "turn": request.turn,
                        "retry": attempt + 1,
                        "error": type(exc).__name__,
                        "message": str(exc),
                        "delay": delay,
                    },
                )
                await asyncio.sleep(delay)
                attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        return float(self.retry_delay * (2.0**attempt) * random.uniform(0.9, 1.1))

    async def _complete(self, provider: Provider, request: ModelRequest) -> ModelResponse:
        if self.request_timeout is None:
            return await provider.complete(request)
        try:
            async with asyncio.timeout(self.request_timeout):
                return await provider.complete(request)
        except TimeoutError:
            raise TimeoutError(
                f"{provider.name} request for {request.model!r} exceeded "
                f"request_timeout={self.request_timeout}s"
            ) from None

    async def _stream_turn(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        sink: asyncio.Queue[str | None],
    ) -> ModelResponse:
        stream: AsyncIterator[Any] = provider.stream(request)
        first = True
        try:
            while True:
                limit = (
                    self.request_timeout
                    if first and self.request_timeout is not None
                    else self.stream_idle_timeout
                )
                try:
                    if limit is None:
                        item = await anext(stream)
                    else:
                        async with asyncio.timeout(limit):
                            item = await anext(stream)
                except StopAsyncIteration:
                    raise RuntimeError(
                        f"{provider.name} stream ended without a final response"
                    ) from None
                except TimeoutError:
                    if first and self.request_timeout is not None:
                        raise TimeoutError(
                            f"{provider.name} stream for {request.model!r} sent nothing "
                            f"within request_timeout={self.request_timeout}s"
                        ) from None
                    raise StreamStallError(
                        f"{provider.name} stream for {request.model!r} went silent for more "
                        f"than stream_idle_timeout={self.stream_idle_timeout}s "
                        f"(turn {request.turn})"
                    ) from None
                first = False
                if isinstance(item, ModelResponse):
                    return item
                if item:
                    state.emitted = True
                    await sink.put(item)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    log.debug("stepstone: closing a %s stream failed", provider.name, exc_info=True)
