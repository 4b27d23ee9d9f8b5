"""Wire formats of the loopback servers: actions, and each provider's JSON/SSE shapes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from stepstone.providers._types import ToolCall, Usage
from stepstone.testing._scripted import Reply

__all__ = [
    "SSE",
    "Action",
    "AnthropicDialect",
    "Dialect",
    "GoogleDialect",
    "Hang",
    "OpenAIDialect",
    "RecordedRequest",
    "Reset",
    "Respond",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One HTTP request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: Which TCP connection carried it: 1 for the server's first accepted connection, 2 for
    #: the next, ... (requests on one kept-alive connection share the number).
    connection: int = 0

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body or b"null")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Respond:
    """A plain HTTP response (``body``: bytes, str, or JSON-able data)."""

    status: int = 200
    body: Any = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    content_type: str = "application/json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SSE:
    """A server-sent-events response.

    Attributes:
        events: ``(event_name_or_None, data)`` pairs; data is JSON-encoded unless a str.
        delay: Seconds between events.
        stall_after: Send this many events, then stay silent with the connection open.
        reset_after: Send this many events, then reset the TCP connection.
    """

    events: list[tuple[str | None, Any]]
    delay: float = 0.0
    stall_after: int | None = None
    reset_after: int | None = None


@dataclasses.dataclass(frozen=True)
class Hang:
    """Accept the request and never answer (tests ``request_timeout``)."""


@dataclasses.dataclass(frozen=True)
class Reset:
    """Reset the TCP connection without answering (a network error)."""


Action = Respond | SSE | Hang | Reset


class Dialect:
    """Renders neutral replies in one provider's wire format."""

    name = "dialect"

    def base_url(self, server_url: str) -> str:
        """The ``base_url`` to give the provider's SDK."""
        return server_url

    def wants_stream(self, request: RecordedRequest) -> bool:
        """Whether the request asked for a streamed answer."""
        try:
            body = request.json()
        except ValueError:
            return False
        return isinstance(body, dict) and bool(body.get("stream"))

    def render(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        """The response for ``reply`` (JSON, or SSE when the request streams)."""
        raise NotImplementedError

    def error(
        self, status: int, message: str = "error", retry_after: float | None = None
    ) -> Respond:
        """A provider-shaped error response, with a ``retry-after`` header when given."""
        raise NotImplementedError

    def malformed(self) -> Respond:
        """A 200 response whose JSON body is cut off."""
        return Respond(status=200, body=b'{"id": "x", "choices": [{"index": 0, "mess')

    @staticmethod
    def _usage(reply: Reply) -> Usage:
        return reply.usage or Usage(
            input_tokens=10,
            output_tokens=max(1, len(reply.text.split()) + 5 * len(reply.tool_calls)),
        )

    @staticmethod
    def _chunks(reply: Reply) -> list[str]:
        if reply.chunks is not None:
            return list(reply.chunks)
        words = reply.text.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words) if w or i]

    @staticmethod
    def _args(call: ToolCall) -> str:
        return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


def _retry_headers(retry_after: float | None) -> dict[str, str]:
    return {} if retry_after is None else {"retry-after": f"{retry_after:g}"}


