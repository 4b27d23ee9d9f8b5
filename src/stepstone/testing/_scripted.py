"""Scripted models: FakeModel (a list of replies) and FunctionModel (a function per turn)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from pydantic import BaseModel

from stepstone.providers._base import IncompleteStream, Provider, RetryInfo, StreamItem
from stepstone.providers._types import ModelRequest, ModelResponse, ToolCall, Usage

__all__ = [
    "FakeModel",
    "FunctionModel",
    "Reply",
    "ScriptExhaustedError",
    "TransientModelError",
    "call",
]


class ScriptExhaustedError(RuntimeError):
    """A scripted model was asked for more turns than its script has."""


class TransientModelError(Exception):
    """A scripted provider failure the engine retries (like a 429 or a 503).

    Args:
        message: The error text.
        retry_after: Seconds the "server" asks the client to wait (None: use backoff).
    """

    def __init__(self, message: str = "transient model error", retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted model turn with every option.

    Attributes:
        text: The reply text (the final answer when there are no tool calls).
        tool_calls: Tool calls for this turn (build them with :func:`call`).
        chunks: How ``stream()`` splits ``text`` (default: word by word).
        delay: Seconds to wait before answering (or before the first chunk).
        chunk_delay: Seconds between streamed chunks.
        stall_after: When streaming, send this many chunks and then go silent forever
            (tests ``stream_idle_timeout``).
        usage: Token counts to report (default: a word count estimate).
        thinking: Reasoning text to report.
        stop_reason: The outcome, normalised (``"refusal"``, ``"content_filter"``,
            ``"length"``, ``"pause"``, ``"malformed_tool_call"``...; default ``"stop"`` or
            ``"tool_calls"``). Loopback dialects send each provider's own value for it (a
            refusal is OpenAI's ``message.refusal``, Anthropic's ``refusal``, Gemini's
            ``SAFETY``); ``text`` is the refusal's explanation.
        raw_stop_reason: Send exactly this provider value instead (loopback dialects).
        truncate: When streaming, end the stream without its final event (OpenAI's
            ``finish_reason`` and ``[DONE]``, Anthropic's ``message_stop``, Gemini's
            ``finishReason``).
        stream_error: When streaming, send a provider error event after ``error_after``
            chunks: ``"overloaded"``, ``"rate_limit"``, ``"server"`` or ``"bad_request"``.
        error_after: Text chunks sent before ``stream_error``.
        reset_after: When streaming through a loopback server, reset the TCP connection
            after this many chunks.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] | list[ToolCall] = ()
    chunks: tuple[str, ...] | list[str] | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    stall_after: int | None = None
    usage: Usage | None = None
    thinking: str = ""
    stop_reason: str | None = None
    raw_stop_reason: str | None = None
    truncate: bool = False
    stream_error: str | None = None
    error_after: int = 0
    reset_after: int | None = None

    def outcome(self) -> str:
        """The normalised stop reason this reply stands for."""
        return self.stop_reason or ("tool_calls" if self.tool_calls else "stop")


def call(name: str, /, **arguments: Any) -> ToolCall:
    """A scripted tool call: ``call("get_weather", city="Paris")``.

    The call id is filled in by the scripted model (``call_<turn>_<index>``). For arguments
    that are not valid JSON, build ``ToolCall(id="x", name=..., raw_arguments="{bad")``.
    """
    return ToolCall(id="", name=name, arguments=dict(arguments))


ScriptItem = Any  # str | Reply | ToolCall | list[ToolCall] | dict | BaseModel | BaseException


def _words(text: str) -> list[str]:
    parts: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " ":
            parts.append(current)
            current = ""
    if current:
        parts.append(current)
    return parts


def _estimate_tokens(request: ModelRequest) -> int:
    total = len((request.system or "").split())
    for m in request.messages:
        total += len(m.text.split())
        total += sum(len(r.content.split()) for r in m.tool_results)
        total += sum(len(json.dumps(c.arguments).split()) for c in m.tool_calls)
    return max(1, total)


def to_reply(item: ScriptItem) -> Reply:
    """Normalise any script item to a :class:`Reply` (exceptions are raised)."""
    if isinstance(item, BaseException):
        raise item
    if isinstance(item, Reply):
        return item
    if isinstance(item, str):
        return Reply(text=item)
    if isinstance(item, ToolCall):
        return Reply(tool_calls=(item,))
    if isinstance(item, list | tuple) and all(isinstance(c, ToolCall) for c in item):
        return Reply(tool_calls=tuple(item))
    if isinstance(item, BaseModel):
        return Reply(text=item.model_dump_json())
    if isinstance(item, dict | list):
        return Reply(text=json.dumps(item))
    raise TypeError(
        f"cannot use {item!r} as a scripted reply; use a str, Reply, call(...), a list of "
        "calls, a dict / pydantic model (JSON answer) or an exception"
    )


class _ScriptedProvider(Provider):
    """Shared machinery: request recording, delays, streaming, ids, usage."""

    name = "test"

    def __init__(self, *, model_name: str) -> None:
        self.model = model_name
        self.requests: list[ModelRequest] = []
        self.cancelled = 0

    @property
    def last_request(self) -> ModelRequest:
        """The most recent request (raises IndexError before the first)."""
        return self.requests[-1]

    async def _next_item(self, request: ModelRequest) -> ScriptItem:
        raise NotImplementedError

    def retry_info(self, exc: BaseException) -> RetryInfo:
        if isinstance(exc, TransientModelError):
            return RetryInfo(True, exc.retry_after)
        return super().retry_info(exc)

    def _response(self, reply: Reply, request: ModelRequest) -> ModelResponse:
        turn = len(self.requests) - 1
        calls = [
            c if c.id else dataclasses.replace(c, id=f"call_{turn}_{i}")
            for i, c in enumerate(reply.tool_calls)
        ]
        usage = reply.usage or Usage(
            input_tokens=_estimate_tokens(request),
            output_tokens=max(1, len(reply.text.split()) + 5 * len(calls)),
        )
        return ModelResponse(
            text=reply.text,
            tool_calls=calls,
            usage=Usage(**dataclasses.asdict(usage)),
            stop_reason=reply.outcome(),
            raw_stop_reason=reply.raw_stop_reason or reply.outcome(),
            refusal=reply.text if reply.outcome() == "refusal" else "",
            model=self.model,
            thinking=reply.thinking,
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        reply = to_reply(await self._next_item(request))
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self._response(reply, request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        self.requests.append(request)
        reply = to_reply(await self._next_item(request))
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            yield ""
            chunks = list(reply.chunks) if reply.chunks is not None else _words(reply.text)
            for i, chunk in enumerate(chunks):
                if reply.stream_error is not None and i >= reply.error_after:
                    raise TransientModelError(f"scripted stream error: {reply.stream_error}")
                if reply.stall_after is not None and i >= reply.stall_after:
                    await asyncio.Event().wait()  # silent forever: a half-open stream
                if i and reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
                yield chunk
            if reply.stall_after is not None and reply.stall_after >= len(chunks):
                await asyncio.Event().wait()
            if reply.stream_error is not None:
                raise TransientModelError(f"scripted stream error: {reply.stream_error}")
            if reply.truncate:
                raise IncompleteStream("scripted stream ended without its final event")
            yield self._response(reply, request)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise


class FakeModel(_ScriptedProvider):
    """A model that answers from a script, one item per model turn.

    Script items: a ``str`` (final text), ``call("tool", **args)`` (one tool call), a list
    of calls (parallel calls in one turn), a ``dict`` or pydantic model (a JSON answer, for
    structured output), a :class:`Reply` (text, calls, chunks, delays, stalls, usage), or
    an exception instance (raised on that turn; :class:`TransientModelError` is retried).

    Example::

        model = FakeModel([call("add", a=1, b=2), "1 + 2 = 3"])
        agent = Agent(engine=LLMEngine(model), tools=[add])
        agent("add 1 and 2").payload      # "1 + 2 = 3"
        model.requests[1].messages[-1].tool_results[0].content   # "3"

    Args:
        script: The replies, in turn order.
        model_name: The model id reported in metadata.
        repeat_last: Answer with the last item forever instead of raising
            :class:`ScriptExhaustedError` when the script runs out.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem],
        *,
        model_name: str = "fake-model",
        repeat_last: bool = False,
    ) -> None:
        super().__init__(model_name=model_name)
        self.script: list[ScriptItem] = list(script)
        self.repeat_last = repeat_last
        self._pos = 0

    @property
    def remaining(self) -> int:
        """Script items not used yet."""
        return len(self.script) - self._pos

    async def _next_item(self, request: ModelRequest) -> ScriptItem:
        if self._pos >= len(self.script):
            if self.repeat_last and self.script:
                return self.script[-1]
            raise ScriptExhaustedError(
                f"FakeModel script exhausted: turn {len(self.requests)} was requested but "
                f"the script has {len(self.script)} item(s); add replies or pass "
                "repeat_last=True"
            )
        item = self.script[self._pos]
        self._pos += 1
        return item


class FunctionModel(_ScriptedProvider):
    """A model whose every turn is computed by ``fn(request)`` (sync or async).

    ``fn`` receives the :class:`~stepstone.providers.ModelRequest` (messages, tools,
    output schema...) and returns any :class:`FakeModel` script item, or raises.

    Example::

        def echo(request):
            return "you said: " + request.messages[0].text

        Agent(engine=LLMEngine(FunctionModel(echo)))("hi").payload   # "you said: hi"
    """

    def __init__(
        self,
        fn: Callable[[ModelRequest], ScriptItem | Awaitable[ScriptItem]],
        *,
        model_name: str = "function-model",
    ) -> None:
        super().__init__(model_name=model_name)
        self.fn = fn

    async def _next_item(self, request: ModelRequest) -> ScriptItem:
        result = self.fn(request)
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        return result
