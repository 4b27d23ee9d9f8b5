"""Running the app: a socket bound at construction (so a taken port or a foreign address
fails at once), uvicorn serving it in the foreground or from a thread, and queue workers in
the same process when asked (``--workers N``)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import uvicorn

from stepstone.server._app import create_app, end_streams
from stepstone.server._config import ServerConfig
from stepstone.server._webhooks import WebhookPolicy

__all__ = ["Server"]


class Server:
    """``config``'s app served on ``config.host`` at ``port`` (0: any free port).

    Args:
        config: What to serve.
        port: TCP port (0 picks a free one; see :attr:`url`).
        webhooks: How webhooks are signed and delivered (None: refused).
        workers: Queue workers' concurrency in this process (0: none; separate
            ``stepstone worker`` processes run the runs).
        queues: The queues those workers serve.
        worker_options: More ``Worker`` arguments (lease_seconds, poll_interval...).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        port: int = 8000,
        webhooks: WebhookPolicy | None = None,
        workers: int = 0,
        queues: Sequence[str] = ("default",),
        worker_options: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.app = create_app(config, webhooks=webhooks)
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((config.host.strip("[]"), port))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._uvicorn = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=5,
            )
        )
        self._thread: threading.Thread | None = None
        self._worker: Any = None
        self._worker_thread: threading.Thread | None = None
        if workers:
            from stepstone.worker import Worker

            self._worker = Worker(
                config.store,
                queues=list(queues),
                concurrency=workers,
                registry=dict(config.registry),
                **(worker_options or {}),
            )

    @property
    def url(self) -> str:
        """``http://host:port/`` of the server."""
        host, port = self._sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}/"

    def _start_worker(self) -> None:
        if self._worker is not None and self._worker_thread is None:
            self._worker_thread = threading.Thread(
                target=self._worker.run, name="stepstone-serve-worker", daemon=True
            )
            self._worker_thread.start()

    def _stop_worker(self) -> None:
        if self._worker_thread is not None:
            self._worker.stop()
            self._worker_thread.join(timeout=self._worker.shutdown_timeout + 10)
            self._worker_thread = None

    def serve_forever(self) -> None:
        """Serve until SIGINT/SIGTERM (in the main thread) or :meth:`close`."""
        self._start_worker()
        try:
            self._uvicorn.run(sockets=[self._sock])
        finally:
            self._stop_worker()

    def start(self) -> Server:
        """Serve from a daemon thread, returning once the server answers."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="stepstone-serve", daemon=True
        )
        self._thread.start()
        while not self._uvicorn.started and self._thread.is_alive():
            self._thread.join(0.01)
        return self

    def close(self) -> None:
        """Stop serving (streams end, the worker hands its runs back) and free the port."""
        end_streams(self.app)
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        else:
            self._stop_worker()
        self._sock.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
