"""The Provider base class, the request-blocking switch, and transient-error helpers."""

from __future__ import annotations

import abc
import asyncio
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, ClassVar
from urllib.parse import urlsplit

from stepstone.exceptions import ModelRequestsBlockedError, UserError
from stepstone.providers._types import ModelRequest, ModelResponse, NativeTool

__all__ = [
    "BLOCK_ENV_VAR",
    "ModelRequestsBlockedError",
    "Provider",
    "RetryInfo",
    "SDKClientMixin",
    "StreamItem",
    "check_requests_allowed",
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
    """Whether an error is transient, and how long the server asked us to wait."""

    __slots__ = ("retry_after", "retryable")

    def __init__(self, retryable: bool, retry_after: float | None = None) -> None:
        self.retryable = retryable
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"RetryInfo(retryable={self.retryable}, retry_after={self.retry_after})"


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
        if isinstance(exc, TimeoutError | ConnectionError):
            return RetryInfo(True)
        return RetryInfo(False)

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Close network resources (SDK clients); the provider can still be used after."""

    def resolve_model(self, model: str) -> str:
        """Map a tier alias (``"medium"``) to a model id; other strings pass through."""
        return self.tiers.get(model, model)

    def describe(self) -> dict[str, Any]:
        """Short description for events and metadata."""
        return {"provider": self.name, "base_url": self.base_url}


class SDKClientMixin:
    """One SDK client per event loop, closed when that loop shuts down.

    An async HTTP pool cannot outlive the loop it was opened on, and each sync
    ``agent(...)`` call runs on a fresh loop. Each client is tied to a small async generator
    whose ``finally`` closes it: ``asyncio.run`` (and ``asyncio.Runner``) close live async
    generators before closing the loop, so the pool's sockets are released there even when
    nobody calls :meth:`aclose`.
    """

    name: str
    base_url: str | None
    api_key: str | None = None
    max_tokens: int | None = None
    strict_native_tools: bool = False
    #: Environment variables holding the API key, tried in order.
    api_key_envs: ClassVar[tuple[str, ...]] = ()
    #: Environment variable that overrides the endpoint, and the provider's own endpoint.
    base_url_env: ClassVar[str] = ""
    default_base_url: ClassVar[str] = ""
    _client: Any = None
    _client_loop: asyncio.AbstractEventLoop | None = None
    _client_guard: AsyncGenerator[None, None] | None = None

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

    async def _get_client(self) -> Any:
        """This loop's SDK client, once real requests are known to be allowed."""
        check_requests_allowed(self.name, self.base_url)
        return await self._loop_client()

    def _build_client(self) -> Any:
        raise NotImplementedError

    async def _close_client(self, client: Any) -> None:
        await client.close()

    async def _guard(self, client: Any) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self._close_client(client)

    async def _loop_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            client = self._build_client()
            guard = self._guard(client)
            await anext(guard)  # registers the generator with this loop's shutdown hooks
            self._client, self._client_loop, self._client_guard = client, loop, guard
        return self._client

    async def aclose(self) -> None:
        """Close the SDK client of the running loop (its connection pool)."""
        guard, loop = self._client_guard, self._client_loop
        self._client = self._client_loop = self._client_guard = None
        if guard is not None and loop is asyncio.get_running_loop():
            await guard.aclose()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``retry-after`` / ``retry-after-ms`` header value (None if absent)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds)


def retry_after_from_headers(headers: Any) -> float | None:
    """Read ``retry-after-ms`` or ``retry-after`` (seconds) from response headers."""
    if headers is None:
        return None
    ms = parse_retry_after(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    return parse_retry_after(headers.get("retry-after"))


def status_retryable(status: int | None) -> bool:
    """429, 408, 409 (lock timeouts) and every 5xx are worth retrying."""
    return status is not None and (status in (408, 409, 429) or status >= 500)
