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
        server.connections                                 # TCP connections accepted: 1

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
from collections.abc import Callable
from typing import Any

from stepstone.testing._dialects import (
    SSE,
    Action,
    Dialect,
    Hang,
    OpenAIDialect,
    RecordedRequest,
    Reset,
    Respond,
)
from stepstone.testing._scripted import to_reply

__all__ = ["LoopbackServer"]


class LoopbackServer:
    """An HTTP/1.1 server on 127.0.0.1 answering from a script (see the module docstring).

    Args:
        dialect: The wire format scripted replies are rendered in.
        latency: Seconds to wait before every answer (simulated network + model time).
        model: The model id reported in responses.
        default: Item used when the script is empty (None: answer 418 "script exhausted").
        respond: Computes the item for a request when the script is empty (a function of
            the :class:`RecordedRequest`, e.g. of how many tool results its messages
            hold), so a client that sends a request again gets the same answer.
    """

    def __init__(
        self,
        dialect: Dialect | None = None,
        *,
        latency: float = 0.0,
        model: str = "loopback-model",
        default: Any = None,
        respond: Callable[[RecordedRequest], Any] | None = None,
    ) -> None:
        self.dialect = dialect or OpenAIDialect()
        self.respond = respond
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
        self._idle: set[asyncio.StreamWriter] = set()
        self.port = 0
        #: TCP connections accepted so far (a client that keeps its connections open
        #: between requests opens one, not one per request).
        self.connections = 0

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

    @property
    def open_connections(self) -> int:
        """Connections the server has not seen closed yet."""
        with self._lock:
            return len(self._tasks)

    def close_idle(self) -> int:
        """Close every keep-alive connection waiting for its next request, as a server does
        when its idle timeout expires; returns how many were closed (their sockets are
        closed when this returns)."""
        loop = self._loop
        if loop is None:
            return 0

        async def _close() -> int:
            idle = list(self._idle)
            for writer in idle:
                writer.close()
            await asyncio.gather(*(w.wait_closed() for w in idle), return_exceptions=True)
            return len(idle)

        return asyncio.run_coroutine_threadsafe(_close(), loop).result(10)

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
        if item is None and self.respond is not None:
            item = self.respond(request)
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
        with self._lock:
            self._tasks.add(task)
            self.connections += 1
            number = self.connections
        try:
            while True:
                self._idle.add(writer)
                try:
                    request = await self._read_request(reader)
                finally:
                    self._idle.discard(writer)
                if request is None:
                    break
                request = dataclasses.replace(request, connection=number)
                action = self._next(request)
                if self.latency:
                    await asyncio.sleep(self.latency)
                if not await self._perform(action, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            with self._lock:
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
            await self._respond(action, writer)
            return True
        return await self._stream(action, writer)

    async def _respond(self, action: Respond, writer: asyncio.StreamWriter) -> None:
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

    async def _stream(self, action: SSE, writer: asyncio.StreamWriter) -> bool:
        """Send ``action``'s events as chunked SSE; False when it reset the connection."""
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
            if action.reset_after is not None and i >= action.reset_after:
                await self._perform(Reset(), writer)
                return False
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
