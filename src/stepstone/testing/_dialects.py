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
    """

    events: list[tuple[str | None, Any]]
    delay: float = 0.0
    stall_after: int | None = None


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
    """Chat Completions (``POST /v1/chat/completions``), JSON and SSE."""

    name = "openai"

    def base_url(self, server_url: str) -> str:
        return server_url + "/v1"

    def render(self, reply: Reply, request: RecordedRequest, model: str) -> Action:
        usage = self._usage(reply)
        usage_json = {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        }
        finish = "tool_calls" if reply.tool_calls else "stop"
        calls = [
            {"id": c.id or f"call_{i}", "name": c.name, "arguments": self._args(c)}
            for i, c in enumerate(reply.tool_calls)
        ]
        if not self.wants_stream(request):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
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

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-loopback",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
        events += [(None, chunk({"content": piece})) for piece in self._chunks(reply)]
        for i, c in enumerate(calls):
            head = {
                "index": i,
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": ""},
            }
            events.append((None, chunk({"tool_calls": [head]})))
            args = c["arguments"]
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                if part:
                    events.append(
                        (
                            None,
                            chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                        )
                    )
        events.append((None, chunk({}, finish)))
        events.append(
            (
                None,
                {
                    "id": "chatcmpl-loopback",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": usage_json,
                },
            )
        )
        events.append((None, "[DONE]"))
        return SSE(events=events, delay=reply.chunk_delay, stall_after=_stall(reply, 1))

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
        stop = "tool_use" if reply.tool_calls else "end_turn"
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
        message = {
            "id": "msg_loopback",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        }
        if not self.wants_stream(request):
            return Respond(body=message)
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": usage.input_tokens, "output_tokens": 1}
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start}),
            ("ping", {"type": "ping"}),
        ]
        index = 0
        if reply.thinking:
            events += [
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": reply.thinking},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": "sig"},
                    },
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": index}),
            ]
            index += 1
        if reply.text:
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for piece in self._chunks(reply):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        for i, c in enumerate(reply.tool_calls):
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {
                            "type": "tool_use",
                            "id": c.id or f"toolu_{i}",
                            "name": c.name,
                            "input": {},
                        },
                    },
                )
            )
            args = self._args(c)
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                if part:
                    events.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": part},
                            },
                        )
                    )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage.output_tokens},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return SSE(events=events, delay=reply.chunk_delay, stall_after=_stall(reply, 3))

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
            "candidatesTokenCount": usage.output_tokens,
            "totalTokenCount": usage.input_tokens + usage.output_tokens,
        }

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
            return Respond(body=response(parts, "STOP", True))
        events: list[tuple[str | None, Any]] = [
            (None, response([{"text": piece}], None, False)) for piece in self._chunks(reply)
        ]
        events.append((None, response(calls_parts(), "STOP", True)))
        return SSE(events=events, delay=reply.chunk_delay, stall_after=_stall(reply, 0))

    def error(
        self, status: int, message: str = "error", retry_after: float | None = None
    ) -> Respond:
        code = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}.get(
            status, "UNKNOWN"
        )
        return Respond(
            status=status,
            body={"error": {"code": status, "message": message, "status": code}},
            headers=_retry_headers(retry_after),
        )

    def malformed(self) -> Respond:
        return Respond(status=200, body=b'{"candidates": [{"content": {"parts": [{"te')


def _stall(reply: Reply, preamble: int) -> int | None:
    return None if reply.stall_after is None else preamble + reply.stall_after
