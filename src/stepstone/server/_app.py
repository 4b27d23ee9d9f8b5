"""The ASGI application: the API, the streams, the inspector's pages, the webhook sender.

Every handler reaches runs through the kernel's calls (``server/_runs.py``), blocking ones
in worker threads; a failure is a JSON body ``{"error": ...}`` with a 4xx status naming the
value and the fix, and a bug is a 500 with no traceback in the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from stepstone.core._threads import to_thread
from stepstone.durable._inspect import missing_run
from stepstone.durable._messages import RunOutcome, StreamItem, run_known
from stepstone.exceptions import StepstoneError
from stepstone.server import _runs
from stepstone.server._config import ServerConfig
from stepstone.server._http import (
    HostCheck,
    HttpError,
    check_read,
    check_write,
    query_age,
    query_many,
    query_whole,
    read_json,
)
from stepstone.server._openapi import openapi
from stepstone.server._pages import HEADERS, static_file
from stepstone.server._streams import StreamHubs, item_data, outcome_data
from stepstone.server._targets import TargetError, Targets
from stepstone.server._watch import WatchHubs
from stepstone.server._webhooks import Dispatcher, WebhookPolicy

__all__ = ["create_app", "end_streams"]

log = logging.getLogger("stepstone")

Handler = Callable[[Request], Awaitable[Response]]


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(
        json.loads(json.dumps(data, default=str)), status_code=status, headers=HEADERS
    )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=HEADERS)


def _status_of(exc: BaseException) -> tuple[int, str]:
    """The answer to an exception a kernel call raised: its status and message."""
    if isinstance(exc, HttpError):
        return exc.status, exc.message
    if isinstance(exc, TargetError):
        return 400, str(exc)
    if isinstance(exc, KeyError):
        msg = str(exc.args[0] if exc.args else exc)
        return (404 if msg.startswith("no run under key") else 409), msg
    if isinstance(exc, StepstoneError | ValueError | RuntimeError | TypeError):
        return 409, str(exc)
    raise exc


def _guarded(fn: Handler) -> Handler:
    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except (HttpError, StepstoneError, KeyError, ValueError, RuntimeError, TypeError) as exc:
            return _error(*_status_of(exc))
        except Exception as exc:
            log.exception("stepstone serve: %s %s failed", request.method, request.url.path)
            return _error(500, f"internal error: {type(exc).__name__}")

    return handler


class _Server:
    """The handlers, over one :class:`ServerConfig`."""

    def __init__(self, config: ServerConfig, policy: WebhookPolicy | None) -> None:
        self.config = config
        self.targets = Targets(config.import_paths, config.registry)
        self.hubs = StreamHubs(config.store)
        self.watches = WatchHubs(config.store, config.poll_seconds)
        self.policy = policy
        self.dispatcher: Dispatcher | None = None
        #: Set when the server stops: every open stream ends at once (see end_streams).
        self.closing = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await to_thread(fn, *args, **kwargs)

    # -- pages ---------------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        return static_file("index.html")

    async def static(self, request: Request) -> Response:
        return static_file(request.path_params["name"])

    async def schema(self, request: Request) -> Response:
        return _json(openapi())

    async def about(self, request: Request) -> Response:
        check_read(request, self.config)
        return _json(
            {
                "store": self.config.store.describe(),
                "actions": self.config.actions,
                "poll_seconds": self.config.poll_seconds,
                "page_size": self.config.page_size,
            }
        )

    # -- runs ----------------------------------------------------------------------------
    async def start_run(self, request: Request) -> Response:
        check_write(request, self.config)
        body = await read_json(request, self.config)
        out = await self.call(_runs.start_run, self.config, self.targets, body)
        return _json(out, 202)

    async def _listing(self, request: Request) -> dict[str, Any]:
        """The runs ``request``'s query string asks for (``GET /runs`` and the page API)."""
        query = request.query_params
        out: dict[str, Any] = await self.call(
            _runs.list_runs,
            self.config,
            statuses=query_many(request, "status"),
            kinds=query_many(request, "kind"),
            prefix=query.get("prefix") or None,
            error_text=query.get("error") or None,
            queue=query.get("queue") or None,
            older_than=query_age(request, "older_than"),
            newer_than=query_age(request, "newer_than"),
            limit=query_whole(request, "limit", 1),
            offset=query_whole(request, "offset", 0) or 0,
            group=query.get("group") or None,
        )
        return out

    async def list_runs(self, request: Request) -> Response:
        check_read(request, self.config)
        out = await self._listing(request)
        return _json(out)

    async def get_run(self, request: Request) -> Response:
        check_read(request, self.config)
        key = request.path_params["key"]
        full = request.query_params.get("full") == "1"
        return _json(await self.call(_runs.run_view, self.config, key, full=full))

    async def cancel(self, request: Request) -> Response:
        check_write(request, self.config)
        body = await read_json(request, self.config, empty={})
        reason = (body or {}).get("reason") if isinstance(body, dict) else None
        reason = reason or request.query_params.get("reason") or "cancelled through the API"
        key = request.path_params["key"]
        return _json(await self.call(_runs.cancel, self.config, key, str(reason)))

    async def resume(self, request: Request) -> Response:
        check_write(request, self.config)
        await read_json(request, self.config)
        key = request.path_params["key"]
        return _json(await self.call(_runs.resume, self.config, key))

    async def retry(self, request: Request) -> Response:
        check_write(request, self.config)
        await read_json(request, self.config)
        key = request.path_params["key"]
        step = request.query_params.get("from", "")
        return _json(await self.call(_runs.retry, self.config, key, step))

    async def fork(self, request: Request) -> Response:
        check_write(request, self.config)
        await read_json(request, self.config)
        q = request.query_params
        key = request.path_params["key"]
        return _json(
            await self.call(_runs.fork, self.config, key, q.get("at", ""), q.get("to", ""))
        )

    async def message(self, request: Request) -> Response:
        check_write(request, self.config)
        value = await read_json(request, self.config)
        key, topic = request.path_params["key"], request.path_params["topic"]
        return _json(await self.call(_runs.message, self.config, key, topic, value), 202)

    async def approval(self, request: Request) -> Response:
        check_write(request, self.config)
        body = await read_json(request, self.config)
        key, call_id = request.path_params["key"], request.path_params["call_id"]
        return _json(await self.call(_runs.approve, self.config, key, call_id, body))

    async def diff(self, request: Request) -> Response:
        check_read(request, self.config)
        q = request.query_params
        return _json(await self.call(_runs.diff, self.config, q.get("a", ""), q.get("b", "")))

    # -- a queue's webhook ----------------------------------------------------------------
    async def queue_hook(self, request: Request) -> Response:
        check_read(request, self.config)
        return _json(await self.call(_runs.queue_hook, self.config, request.path_params["queue"]))

    async def set_queue_hook(self, request: Request) -> Response:
        check_write(request, self.config)
        body = await read_json(request, self.config)
        queue = request.path_params["queue"]
        return _json(await self.call(_runs.set_queue_hook, self.config, queue, body))

    async def drop_queue_hook(self, request: Request) -> Response:
        check_write(request, self.config)
        queue = request.path_params["queue"]
        return _json(await self.call(_runs.drop_queue_hook, self.config, queue))

    # -- streams -------------------------------------------------------------------------
    async def stream(self, request: Request) -> Response:
        check_read(request, self.config)
        key, name = request.path_params["key"], request.path_params["name"]
        last = request.headers.get("last-event-id", "").strip()
        if last:
            if not last.isdigit():
                raise HttpError(400, f"Last-Event-ID {last!r} is not an offset (a whole number)")
            start = int(last) + 1
        else:
            start = query_whole(request, "from", 0) or 0
        if not await self.call(run_known, self.config.store, key):
            raise HttpError(404, await self.call(missing_run, self.config.store, key))

        async def events() -> AsyncIterator[ServerSentEvent]:
            last_id: int | None = start - 1 if start else None
            async for item in _until(self.closing, self.hubs.follow(key, name, start)):
                if isinstance(item, StreamItem):
                    last_id = item.offset
                    yield ServerSentEvent(data=item_data(item), event="item", id=str(item.offset))
                elif isinstance(item, RunOutcome):
                    yield ServerSentEvent(
                        data=outcome_data(item),
                        event="end",
                        id=None if last_id is None else str(last_id),
                    )

        return EventSourceResponse(events(), ping=15, headers=HEADERS, sep="\n")

    async def watch(self, request: Request) -> Response:
        check_read(request, self.config)
        key = request.path_params["key"]
        if not await self.call(run_known, self.config.store, key):
            raise HttpError(404, await self.call(missing_run, self.config.store, key))

        async def events() -> AsyncIterator[ServerSentEvent]:
            async for state in _until(self.closing, self.watches.follow(key)):
                yield ServerSentEvent(data=json.dumps(state, default=str), event="run")
            if not self.closing.is_set():
                yield ServerSentEvent(data=json.dumps({"key": key, "gone": True}), event="gone")

        return EventSourceResponse(events(), ping=15, headers=HEADERS, sep="\n")

    # -- the inspector's page API (query-string form, as `stepstone ui` served it) -------
    async def page_runs(self, request: Request) -> Response:
        check_read(request, self.config)
        out = await self._listing(request)
        out.update(
            store=self.config.store.describe(),
            allow_actions=self.config.actions,
            poll_seconds=self.config.poll_seconds,
            page_size=self.config.page_size,
        )
        return _json(out)

    async def page_run(self, request: Request) -> Response:
        check_read(request, self.config)
        key = request.query_params.get("key", "")
        if not key:
            raise HttpError(400, "pass ?key=RUN_KEY")
        full = request.query_params.get("full") == "1"
        return _json(await self.call(_runs.run_view, self.config, key, full=full))

    async def page_cancel(self, request: Request) -> Response:
        check_write(request, self.config)
        q = request.query_params
        reason = q.get("reason") or "cancelled from the web inspector"
        return _json(await self.call(_runs.cancel, self.config, q.get("key", ""), reason))

    async def page_retry(self, request: Request) -> Response:
        check_write(request, self.config)
        q = request.query_params
        return _json(await self.call(_runs.retry, self.config, q.get("key", ""), q.get("step", "")))

    async def page_approve(self, request: Request) -> Response:
        check_write(request, self.config)
        q = request.query_params
        body: dict[str, Any] = {"replace": q.get("replace") == "1", "resume": False}
        if "deny" in q:
            body["deny"] = q["deny"]
        out = await self.call(
            _runs.approve, self.config, q.get("key", ""), q.get("call_id", ""), body
        )
        if out["changed"] and not out.get("requeued"):
            out["outcome"] = out["outcome"].replace("; the run's next resume applies it", "")
            out["outcome"] += "; the run's next resume applies it"
        return _json(out)

    # -- lifespan ------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = asyncio.get_running_loop()
        if self.policy is not None and self.config.deliver_webhooks:
            self.dispatcher = Dispatcher(self.config.store, self.policy)
            self.dispatcher.start()
        try:
            yield
        finally:
            if self.dispatcher is not None:
                await self.dispatcher.stop()
            await self.hubs.close()
            await self.watches.close()


