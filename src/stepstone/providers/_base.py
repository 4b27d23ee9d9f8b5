"""The Provider base class, the request-blocking switch, and transient-error helpers."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import email.utils
import functools
import json
import os
import re
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, ClassVar
from urllib.parse import urlsplit

from stepstone.core._sync import LoopResource, keep_open, run_sync
from stepstone.exceptions import ModelAPIError, ModelRequestsBlockedError, UserError
from stepstone.providers._types import ModelRequest, ModelResponse, NativeTool

__all__ = [
    "BLOCK_ENV_VAR",
    "NOT_JSON_TYPE",
    "InvalidResponse",
    "ModelRequestsBlockedError",
    "Provider",
    "RetryInfo",
    "SDKClientMixin",
    "StreamItem",
    "check_requests_allowed",
    "invalid_response",
    "json_body",
    "requests_blocked",
]

BLOCK_ENV_VAR = "STEPSTONE_BLOCK_MODEL_REQUESTS"

# A provider stream yields text deltas (``""`` marks progress without text, so idle
# detection sees every wire event) and ends with exactly one ModelResponse.
StreamItem = str | ModelResponse

# A process-wide depth counter (not a contextvar): a pytest fixture, a worker thread and the
# event loop's tasks must all see the same switch.
_block_depth = 0
_block_lock = threading.Lock()
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def requests_blocked() -> bool:
    """True when real model requests are currently forbidden (context or env var)."""
    if _block_depth > 0:
        return True
    return os.environ.get(BLOCK_ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")


def set_blocked(blocked: bool) -> None:
    """Enter (True) or leave (False) one level of request blocking."""
    global _block_depth
    with _block_lock:
        _block_depth = _block_depth + 1 if blocked else max(0, _block_depth - 1)


def check_requests_allowed(provider: str, base_url: str | None) -> None:
    """Raise :class:`ModelRequestsBlockedError` unless requests may go to ``base_url``."""
    if not requests_blocked():
        return
    host = urlsplit(base_url).hostname if base_url else None
    if host in _LOOPBACK_HOSTS:
        return
    raise ModelRequestsBlockedError(
        f"a real {provider} model request (to {base_url or 'the default endpoint'}) was made "
        f"while model requests are blocked; use a scripted model "
        f"(stepstone.testing.FakeModel) or unset {BLOCK_ENV_VAR}"
    )


class RetryInfo:
    """What a provider error is, whether it is transient, and how long to wait.

    Attributes:
        retryable: Whether trying again can succeed.
        retry_after: Seconds the server asked to wait (None: it did not say).
        kind: ``"rate_limit"``, ``"overloaded"``, ``"server"``, ``"connection"``,
            ``"timeout"``, ``"incomplete_stream"``, ``"invalid_response"``,
            ``"bad_request"``, ``"auth"``, ``"not_found"`` or ``"other"``.
        status: The HTTP status, when there was one.
    """

    __slots__ = ("kind", "retry_after", "retryable", "status")

    def __init__(
        self,
        retryable: bool,
        retry_after: float | None = None,
        kind: str = "other",
        status: int | None = None,
    ) -> None:
        self.retryable = retryable
        self.retry_after = retry_after
        self.kind = kind
        self.status = status

    def __repr__(self) -> str:
        return (
            f"RetryInfo(retryable={self.retryable}, retry_after={self.retry_after}, "
            f"kind={self.kind!r}, status={self.status})"
        )


class Provider(abc.ABC):
    """A model backend: turns a :class:`ModelRequest` into a :class:`ModelResponse`.

    Subclass it to add a provider; ``LLMEngine(model, provider=MyProvider())`` or
    ``LLMEngine(MyProvider())`` uses it. Built-in adapters import their SDK lazily.

    Attributes:
        name: The provider's routing name (``"anthropic"``, ``"openai"``...).
        model: The model id to use when the engine was given this provider instead of a
            model string (None: the engine's model string is used).
        tiers: Tier alias → model id, for ``Agent.from_provider(name, tier=...)``.
        strict_native_tools: Raise instead of warning when a native tool is unsupported.
    """

    name: str = "provider"
    #: Whether the adapter hands ``ModelRequest.timeout`` to its SDK (the engine then only
    #: keeps a loose backstop deadline of its own).
    sdk_timeout: ClassVar[bool] = False
    tiers: ClassVar[dict[str, str]] = {}
    native_tools_supported: ClassVar[frozenset[NativeTool]] = frozenset()
    model: str | None = None
    strict_native_tools: bool = False
    base_url: str | None = None

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One non-streamed completion."""

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        """A streamed completion: text deltas, then one final :class:`ModelResponse`."""

    def retry_info(self, exc: BaseException) -> RetryInfo:
        """Classify ``exc``: transient (429, 5xx, network, timeout) or not."""
        if isinstance(exc, TimeoutError):
            return RetryInfo(True, kind="timeout")
        if isinstance(exc, ConnectionError):
            return RetryInfo(True, kind="connection")
        info = getattr(exc, "retry_info", None)
        if isinstance(info, RetryInfo):  # IncompleteStream and other adapter-raised errors
            return info
        if isinstance(exc, ModelAPIError):  # raised by a custom provider: it says itself
            return RetryInfo(exc.retryable, exc.retry_after, exc.kind, exc.status)
        return RetryInfo(False)

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Close network resources (SDK clients); the provider can still be used after."""

    def close(self) -> None:
        """:meth:`aclose` for sync code: close the SDK client (and its connections) this
        thread's sync calls keep open; the next call opens a new one.

        Raises:
            RuntimeError: when called from a thread whose event loop is running; await
                :meth:`aclose` there.
        """
        name = type(self).__name__
        run_sync(self.aclose(), sync_name=f"{name}.close()", async_name=f"{name}.aclose()")

    def resolve_model(self, model: str) -> str:
        """Map a tier alias (``"medium"``) to a model id; other strings pass through."""
        return self.tiers.get(model, model)

    def describe(self) -> dict[str, Any]:
        """Short description for events and metadata."""
        return {"provider": self.name, "base_url": self.base_url}


@functools.lru_cache(maxsize=1)
def shared_ssl_context() -> Any:
    """One TLS context for every SDK client of the process.

    Each thread, and each loop of the user's own (``asyncio.run`` per call), opens its own
    SDK client; building a TLS context (loading the CA bundle) is most of that cost, and a
    context is safe to share between threads and loops.
    """
    import httpx2

    return httpx2.create_ssl_context()


@dataclasses.dataclass(eq=False)
class _LoopClient:
    """One event loop's SDK client and the requests it is serving.

    It refers to its provider weakly, so that a client kept open across a thread's sync
    calls never keeps a dropped provider alive."""

    client: Any
    closer: Callable[[Any], Awaitable[None]]
    owner: weakref.ref[SDKClientMixin]
    loop: asyncio.AbstractEventLoop
    guard: AsyncGenerator[None, None] | None = None
    kept: LoopResource | None = None
    active: int = 0
    closing: bool = False
    closed: bool = False

    async def close(self) -> None:
        """Close the client once, dropping it from its provider's map first (its sockets
        refer to the loop, which must not stay pinned in the map)."""
        if self.closed:
            return
        self.closed = True
        owner = self.owner()
        if owner is not None:
            with owner._clients_lock:
                if owner._clients.get(self.loop) is self:
                    del owner._clients[self.loop]
        await self.closer(self.client)


async def _guard(entry: _LoopClient) -> AsyncGenerator[None, None]:
    """Closes ``entry`` when the loop's shutdown closes its async generators."""
    try:
        yield
    finally:
        await entry.close()


