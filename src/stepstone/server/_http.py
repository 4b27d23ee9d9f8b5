"""The server's request plumbing: errors as JSON, the Host check, tokens, write guards,
bounded JSON bodies, query values."""

from __future__ import annotations

import hmac
import json
import math
import re
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from stepstone.durable._retention import parse_age
from stepstone.server._config import ServerConfig

__all__ = [
    "HttpError",
    "HostCheck",
    "check_read",
    "check_write",
    "query_age",
    "query_whole",
    "read_json",
]

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class HttpError(Exception):
    """An answer other than 200, with a JSON body ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json_error(status: int, message: str) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": message}, ensure_ascii=False).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    return {"body": body}, headers


class HostCheck:
    """ASGI middleware: on a loopback server, refuse a request whose ``Host`` names another
    machine (a page that rebinds its own name to 127.0.0.1 must not reach the API: DNS
    rebinding), before anything else runs."""

    def __init__(self, app: ASGIApp, *, loopback: bool) -> None:
        self.app = app
        self.loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if "//" in path:  # ``http://host:port//runs``: a doubled slash names the same route
            scope = {**scope, "path": re.sub("/+", "/", path)}
        if scope["type"] == "http" and self.loopback:
            host = ""
            for name, value in scope.get("headers", []):
                if name == b"host":
                    host = value.decode("latin-1")
                    break
            hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if hostname.strip("[]") not in _LOOPBACK_NAMES:
                message = f"Host {host!r} is not this machine; open the server as http://127.0.0.1"
                body, headers = _json_error(403, message)
                await send({"type": "http.response.start", "status": 403, "headers": headers})
                await send({"type": "http.response.body", **body})
                return
        await self.app(scope, receive, send)


def _bearer(request: Request, config: ServerConfig) -> bool:
    """Whether the request carries the configured token (compared in constant time)."""
    assert config.token is not None
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), config.token.encode())


def check_read(request: Request, config: ServerConfig) -> None:
    """A read of the API: with a token configured, it must carry it."""
    if config.token is not None and not _bearer(request, config):
        raise HttpError(
            401, "this server needs its token: send the header `Authorization: Bearer TOKEN`"
        )


def check_write(request: Request, config: ServerConfig) -> None:
    """A write: only when the server has actions on, and with the token when one is set;
    without one (loopback only), only with a header a page of another origin cannot send
    without a CORS preflight, which this server never grants: ``X-Stepstone-Action: 1``
    or a JSON body (``Content-Type: application/json``)."""
    check_read(request, config)
    if not config.actions:
        raise HttpError(
            403,
            "this server is read-only; restart it with `stepstone ui --allow-actions` "
            "(or `stepstone serve` without --read-only)",
        )
    if config.token is not None:
        return
    if not config.loopback:
        raise HttpError(403, "writes off loopback need a token: restart with --token-file FILE")
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if request.headers.get("x-stepstone-action") != "1" and ctype != "application/json":
        raise HttpError(
            403,
            "writes need the X-Stepstone-Action: 1 header or a JSON body "
            "(Content-Type: application/json), which a page of another origin cannot send",
        )


async def read_json(request: Request, config: ServerConfig, *, empty: Any = None) -> Any:
    """The request's JSON body (``empty`` when there is none), read up to ``max_body``
    bytes: a longer one is a 413, one that is not JSON a 400."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > config.max_body:
        raise HttpError(
            413,
            f"the request body is {declared} bytes, more than this server takes "
            f"({config.max_body}; start it with --max-body BYTES for more)",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > config.max_body:
            raise HttpError(
                413,
                f"the request body is more than this server takes ({config.max_body} bytes; "
                "start it with --max-body BYTES for more)",
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the request body is not JSON ({exc}); send a JSON value") from None


def query_whole(request: Request, name: str, least: int) -> int | None:
    """The whole number ``name`` of the query (at least ``least``), None when absent;
    anything else (``inf``, ``nan``, ``2.5``, ``-1``) is a 400 naming it."""
    raw = request.query_params.get(name, "").strip()
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise HttpError(
            400, f"{name}={raw!r} is not a whole number >= {least}; pass e.g. {name}=100"
        )
    return value


def query_age(request: Request, name: str) -> float | None:
    """The age ``name`` in seconds: seconds, or a number and a unit (``90s``, ``15m``,
    ``12h``, ``30d``, ``2w``, as the CLI takes them); None when absent."""
    raw = request.query_params.get(name, "").strip()
    if raw == "":
        return None
    try:
        seconds = float(raw) if raw[-1].isdigit() else parse_age(raw).total_seconds()
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 1e12:
        raise HttpError(
            400,
            f"{name}={raw!r} is not an age; pass seconds (3600) or a number and a unit "
            "(90s, 15m, 12h, 30d, 2w)",
        )
    return seconds


def query_many(request: Request, name: str) -> list[str]:
    """Every value of ``name`` in the query, each also split at commas."""
    return [v for raw in request.query_params.getlist(name) for v in raw.split(",") if v]
