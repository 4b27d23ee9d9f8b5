"""What one server serves and how: the store, where targets come from, who may write."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stepstone.exceptions import ConfigurationError
from stepstone.store import Store

__all__ = ["ServerConfig", "is_loopback"]

#: The largest request body the server reads unless told otherwise (1 MiB).
MAX_BODY = 1 << 20


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """One server's settings (:func:`stepstone.server.create_app`).

    Attributes:
        store: The store it serves (runs, queue, messages, streams, webhooks).
        host: The interface it is bound to; off loopback a server that takes writes needs a
            ``token``, and on loopback the ``Host`` header must name this machine (against
            DNS rebinding).
        import_paths: Folders targets may be imported from; ``POST /runs`` imports no
            module from anywhere else.
        registry: Targets by name, looked up before importing.
        actions: Whether writes are accepted (start, cancel, retry, approve, send); a
            read-only server (``stepstone ui`` without ``--allow-actions``) refuses them.
        token: The bearer token every request to the API must carry (None: none; only
            allowed on loopback).
        max_body: The largest request body in bytes; a larger one is a 413.
        webhook_secret: The Standard Webhooks secret (``whsec_...`` or base64) signing
            the webhooks this server delivers (None: webhooks are refused).
        poll_seconds: How often the inspector's pages refresh what does not stream.
        page_size: Runs per page of a listing, unless the request asks for another.
        deliver_webhooks: Whether this process delivers webhooks from the outbox.
    """

    store: Store
    host: str = "127.0.0.1"
    import_paths: tuple[Path, ...] = ()
    registry: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    actions: bool = True
    token: str | None = None
    max_body: int = MAX_BODY
    webhook_secret: str | None = None
    poll_seconds: float = 1.0
    page_size: int = 100
    deliver_webhooks: bool = True

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError(
                "the token must be at least 16 characters (a random one: "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        if self.token is None and self.actions and not is_loopback(self.host):
            raise ConfigurationError(
                f"serving on {self.host}, off loopback, needs a token: pass --token-file FILE "
                "(clients send it as `Authorization: Bearer TOKEN`), or keep --host 127.0.0.1"
            )
        if not 1 <= self.max_body <= 1 << 31:
            raise ConfigurationError(
                f"max_body must be a number of bytes from 1 to 2**31, got {self.max_body!r}"
            )
        if not self.poll_seconds > 0:
            raise ConfigurationError(f"poll_seconds must be > 0, got {self.poll_seconds!r}")
        if self.page_size < 1:
            raise ConfigurationError(f"page_size must be >= 1, got {self.page_size!r}")

    @property
    def loopback(self) -> bool:
        """Whether the server listens on loopback only."""
        return is_loopback(self.host)