class SDKClientMixin:
    """One SDK client per event loop, never closed under a live request.

    An async HTTP pool cannot outlive the loop it was opened on, and each thread's sync
    ``agent(...)`` calls run on that thread's loop, so several threads calling one agent
    each get their own client (a lock-guarded map from loop to client, never one shared
    slot). On a thread's private sync-call loop the client, and its open connections, are
    kept across the thread's sync calls and closed when that loop is closed (the thread
    ends; the main thread's at interpreter exit), or at the end of a later sync call once
    the provider was garbage-collected. On any other loop the client is tied to a small
    async generator whose ``finally`` closes it: ``asyncio.run`` (and ``asyncio.Runner``)
    close live async generators before closing the loop, so the pool's sockets are released
    there even when nobody calls :meth:`aclose`. An :meth:`aclose` while requests are in
    flight on that loop defers the close to the last of them.
    """

    name: str
    base_url: str | None
    sdk_timeout: ClassVar[bool] = True
    api_key: str | None = None
    max_tokens: int | None = None
    strict_native_tools: bool = False
    #: Environment variables holding the API key, tried in order.
    api_key_envs: ClassVar[tuple[str, ...]] = ()
    #: Environment variable that overrides the endpoint, and the provider's own endpoint.
    base_url_env: ClassVar[str] = ""
    default_base_url: ClassVar[str] = ""

    def _configure(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        max_tokens: int | None,
        strict_native_tools: bool,
    ) -> None:
        """Keep the settings every SDK adapter takes (the endpoint from its env var)."""
        self.api_key = api_key
        self.base_url = base_url or os.environ.get(self.base_url_env) or self.default_base_url
        self.max_tokens = max_tokens
        self.strict_native_tools = strict_native_tools
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        # Re-entrant: a kept client's close, run where the garbage collector collected a
        # dead thread's loop, may land on a thread that holds it.
        self._clients_lock = threading.RLock()

    def _resolve_api_key(self) -> str:
        """The key given, else the first of ``api_key_envs`` that is set."""
        key = self.api_key or next(
            (os.environ[e] for e in self.api_key_envs if os.environ.get(e)), None
        )
        if not key:
            raise UserError(
                f"no API key for {self.name}: set {' or '.join(self.api_key_envs)} or pass "
                f"{type(self).__name__}(api_key=...)"
            )
        return key

    @contextlib.asynccontextmanager
    async def _use_client(self) -> AsyncIterator[Any]:
        """This loop's SDK client for one request (or one whole stream)."""
        check_requests_allowed(self.name, self.base_url)
        entry = await self._loop_entry()
        entry.active += 1
        try:
            yield entry.client
        finally:
            entry.active -= 1
            if entry.closing and entry.active == 0:
                await self._finish(entry)

    def _build_client(self) -> Any:
        raise NotImplementedError

    @staticmethod
    async def _close_client(client: Any) -> None:
        """Close an SDK client (a static method: a kept client must not hold its provider)."""
        await client.close()

    async def _loop_entry(self) -> _LoopClient:
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            entry = self._clients.get(loop)
            if entry is not None and not entry.closing:
                return entry
            entry = _LoopClient(self._build_client(), self._close_client, weakref.ref(self), loop)
            self._clients[loop] = entry
        # Only this loop's tasks see ``entry``. A thread's private sync-call loop keeps it
        # until that loop closes; on any other loop a guard generator ties it to the loop's
        # shutdown (its first step does not suspend).
        entry.kept = keep_open(self, entry.close)
        if entry.kept is None:
            entry.guard = _guard(entry)
            await anext(entry.guard)  # registers the generator with this loop's shutdown hooks
        return entry

    async def _finish(self, entry: _LoopClient) -> None:
        guard, entry.guard = entry.guard, None
        if entry.kept is not None:
            entry.kept.release()
        if guard is not None and not entry.closed:
            await guard.aclose()
        await entry.close()

    async def aclose(self) -> None:
        """Close the SDK client of the running loop (after its in-flight requests end)."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            entry = self._clients.pop(loop, None)
        if entry is None:
            return
        entry.closing = True
        if entry.active == 0:
            await self._finish(entry)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``retry-after`` value: a number of seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        seconds = email.utils.mktime_tz(parsed) - (time.time() if now is None else now)
    return max(0.0, seconds)


def retry_after_from_headers(headers: Any) -> float | None:
    """``retry-after-ms`` (milliseconds), else ``retry-after`` (seconds or HTTP date)."""
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


def should_retry_header(headers: Any) -> bool | None:
    """The server's explicit ``x-should-retry`` verdict (None when absent)."""
    value = None if headers is None else headers.get("x-should-retry")
    if value == "true":
        return True
    if value == "false":
        return False
    return None


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)s\s*$")


