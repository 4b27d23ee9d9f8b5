"""A threaded WSGI server for the inspector (standard library only)."""

from __future__ import annotations

import threading
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from stepstone.store._store import Store
from stepstone.ui._app import InspectorApp

__all__ = ["InspectorServer"]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class InspectorServer:
    """Serve the inspector for ``store`` on ``host:port`` (port 0: any free port).

    Use :meth:`serve_forever` in the foreground or :meth:`start` for a background thread;
    :meth:`close` stops it (the store stays open: it is the caller's).

    Args:
        store: The store to show.
        host: Interface to bind; keep the default 127.0.0.1 unless the network is trusted
            (the page has no authentication).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        allow_actions: Enable cancelling runs from the page.
        poll_seconds: How often the page refreshes.
        page_size: Runs per page of the run list.
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
    ) -> None:
        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self.app = InspectorApp(
            store, allow_actions=allow_actions, poll_seconds=poll_seconds, page_size=page_size
        )
        self.app.loopback_only = host in ("127.0.0.1", "localhost", "::1")
        self._httpd = make_server(
            host, port, self.app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port/`` of the running server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def serve_forever(self) -> None:
        """Serve until :meth:`close` (or KeyboardInterrupt)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> InspectorServer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="stepstone-inspector", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> InspectorServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