class OpenAIDialect(Dialect):
    """Chat Completions (``POST /v1/chat/completions``) and the Responses API (``POST
    /v1/responses``, the default of newer OpenAI SDK models), each as JSON or streamed
    (server-sent events)."""

    name = "openai"

    def base_url(self, server_url: str) -> str:
        return server_url + "/v1"

    def _responses(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        """An answer of the Responses API: JSON, or its server-sent events when the request
        streams (text deltas per chunk, each call's arguments in two deltas, then
        ``response.completed``)."""
        body = self._response_body(reply, model)
        if not self.wants_stream(request):
            return Respond(body=body)
        return SSE(events=self._response_events(reply, body), delay=reply.chunk_delay)

    def _response_events(self, reply: Reply, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
        events: list[tuple[str | None, Any]] = []

        def emit(kind: str, **fields: Any) -> None:
            events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

        started = {**body, "status": "in_progress", "output": [], "usage": None}
        emit("response.created", response=started)
        for index, item in enumerate(body["output"]):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                at = {"item_id": item["id"], "output_index": index, "content_index": 0}
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                empty = {"type": "output_text", "text": "", "annotations": []}
                emit("response.content_part.added", **at, part=empty)
                for piece in self._chunks(reply):
                    emit("response.output_text.delta", **at, delta=piece, logprobs=[])
                emit("response.output_text.done", **at, text=text, logprobs=[])
                emit("response.content_part.done", **at, part=item["content"][0])
            else:
                args = item["arguments"]
                at = {"item_id": item["id"], "output_index": index}
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                half = len(args) // 2
                for part in (args[:half], args[half:]):
                    if part:
                        emit("response.function_call_arguments.delta", **at, delta=part)
                emit(
                    "response.function_call_arguments.done", **at, arguments=args, name=item["name"]
                )
            emit("response.output_item.done", output_index=index, item=item)
        emit("response.completed", response=body)
        return events

    def _response_body(self, reply: Reply, model: str) -> dict[str, Any]:
        usage = self._usage(reply)
        output: list[dict[str, Any]] = []
        if reply.text:
            output.append(
                {
                    "type": "message",
                    "id": "msg_loopback",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        for i, c in enumerate(reply.tool_calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{i}",
                    "call_id": c.id or f"call_{i}",
                    "name": c.name,
                    "arguments": self._args(c),
                    "status": "completed",
                }
            )
        return {
            "id": "resp_loopback",
            "object": "response",
            "created_at": 0,
            "model": model,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        }

    def render(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        if request.path.rstrip("/").endswith("/responses"):
            return self._responses(reply, request, model)
        usage_json = self._chat_usage(reply)
        outcome = reply.outcome()
        finish = reply.raw_stop_reason or _OPENAI_FINISH.get(outcome, outcome)
        refusal = reply.text if outcome == "refusal" else None
        calls = [
            {"id": c.id or f"call_{i}", "name": c.name, "arguments": self._args(c)}
            for i, c in enumerate(reply.tool_calls)
        ]
        if self.wants_stream(request):
            return self._chat_stream(reply, model, refusal, calls, finish, usage_json)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if refusal is not None else reply.text or None,
            "refusal": refusal,
        }
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        return Respond(
            body={
                "id": "chatcmpl-loopback",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage_json,
            }
        )

    def _chat_usage(self, reply: Reply) -> dict[str, Any]:
        usage = self._usage(reply)
        usage_json: dict[str, Any] = {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        }
        if usage.cache_read_tokens:
            usage_json["prompt_tokens_details"] = {"cached_tokens": usage.cache_read_tokens}
        if usage.reasoning_tokens:
            usage_json["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
        return usage_json

    def _chat_stream(
        self,
        reply: Reply,
        model: str,
        refusal: str | None,
        calls: list[dict[str, Any]],
        finish: str,
        usage_json: dict[str, Any],
    ) -> SSE:
        """The chat completion as SSE chunks: its text, then each tool call's name and
        arguments in two halves, then the finish reason and the usage."""

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-loopback",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
        field = "refusal" if refusal is not None else "content"
        pieces = [(None, chunk({field: piece})) for piece in self._chunks(reply)]
        if reply.stream_error is not None:
            kind = _OPENAI_ERRORS[reply.stream_error]
            error = {"error": {"message": f"loopback {kind}", "type": kind, "code": None}}
            events += [*pieces[: reply.error_after], (None, error)]
            return SSE(events=events, delay=reply.chunk_delay)
        events += pieces
        for i, c in enumerate(calls):
            head = {
                "index": i,
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": ""},
            }
            events.append((None, chunk({"tool_calls": [head]})))
            for part in _halves(c["arguments"]):
                delta = {"tool_calls": [{"index": i, "function": {"arguments": part}}]}
                events.append((None, chunk(delta)))
        if not reply.truncate:
            events.append((None, chunk({}, finish)))
            last = {
                "id": "chatcmpl-loopback",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [],
                "usage": usage_json,
            }
            events += [(None, last), (None, "[DONE]")]
        return SSE(
            events=events,
            delay=reply.chunk_delay,
            stall_after=_stall(reply, 1),
            reset_after=_reset(reply, 1),
        )

    def error(
        self, status: int, message: str = "error", retry_after: float | None = None
    ) -> Respond:
        kind = (
            "rate_limit_error"
            if status == 429
            else "server_error"
            if status >= 500
            else "invalid_request_error"
        )
        return Respond(
            status=status,
            body={"error": {"message": message, "type": kind, "param": None, "code": None}},
            headers=_retry_headers(retry_after),
        )


class AnthropicDialect(Dialect):
    """Messages API (``POST /v1/messages``), JSON and SSE."""

    name = "anthropic"

    def render(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        usage = self._usage(reply)
        outcome = reply.outcome()
        stop = reply.raw_stop_reason or _ANTHROPIC_STOP.get(outcome, outcome)
        blocks: list[dict[str, Any]] = []
        if reply.thinking:
            blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": "sig"})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for i, c in enumerate(reply.tool_calls):
            tool_input: Any = c.arguments if c.raw_arguments is None else c.raw_arguments
            blocks.append(
                {
                    "type": "tool_use",
                    "id": c.id or f"toolu_{i}",
                    "name": c.name,
                    "input": tool_input,
                }
            )
        usage_json = {
            "input_tokens": max(
                0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens
            ),
            "output_tokens": usage.output_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
        }
        message = {
            "id": "msg_loopback",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage_json,
        }
        if not self.wants_stream(request):
            return Respond(body=message)
        return self._stream(reply, message, usage_json, stop, usage.output_tokens)

    def _stream(
        self,
        reply: Reply,
        message: dict[str, Any],
        usage_json: dict[str, Any],
        stop: str,
        output_tokens: int,
    ) -> SSE:
        """The message as SSE events: a block each for the thinking, the text (in pieces)
        and every tool call (its input in two halves), then the stop reason."""
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {**usage_json, "output_tokens": 1}
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start}),
            ("ping", {"type": "ping"}),
        ]
        index = 0
        if reply.thinking:
            events += [
                _block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
                _block_delta(index, {"type": "thinking_delta", "thinking": reply.thinking}),
                _block_delta(index, {"type": "signature_delta", "signature": "sig"}),
                _block_stop(index),
            ]
            index += 1
        if reply.text:
            events.append(_block_start(index, {"type": "text", "text": ""}))
            for n, piece in enumerate(self._chunks(reply)):
                if reply.stream_error is not None and n >= reply.error_after:
                    break
                events.append(_block_delta(index, {"type": "text_delta", "text": piece}))
            if reply.stream_error is not None:
                return SSE(events=[*events, _anthropic_error(reply.stream_error)])
            events.append(_block_stop(index))
            index += 1
        for i, c in enumerate(reply.tool_calls):
            block = {"type": "tool_use", "id": c.id or f"toolu_{i}", "name": c.name, "input": {}}
            events.append(_block_start(index, block))
            for part in _halves(self._args(c)):
                events.append(
                    _block_delta(index, {"type": "input_json_delta", "partial_json": part})
                )
            events.append(_block_stop(index))
            index += 1
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                },
            )
        )
        if reply.stream_error is not None:
            events.append(_anthropic_error(reply.stream_error))
        elif not reply.truncate:
            events.append(("message_stop", {"type": "message_stop"}))
        return SSE(
            events=events,
            delay=reply.chunk_delay,
            stall_after=_stall(reply, 3),
            reset_after=_reset(reply, 3),
        )

    def error(
        self, status: int, message: str = "error", retry_after: float | None = None
    ) -> Respond:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return Respond(
            status=status,
            body={"type": "error", "error": {"type": kind, "message": message}},
            headers=_retry_headers(retry_after),
        )

    def malformed(self) -> Respond:
        return Respond(status=200, body=b'{"id": "msg_x", "type": "message", "content": [{"ty')


