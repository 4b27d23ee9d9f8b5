"""Model calls of the LLM loop: retries with backoff, deadlines, streaming with stall
detection, and the per-run bookkeeping they share with the engine."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

from stepstone.core import Envelope
from stepstone.engines.llm._settings import LLMSettings
from stepstone.exceptions import (
    IncompleteStreamError,
    ModelAPIError,
    ModelLengthError,
    ModelOverloadedError,
    ModelRateLimitError,
    ModelRefusalError,
    StreamStallError,
    UsageLimitExceeded,
    UserError,
)
from stepstone.observability import EventType, Session
from stepstone.providers._base import Provider, RetryInfo
from stepstone.providers._pricing import estimate_cost
from stepstone.providers._types import ModelRequest, ModelResponse, Usage

__all__ = [
    "CONTINUE_NOTE",
    "MALFORMED_CALL_NOTE",
    "ModelCalls",
    "RunState",
    "TokenQueue",
    "last_stream_result",
]

#: Told to the model after a malformed function call (Gemini ``MALFORMED_FUNCTION_CALL``).
MALFORMED_CALL_NOTE = (
    "Your last function call was malformed and was not run. Call the tool again with "
    "arguments that are a JSON object matching its schema, or answer without it."
)
#: Told to the model when its answer was cut off and ``continue_on_length`` allows more.
CONTINUE_NOTE = (
    "Your answer was cut off at the output limit. Continue exactly where it stopped, "
    "without repeating anything."
)

log = logging.getLogger("stepstone")


class TokenQueue(Protocol):
    """Where a streamed turn puts its text: an ``asyncio.Queue`` (``LLMEngine.stream``) or
    a caller's sink (``Plan.stream``)."""

    async def put(self, item: str | None) -> None:
        """Take the next piece of text (None: the stream's end)."""
        ...


_STREAM_RESULT: contextvars.ContextVar[Envelope[Any] | None] = contextvars.ContextVar(
    "stepstone_stream_result", default=None
)


def last_stream_result() -> Envelope[Any] | None:
    """The result of the last ``stream()`` this task consumed to its end.

    An envelope whose ``payload`` is the final answer (the parsed value with ``output=``)
    and whose ``metadata`` has the usage, cost and ``stop_reason``; None before any stream
    finished. Read it right after the ``async for`` loop::

        async for token in agent.stream("q"):
            print(token, end="")
        result = last_stream_result()
    """
    return _STREAM_RESULT.get()


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
    stop_reason: str | None = None
    raw_stop_reason: str | None = None
    continuations: int = 0
    error: str | None = None

    def emit(self, type: EventType, payload: dict[str, Any]) -> None:
        if self.session is not None:
            self.session.emit(type, {"agent_name": self.agent_name, **payload}, run_id=self.run_id)


Outcome = Literal["final", "tools", "pause", "malformed", "continue"]

_ERRORS: dict[str, type[ModelAPIError]] = {
    "rate_limit": ModelRateLimitError,
    "overloaded": ModelOverloadedError,
    "incomplete_stream": IncompleteStreamError,
}

_FIXES: dict[str, str] = {
    "rate_limit": "lower the request rate or raise the provider quota",
    "overloaded": "try again later",
    "server": "try again later",
    "connection": "check the network and base_url",
    "incomplete_stream": "try again; the stream was cut before its final event",
    "invalid_response": (
        "try again (resume the run); the body was cut off or damaged on the way, and if it "
        "keeps happening check base_url and any proxy in between"
    ),
    "bad_request": "fix the request (model id, parameters, message history)",
    "auth": "check the API key and the account's access to the model",
    "not_found": "check the model id and base_url",
}