def retry_delay_from_body(body: Any) -> float | None:
    """Google's ``RetryInfo.retryDelay`` (``"1.5s"``) from an error body's ``details``."""
    error = body.get("error", body) if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if not isinstance(detail, dict) or not str(detail.get("@type", "")).endswith(
            "google.rpc.RetryInfo"
        ):
            continue
        m = _DURATION.match(str(detail.get("retryDelay", "")))
        if m:
            return float(m.group(1))
    return None


def status_retryable(status: int | None) -> bool:
    """429, 408, 409 (lock timeouts) and every 5xx are worth retrying."""
    return status is not None and (status in (408, 409, 429) or status >= 500)


def status_kind(status: int | None) -> str:
    """The error kind an HTTP status means."""
    if status is None:
        return "other"
    if status == 429:
        return "rate_limit"
    if status == 529:
        return "overloaded"
    if status in (408, 504):
        return "timeout"
    if status >= 500:
        return "server"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    return "bad_request"


#: Error kinds that are transient whatever the status says.
RETRYABLE_KINDS = frozenset(
    {
        "rate_limit",
        "overloaded",
        "server",
        "connection",
        "timeout",
        "incomplete_stream",
        "invalid_response",
    }
)


def classify(
    *, status: int | None, error_type: str | None, table: dict[str, str], headers: Any = None
) -> RetryInfo:
    """One adapter's verdict: the error type from its table wins over the status (stream
    error events arrive with status 200); ``x-should-retry`` wins over both."""
    kind = table.get(error_type or "") or status_kind(status)
    if status == 200 and kind == "bad_request":
        kind = "other"
    retryable = kind in RETRYABLE_KINDS or (kind != "other" and status_retryable(status))
    verdict = should_retry_header(headers)
    if verdict is not None:
        retryable = verdict
    return RetryInfo(retryable, retry_after_from_headers(headers), kind, status)