class GoogleDialect(Dialect):
    """Gemini API (``:generateContent`` and ``:streamGenerateContent?alt=sse``)."""

    name = "google"

    def wants_stream(self, request: RecordedRequest) -> bool:
        return "streamGenerateContent" in request.path

    def render(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        usage = self._usage(reply)
        usage_json = {
            "promptTokenCount": usage.input_tokens,
            "candidatesTokenCount": usage.output_tokens - usage.reasoning_tokens,
            "totalTokenCount": usage.input_tokens + usage.output_tokens,
        }
        if usage.cache_read_tokens:
            usage_json["cachedContentTokenCount"] = usage.cache_read_tokens
        if usage.reasoning_tokens:
            usage_json["thoughtsTokenCount"] = usage.reasoning_tokens
        outcome = reply.outcome()
        finish = reply.raw_stop_reason or _GOOGLE_FINISH.get(outcome, outcome)

        def calls_parts() -> list[dict[str, Any]]:
            parts = []
            for i, c in enumerate(reply.tool_calls):
                args: Any = c.arguments if c.raw_arguments is None else c.raw_arguments
                parts.append(
                    {"functionCall": {"id": c.id or f"fc_{i}", "name": c.name, "args": args}}
                )
            return parts

        def response(
            parts: list[dict[str, Any]], finish: str | None, with_usage: bool
        ) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if finish:
                candidate["finishReason"] = finish
            out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model}
            if with_usage:
                out["usageMetadata"] = usage_json
            return out

        if not self.wants_stream(request):
            parts = ([{"text": reply.text}] if reply.text else []) + calls_parts()
            return Respond(body=response(parts, finish, True))
        events: list[tuple[str | None, Any]] = [
            (None, response([{"text": piece}], None, False)) for piece in self._chunks(reply)
        ]
        if reply.stream_error is not None:
            status, code = _GOOGLE_ERRORS[reply.stream_error]
            error = {"error": {"code": status, "message": f"loopback {code}", "status": code}}
            return SSE(events=[*events[: reply.error_after], (None, error)])
        events.append((None, response(calls_parts(), None if reply.truncate else finish, True)))
        return SSE(
            events=events,
            delay=reply.chunk_delay,
            stall_after=_stall(reply, 0),
            reset_after=_reset(reply, 0),
        )

    def error(
        self, status: int, message: str = "error", retry_after: float | None = None
    ) -> Respond:
        code = {
            400: "INVALID_ARGUMENT",
            401: "UNAUTHENTICATED",
            403: "PERMISSION_DENIED",
            404: "NOT_FOUND",
            429: "RESOURCE_EXHAUSTED",
            500: "INTERNAL",
            503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED",
        }.get(status, "UNKNOWN")
        error: dict[str, Any] = {"code": status, "message": message, "status": code}
        if retry_after is not None:
            # Gemini says how long to wait in the body (google.rpc.RetryInfo), not a header.
            error["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": f"{retry_after:g}s",
                }
            ]
        return Respond(status=status, body={"error": error})

    def malformed(self) -> Respond:
        return Respond(status=200, body=b'{"candidates": [{"content": {"parts": [{"te')