class ModelCalls:
    """One model turn with the engine's retry, deadline, streaming and outcome policy.

    The engine holds one; it reads only the engine's frozen :class:`LLMSettings`.
    """

    __slots__ = ("settings",)

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings

    # -- outcomes --------------------------------------------------------------------------

    def outcome(self, provider: Provider, response: ModelResponse, state: RunState) -> Outcome:
        """What the loop does with ``response``; refusals and truncations raise."""
        state.stop_reason = response.stop_reason
        state.raw_stop_reason = response.raw_stop_reason
        reason = response.stop_reason
        model = response.model or state.model or ""
        if reason in ("refusal", "content_filter"):
            said = response.refusal or response.text
            what = "refused" if reason == "refusal" else "was blocked by the content filter"
            raise ModelRefusalError(
                f"{provider.name} model {model!r} {what} (stop reason "
                f"{response.raw_stop_reason!r}, run {state.run_id}): {said[:500]!r}. A "
                "refusal is not retried; change the prompt or the model",
                provider=provider.name,
                model=model,
                stop_reason=reason,
                raw_stop_reason=response.raw_stop_reason,
                text=said,
            )
        if reason == "pause":
            return "pause"
        if reason == "malformed_tool_call":
            return "malformed"
        if reason == "length":
            if not response.tool_calls and state.continuations < self.settings.continue_on_length:
                state.continuations += 1
                return "continue"
            raise ModelLengthError(
                f"{provider.name} model {model!r} stopped at the output-token cap (stop "
                f"reason {response.raw_stop_reason!r}, run {state.run_id}) after "
                f"{len(response.text)} characters; raise the provider's max_tokens, or pass "
                "LLMEngine(continue_on_length=N) to let the model go on",
                provider=provider.name,
                model=model,
                stop_reason=reason,
                raw_stop_reason=response.raw_stop_reason,
                text=response.text,
            )
        return "tools" if response.tool_calls else "final"

    # -- budgets ---------------------------------------------------------------------------

    def check_limits(self, state: RunState, model: str, provider: str) -> None:
        """Stop the run before its next request when a :class:`UsageLimits` cap is reached."""
        limits = self.settings.usage_limits
        if limits is None:
            return
        usage = state.usage
        checks: list[tuple[str, float | None, float]] = [
            ("max_requests", limits.max_requests, usage.requests),
            ("max_input_tokens", limits.max_input_tokens, usage.input_tokens),
            ("max_output_tokens", limits.max_output_tokens, usage.output_tokens),
            ("max_total_tokens", limits.max_total_tokens, usage.total_tokens),
        ]
        for name, cap, value in checks:
            if cap is not None and value >= cap:
                raise UsageLimitExceeded(
                    f"run {state.run_id} reached UsageLimits({name}={cap}) with {value} "
                    f"before request {usage.requests + 1}; raise the limit to let it go on",
                    limit=name,
                    value=value,
                    maximum=cap,
                )
        if limits.max_cost_usd is not None:
            cost = estimate_cost(model, usage, provider)
            if cost is None:
                raise UsageLimitExceeded(
                    f"run {state.run_id} has UsageLimits(max_cost_usd={limits.max_cost_usd}) "
                    f"but the price of model {model!r} is unknown, so the cost cannot be "
                    "bounded; register it with stepstone.providers.register_price(...) or "
                    "cap tokens instead",
                    limit="max_cost_usd",
                    value=float("nan"),
                    maximum=limits.max_cost_usd,
                )
            if cost >= limits.max_cost_usd:
                raise UsageLimitExceeded(
                    f"run {state.run_id} reached UsageLimits(max_cost_usd="
                    f"{limits.max_cost_usd}) with an estimated ${cost:.6f} before request "
                    f"{usage.requests + 1}; raise the limit to let it go on",
                    limit="max_cost_usd",
                    value=cost,
                    maximum=limits.max_cost_usd,
                )

    # -- errors ----------------------------------------------------------------------------

    def _final_error(
        self,
        provider: Provider,
        request: ModelRequest,
        exc: Exception,
        info: RetryInfo,
        retry_at: float | None = None,
    ) -> Exception:
        """The error a failed turn ends with: typed when the provider recognised it."""
        if isinstance(exc, StreamStallError | ModelAPIError):
            return exc
        if info.kind == "timeout" and not isinstance(exc, TimeoutError):
            return TimeoutError(
                f"{provider.name} request for {request.model!r} exceeded "
                f"request_timeout={self.settings.request_timeout}s ({type(exc).__name__})"
            )
        if isinstance(exc, TimeoutError) or (
            info.kind == "other" and info.status is None and retry_at is None
        ):
            return exc
        cls = _ERRORS.get(info.kind, ModelAPIError)
        status = f" HTTP {info.status}" if info.status is not None else ""
        when = (
            f"; the server asked to wait {info.retry_after:g}s, more than "
            f"max_retry_wait={self.settings.max_retry_wait}s, so the step ends now and can be "
            f"resumed after retry_at={retry_at:.0f} (UTC seconds)"
            if retry_at is not None and info.retry_after is not None
            else ""
        )
        fix = _FIXES.get(info.kind, "see the provider's message")
        return cls(
            f"{provider.name} request for {request.model!r} failed ({info.kind}{status}, "
            f"turn {request.turn}): {type(exc).__name__}: {exc}{when}; {fix}",
            provider=provider.name,
            model=request.model,
            kind=info.kind,
            status=info.status,
            retryable=info.retryable,
            retry_after=info.retry_after,
            retry_at=retry_at,
        )

    async def with_retries(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        sink: TokenQueue | None,
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
            except Exception as exc:  # noqa: BLE001 - _retry_delay raises what is final
                delay = self._retry_delay(provider, request, state, exc, attempt)
                await asyncio.sleep(delay)
                attempt += 1

    def _retry_delay(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        exc: Exception,
        attempt: int,
    ) -> float:
        """Seconds to wait before retrying the failed turn (announced), or its final error."""
        if isinstance(exc, StreamStallError | TimeoutError):
            info = RetryInfo(True, kind="timeout")
        else:
            info = provider.retry_info(exc)
        # Text already handed to a stream consumer cannot be taken back, so a turn
        # that failed mid-stream is not retried.
        if not info.retryable or attempt >= self.settings.max_retries or state.emitted:
            final = self._final_error(provider, request, exc, info)
            if final is exc:
                # The verdict travels with the error: an exhausted transient failure
                # is still retryable later (ErrorInfo.retryable), a permanent one not.
                with contextlib.suppress(AttributeError, TypeError):
                    exc.retryable = info.retryable  # type: ignore[attr-defined]
                raise exc
            raise final from exc
        delay = self._backoff(attempt, info.retry_after)
        if delay > self.settings.max_retry_wait:
            # Sleeping this long would hold the run's lease; end the step with the
            # time it may be retried at instead.
            error = self._final_error(provider, request, exc, info, retry_at=time.time() + delay)
            raise error from exc
        log.info(
            "stepstone: %s request failed (%s: %s); retry %d/%d in %.2fs",
            provider.name,
            type(exc).__name__,
            exc,
            attempt + 1,
            self.settings.max_retries,
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
        return delay

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        return float(self.settings.retry_delay * (2.0**attempt) * random.uniform(0.9, 1.1))

    async def _complete(self, provider: Provider, request: ModelRequest) -> ModelResponse:
        if self.settings.request_timeout is None:
            return await provider.complete(request)
        request = dataclasses.replace(request, timeout=self.settings.request_timeout)
        if provider.sdk_timeout:
            # The SDK applies it to each network operation, which also suits an adapter that
            # streams a long completion (a total deadline would cut it off mid-answer).
            return await provider.complete(request)
        try:
            async with asyncio.timeout(self.settings.request_timeout):
                return await provider.complete(request)
        except TimeoutError:
            raise TimeoutError(
                f"{provider.name} request for {request.model!r} exceeded "
                f"request_timeout={self.settings.request_timeout}s"
            ) from None

    async def _stream_turn(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        sink: TokenQueue,
    ) -> ModelResponse:
        settings = self.settings
        limits = [
            t for t in (settings.request_timeout, settings.stream_idle_timeout) if t is not None
        ]
        if limits:
            # The SDK's read timeout must not cut a stream the idle watchdog still allows.
            request = dataclasses.replace(request, timeout=max(limits))
        stream: AsyncIterator[Any] = provider.stream(request)
        first = True
        try:
            while True:
                item = await self._next_event(provider, request, stream, first=first)
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

    async def _next_event(
        self, provider: Provider, request: ModelRequest, stream: AsyncIterator[Any], *, first: bool
    ) -> Any:
        """The stream's next event, within the first-event deadline or the idle timeout."""
        settings = self.settings
        waiting_first = first and settings.request_timeout is not None
        limit = settings.request_timeout if waiting_first else settings.stream_idle_timeout
        try:
            if limit is None:
                return await anext(stream)
            async with asyncio.timeout(limit):
                return await anext(stream)
        except StopAsyncIteration:
            raise RuntimeError(f"{provider.name} stream ended without a final response") from None
        except TimeoutError:
            if waiting_first:
                raise TimeoutError(
                    f"{provider.name} stream for {request.model!r} sent nothing "
                    f"within request_timeout={settings.request_timeout}s"
                ) from None
            raise StreamStallError(
                f"{provider.name} stream for {request.model!r} went silent for more "
                f"than stream_idle_timeout={settings.stream_idle_timeout}s "
                f"(turn {request.turn})"
            ) from None