_TRANSPORT_TIMEOUTS = frozenset(
    {"TimeoutException", "ReadTimeout", "ConnectTimeout", "PoolTimeout"}
)
_TRANSPORT_ERRORS = frozenset(
    {"TransportError", "NetworkError", "ConnectError", "ReadError", "RemoteProtocolError"}
)


def transport_info(exc: BaseException) -> RetryInfo | None:
    """Raw HTTP-transport errors an SDK lets through (a reset mid-stream): transient."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TRANSPORT_TIMEOUTS:
        return RetryInfo(True, kind="timeout")
    if names & _TRANSPORT_ERRORS:
        return RetryInfo(True, kind="connection")
    return None


class IncompleteStream(Exception):
    """An adapter saw a stream end without its terminal event (classified retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_info = RetryInfo(True, kind="incomplete_stream")


#: What :func:`invalid_response` says of a 200 answer whose content type is not JSON.
NOT_JSON_TYPE = "its content type is not JSON"


class InvalidResponse(Exception):
    """A provider answered (HTTP 200) with a body, or a stream event, that is not valid JSON:
    cut off or damaged on the way. Classified retryable, like a connection reset."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_info = RetryInfo(True, kind="invalid_response", status=200)


def invalid_response(provider: str, model: str, detail: str, body: str | None) -> InvalidResponse:
    """The :class:`InvalidResponse` for a body of ``provider`` that is not JSON."""
    shown = "" if body is None else f"; it began {body[:200]!r}"
    return InvalidResponse(
        f"{provider} answered the request for {model!r} (HTTP 200) with a body that is not "
        f"valid JSON ({detail}){shown}"
    )


@contextlib.contextmanager
def json_body(
    provider: str, model: str, also: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """Around an SDK call (or the reading of its stream): a response body the SDK could not
    parse as JSON (``JSONDecodeError``, or one of ``also``, the SDK's own error for it) is
    an :class:`InvalidResponse` naming the provider and the model."""
    try:
        yield
    except json.JSONDecodeError as exc:
        raise invalid_response(provider, model, str(exc), exc.doc) from exc
    except also as exc:
        raise invalid_response(provider, model, str(exc)[:300], None) from exc