_OPENAI_FINISH = {"refusal": "stop", "pause": "stop", "malformed_tool_call": "stop"}
_OPENAI_ERRORS = {
    "overloaded": "server_error",
    "server": "server_error",
    "rate_limit": "rate_limit_exceeded",
    "bad_request": "invalid_request_error",
}
_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
    "pause": "pause_turn",
    "malformed_tool_call": "end_turn",
}
_ANTHROPIC_ERRORS = {
    "overloaded": "overloaded_error",
    "server": "api_error",
    "rate_limit": "rate_limit_error",
    "bad_request": "invalid_request_error",
}
_GOOGLE_FINISH = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "length": "MAX_TOKENS",
    "refusal": "SAFETY",
    "content_filter": "SAFETY",
    "pause": "STOP",
    "malformed_tool_call": "MALFORMED_FUNCTION_CALL",
}
_GOOGLE_ERRORS = {
    "overloaded": (503, "UNAVAILABLE"),
    "server": (500, "INTERNAL"),
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "bad_request": (400, "INVALID_ARGUMENT"),
}


def _anthropic_error(kind: str) -> tuple[str, Any]:
    error_type = _ANTHROPIC_ERRORS[kind]
    return ("error", {"type": "error", "error": {"type": error_type, "message": kind}})


def _stall(reply: Reply, preamble: int) -> int | None:
    return None if reply.stall_after is None else preamble + reply.stall_after


def _reset(reply: Reply, preamble: int) -> int | None:
    return None if reply.reset_after is None else preamble + reply.reset_after


def _halves(text: str) -> list[str]:
    """``text`` in two non-empty pieces (one when it is a single character, none when
    empty): how the servers stream a tool call's arguments."""
    half = len(text) // 2
    return [part for part in (text[:half], text[half:]) if part]


def _block_start(index: int, block: dict[str, Any]) -> tuple[str, Any]:
    """An Anthropic ``content_block_start`` event."""
    event = {"type": "content_block_start", "index": index, "content_block": block}
    return ("content_block_start", event)


def _block_delta(index: int, delta: dict[str, Any]) -> tuple[str, Any]:
    """An Anthropic ``content_block_delta`` event."""
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> tuple[str, Any]:
    """An Anthropic ``content_block_stop`` event."""
    return ("content_block_stop", {"type": "content_block_stop", "index": index})
