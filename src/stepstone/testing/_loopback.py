"""Loopback provider servers: real HTTP on 127.0.0.1 speaking a provider's wire format.

The official SDKs talk to these servers exactly as they talk to the real APIs (JSON and
SSE over HTTP/1.1), so retries, timeouts, stalls and malformed bodies are exercised through
the SDK's real code path. The server runs its own event loop in a thread, so sync and async
tests can both use it::

    from stepstone.testing import LoopbackServer, OpenAIDialect, call, Hang

    with LoopbackServer(OpenAIDialect()) as server:
        server.push(call("add", a=1, b=2), "3")          # scripted replies, as for FakeModel
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        Agent(engine=LLMEngine("gpt-4o", provider=provider), tools=[add])("1+2?")
        server.requests[0].json()["tools"]                 # what the SDK sent

Script items are :class:`FakeModel` items (rendered as JSON or SSE depending on whether
the request asked to stream) or raw actions: :class:`Respond`, :class:`SSE`,
:class:`Hang` (never answer), :class:`Reset` (TCP reset), :meth:`Dialect.error` (a
provider-shaped error with an optional ``retry-after``) and :meth:`Dialect.malformed`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import http
import json
import socket
import struct
import threading
from typing import Any

from stepstone.providers._types import ToolCall, Usage
from stepstone.testing._scripted import Reply, to_reply

__all__ = [
    "SSE",
    "AnthropicDialect",
    "Dialect",
    "GoogleDialect",
    "Hang",
    "LoopbackServer",
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


class LoopbackServer:
    """An HTTP/1.1 server on 127.0.0.1 answering from a script (see the module docstring).

    Args:
        dialect: The wire format scripted replies are rendered in.
        latency: Seconds to wait before every answer (simulated network + model time).
        model: The model id reported in responses.
        default: Item used when the script is empty (None: answer 418 "script exhausted").
    """

    def __init__(
        self,
        dialect: Dialect | None = None,
        *,
        latency: float = 0.0,
        model: str = "loopback-model",
        default: Any = None,
    ) -> None:
        self.dialect = dialect or OpenAIDialect()
        self.latency = latency
        self.model = model
        self.default = default
        self.requests: list[RecordedRequest] = []
        self._script: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The SDK ``base_url`` for this server's dialect."""
        return self.dialect.base_url(self.url)

    def start(self) -> LoopbackServer:
        """Start serving (idempotent)."""
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="stepstone-loopback", daemon=True
        )
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop serving; hung and stalled answers are cancelled."""
        loop = self._loop
        if loop is None:
            return

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(_stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- script ----------------------------------------------------------------------------

    def push(self, *items: Any) -> None:
        """Append script items (FakeModel items or raw actions), one per request."""
        with self._lock:
            self._script.extend(items)

    @property
    def remaining(self) -> int:
        """Script items not used yet."""
        with self._lock:
            return len(self._script)

    def _next(self, request: RecordedRequest) -> Action:
        with self._lock:
            self.requests.append(request)
            item = self._script.popleft() if self._script else self.default
        if item is None:
            return Respond(status=418, body={"error": {"message": "loopback script exhausted"}})
        if isinstance(item, Respond | SSE | Hang | Reset):
            return item
        reply = to_reply(item)
        if any(not c.id for c in reply.tool_calls):
            n = len(self.requests)
            calls = [
                c if c.id else dataclasses.replace(c, id=f"call_{n}_{i}")
                for i, c in enumerate(reply.tool_calls)
            ]
            reply = dataclasses.replace(reply, tool_calls=tuple(calls))
        return self.dialect.render(reply, request, self.model)

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                action = self._next(request)
                if self.latency:
                    await asyncio.sleep(self.latency)
                if not await self._perform(action, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the peer may be gone already
                pass

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
        line = await reader.readline()
        if not line.strip():
            return None
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            key, _, value = raw.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        body = b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            body = b"".join(parts)
        return RecordedRequest(method=method, path=target, headers=headers, body=body)

    @staticmethod
    def _head(status: int, headers: dict[str, str]) -> bytes:
        phrase = (
            http.HTTPStatus(status).phrase
            if status in http.HTTPStatus._value2member_map_
            else "Status"
        )
        lines = [f"HTTP/1.1 {status} {phrase}"] + [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _perform(self, action: Action, writer: asyncio.StreamWriter) -> bool:
        if isinstance(action, Hang):
            await asyncio.Event().wait()
            return False
        if isinstance(action, Reset):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if isinstance(action, Respond):
            body = action.body
            if not isinstance(body, bytes):
                body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            headers = {
                "content-type": action.content_type,
                "content-length": str(len(body)),
                **action.headers,
            }
            writer.write(self._head(action.status, headers) + body)
            await writer.drain()
            return True
        writer.write(
            self._head(
                200,
                {
                    "content-type": "text/event-stream",
                    "cache-control": "no-cache",
                    "transfer-encoding": "chunked",
                },
            )
        )
        await writer.drain()
        for i, (event, data) in enumerate(action.events):
            if action.stall_after is not None and i >= action.stall_after:
                await asyncio.Event().wait()
            if i and action.delay:
                await asyncio.sleep(action.delay)
            payload = data if isinstance(data, str) else json.dumps(data)
            text = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
            chunk = text.encode()
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        if action.stall_after is not None and action.stall_after >= len(action.events):
            await asyncio.Event().wait()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