async def _until(closing: asyncio.Event, items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``items`` until they end or ``closing`` is set (the server stops: the stream ends,
    and an EventSource client reconnects, to this server started again or another)."""
    closed = asyncio.ensure_future(closing.wait())
    following: asyncio.Future[Any] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(items))
            await asyncio.wait({following, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                return  # closing: the read in flight is cancelled below
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        closed.cancel()
        # closing, or the client went away (this generator cancelled or closed): the
        # read in flight is cancelled too, so ``items`` runs its own cleanup (a hub drops
        # the client, and stops with its last one)
        if following is not None and not following.done():
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await following


def end_streams(app: ASGIApp) -> None:
    """End every open stream of ``app`` (made by :func:`create_app`) now; callable from
    any thread. A server stopped from another thread gets no signal, so its streams
    would otherwise hold uvicorn's graceful shutdown for its whole timeout."""
    inner = app.app if isinstance(app, HostCheck) else app
    server: _Server = inner.state.server  # type: ignore[attr-defined]
    loop = server.loop
    if loop is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing open
            loop.call_soon_threadsafe(server.closing.set)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error(404, f"no route {request.method} {request.url.path}")
    if exc.status_code == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path}")
    return _error(exc.status_code, str(exc.detail))


async def _internal(request: Request, exc: Exception) -> Response:
    log.exception("stepstone serve: %s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, f"internal error: {type(exc).__name__}")


def create_app(config: ServerConfig, *, webhooks: WebhookPolicy | None = None) -> ASGIApp:
    """The server's ASGI application over ``config`` (run it with uvicorn, or any ASGI
    server); ``webhooks``: how to sign and deliver webhooks (None: runs cannot ask for
    one)."""
    if webhooks is not None and config.webhook_secret is None:
        config = _with_secret(config, webhooks.secret)
    server = _Server(config, webhooks)
    g = _guarded
    k = "/runs/{key:path}"
    routes = [
        Route("/", g(server.index)),
        Route("/static/{name}", g(server.static)),
        Route("/openapi.json", g(server.schema)),
        Route("/about", g(server.about)),
        Route("/runs", g(server.start_run), methods=["POST"]),
        Route("/runs", g(server.list_runs), methods=["GET"]),
        Route("/diff", g(server.diff)),
        Route("/queues/{queue}/webhook", g(server.queue_hook), methods=["GET"]),
        Route("/queues/{queue}/webhook", g(server.set_queue_hook), methods=["PUT"]),
        Route("/queues/{queue}/webhook", g(server.drop_queue_hook), methods=["DELETE"]),
        Route(k + "/streams/{name}", g(server.stream)),
        Route(k + "/watch", g(server.watch)),
        Route(k + "/cancel", g(server.cancel), methods=["POST"]),
        Route(k + "/resume", g(server.resume), methods=["POST"]),
        Route(k + "/retry", g(server.retry), methods=["POST"]),
        Route(k + "/fork", g(server.fork), methods=["POST"]),
        Route(k + "/messages/{topic}", g(server.message), methods=["POST"]),
        Route(k + "/approvals/{call_id}", g(server.approval), methods=["POST"]),
        Route(k, g(server.get_run), methods=["GET"]),
        Route("/api/runs", g(server.page_runs)),
        Route("/api/run", g(server.page_run)),
        Route("/api/cancel", g(server.page_cancel), methods=["POST"]),
        Route("/api/retry", g(server.page_retry), methods=["POST"]),
        Route("/api/approve", g(server.page_approve), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=server.lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _internal},
    )
    app.state.server = server
    return HostCheck(app, loopback=config.loopback)


def _with_secret(config: ServerConfig, secret: str) -> ServerConfig:
    import dataclasses

    return dataclasses.replace(config, webhook_secret=secret)
