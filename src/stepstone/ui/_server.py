"""The inspector: ``stepstone serve``'s app over a store, read-only unless told."""

from __future__ import annotations

from types import TracebackType

from stepstone.store._store import Store

__all__ = ["InspectorServer"]


class InspectorServer:
    """Serve the inspector for ``store`` on ``host:port`` (port 0: any free port).

    Use :meth:`serve_forever` in the foreground or :meth:`start` for a background thread;
    :meth:`close` stops it (the store stays open: it is the caller's).

    Args:
        store: The store to show.
        host: Interface to bind; keep the default 127.0.0.1 unless the network is trusted
            (read-only pages have no authentication; actions off loopback need ``token``).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        allow_actions: Enable cancelling, retrying and approving from the page.
        poll_seconds: How often the page refreshes.
        page_size: Runs per page of the run list.
        token: The bearer token requests must carry (None: none).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        allow_actions: bool = False,
        poll_seconds: float = 1.0,
        page_size: int = 100,
        token: str | None = None,
    ) -> None:
        from stepstone.server import Server, ServerConfig

        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        config = ServerConfig(
            store=store,
            host=host,
            actions=allow_actions,
            poll_seconds=poll_seconds,
            page_size=page_size,
            token=token,
        )
        self._server = Server(config, port=port)

    @property
    def url(self) -> str:
        """``http://host:port/`` of the running server."""
        return self._server.url

    def serve_forever(self) -> None:
        """Serve until :meth:`close` (or SIGINT/SIGTERM)."""
        self._server.serve_forever()

    def start(self) -> InspectorServer:
        """Serve from a daemon thread; returns self."""
        self._server.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.close()

    def __enter__(self) -> InspectorServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
