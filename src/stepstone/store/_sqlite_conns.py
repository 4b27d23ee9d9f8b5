"""One SQLite connection per thread, closed when its thread ends.

A SQLite connection serves one thread at a time, so the SQLite store and its work queue
keep one per thread. Each is closed when the thread that opened it ends (its thread-local
slot is released, and with it the holder whose finalizer closes the connection), or by
:meth:`ThreadConnections.close_all`. Kept until the store closed, as they used to be, a
process that touches a store from many short-lived threads (a thread per request, an
event loop and its executor per sync call) held two file descriptors per thread that had
ever used it, until it ran out of them.

A connection a forked child inherited is never closed in the child (closing it there
could checkpoint or remove the WAL its parent still writes): the child opens its own.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable

__all__ = ["ThreadConnections"]

#: Connections a forked child inherited: kept referenced, never closed in the child.
_INHERITED: list[sqlite3.Connection] = []


class _Held:
    """A thread's connection, in that thread's local slot."""

    __slots__ = ("__weakref__", "conn", "pid")

    def __init__(self, conn: sqlite3.Connection, pid: int) -> None:
        self.conn = conn
        self.pid = pid


def _close(conn: sqlite3.Connection, pid: int) -> None:
    if os.getpid() != pid:
        _INHERITED.append(conn)
        return
    try:
        conn.close()
    except sqlite3.Error:
        pass  # closing is best effort: the connection is dropped either way


class ThreadConnections:
    """The connections ``connect()`` opens, one per thread (and process)."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._open: set[weakref.finalize[..., _Held]] = set()
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        held: _Held | None = getattr(self._local, "held", None)
        pid = os.getpid()
        if held is not None and held.pid == pid:
            return held.conn
        conn = self._connect()
        held = _Held(conn, pid)
        closer = weakref.finalize(held, _close, conn, pid)
        closer.atexit = False  # at exit the interpreter closes what is left
        with self._lock:
            self._open = {c for c in self._open if c.alive}
            self._open.add(closer)
        self._local.held = held
        return conn

    def close_all(self) -> None:
        """Close every connection, in any thread; the next :meth:`get` opens a new one."""
        with self._lock:
            closing, self._open = self._open, set()
        self._local = threading.local()
        for closer in closing:
            closer()
