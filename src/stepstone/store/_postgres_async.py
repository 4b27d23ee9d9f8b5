"""Step commits (and a worker's claims) on PostgreSQL from async code, on the event loop,
without a thread.

A run awaited on an event loop (a worker's runs, ``await agent.run(...)``,
``arun_many``) commits each step as one statement (``_postgres_commit``). Sent through the
blocking backend, every commit would cost a hop to a worker thread and back (tens of
microseconds of latency and CPU each, and the GIL shared with the loop). Here it is sent on
a psycopg ``AsyncConnection`` instead, awaited on the loop itself.

The same connections send a queued run's claim, a worker's claim of queue entries and its
record of a run's end (``AsyncCommits.send``), each one statement with the same fallback.

Only the common case runs here: the statement sent and the head moved. Anything else is
handed, once, to the blocking backend in a thread, whose rules then decide: a commit that
changed nothing (a lost run, a ``writes=`` key that holds a run) is sent again there and
explained; a server error is sent again there and reported as the store's error; a
connection that broke after sending is settled by reading the head (our version means it
landed; the old version means it surely did not, and it is sent again).

The statement, once sent, runs to its answer even when the awaiting task is cancelled
meanwhile (the cancellation is raised after it), as a commit handed to a thread does: a run
cancelled while its step commits still has that step recorded, so it is not run again on
resume. It is awaited in the caller's own task, with no task of its own to shield it
(which cost about 20 us of CPU per step).

Connections are the backend's own, a few kept idle between commits; psycopg's async
connections use whichever loop is running when they wait, so one set serves every loop and
thread of the process (each connection used by one commit at a time). At most ``max_size``
are open; a commit finding all of them busy goes through the blocking backend instead.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from stepstone.core._threads import to_thread
from stepstone.store._base import JournalRow, RunHead
from stepstone.store._postgres_commit import commit_statement
from stepstone.store._postgres_conn import connection_lost
from stepstone.store._postgres_wire import Reader, asend, moved

if TYPE_CHECKING:
    from stepstone.store._postgres import PostgresBackend

__all__ = ["AsyncCommits", "Failed"]

AsyncConnection = psycopg.AsyncConnection[Any]
T = TypeVar("T")


class Failed(Exception):
    """A statement sent by :meth:`AsyncCommits.send` failed: ``error``, the server's answer
    or a broken connection; ``lost``: the connection broke after sending, so the statement
    may have committed; ``session``: the server process of that connection."""

    def __init__(self, error: psycopg.Error, lost: bool, session: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.lost = lost
        self.session = session


class AsyncCommits:
    """A backend's async connections, and its commits through them."""

    def __init__(self, url: str, kwargs: dict[str, Any], max_size: int, prepare: bool) -> None:
        self._url = url
        self._prepare = prepare
        self._kwargs = kwargs
        self._max = max_size
        self._lock = threading.Lock()
        self._idle: list[AsyncConnection] = []
        self._open = 0  # idle and in use
        self._pid = os.getpid()
        self._closed = False
        # a forked child's copies of its parent's connections: kept referenced (closing
        # them would end the parent's sessions), never used
        self._inherited: list[AsyncConnection] = []

    @property
    def open_connections(self) -> int:
        """How many async connections are open (idle or committing)."""
        return self._open

    async def commit(
        self,
        backend: PostgresBackend,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        """What ``backend.run_commit`` returns (or raises) for the same arguments."""
        sql, params, _ = commit_statement(head, expected_version, rows, writes, self._prepare)
        try:
            landed = await self.send(sql, params, moved)
        except Failed as failed:
            return await to_thread(
                backend.settle_commit,
                head,
                expected_version,
                rows,
                writes,
                failed,
            )
        if landed:
            return True
        # It changed nothing, or it could not be sent here (None): the blocking backend
        # sends it (again) and says why.
        return await to_thread(backend.run_commit, head, expected_version, rows, writes)

    async def send(self, sql: bytes, params: Sequence[Any], read: Reader[T]) -> T | None:
        """``read`` of the results of ``sql`` (one statement, ``%s`` or ``$n``
        placeholders), sent on one of these connections and awaited on the loop; None when
        it cannot go this way (every connection busy, closed, or refused by the server;
        values that are not plain): the caller sends it through the blocking backend.

        Raises:
            Failed: the server answered an error, or the connection broke.
        """
        conn = await self._acquire()
        if conn is None:  # all busy, closed, or the server refused a new connection
            return None
        session = conn.pgconn.backend_pid
        try:
            answer = await asend(conn, sql, params, self._prepare, read)
        except psycopg.Error as exc:
            lost = connection_lost(conn, exc)
            self._discard(conn)
            raise Failed(exc, lost, session) from exc
        except asyncio.CancelledError as exc:
            # The statement ran to its answer first: the connection is idle again, unless
            # the answer was an error (then the cancellation's cause).
            if isinstance(exc.__cause__, psycopg.Error):
                self._discard(conn)
            else:
                self._release(conn)
            raise
        except BaseException:
            self._discard(conn)
            raise
        self._release(conn)
        return answer

    async def _acquire(self) -> AsyncConnection | None:
        with self._lock:
            if os.getpid() != self._pid:  # forked: the parent's connections are not ours
                self._inherited += self._idle
                self._idle, self._open, self._pid = [], 0, os.getpid()
            if self._closed:
                return None
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
                self._open -= 1
            if self._open >= self._max:
                return None
            self._open += 1
        try:
            return await psycopg.AsyncConnection.connect(self._url, **self._kwargs)
        except (psycopg.Error, OSError):
            with self._lock:
                self._open -= 1
            return None  # the blocking backend retries and reconnects as it does
        except BaseException:  # cancelled while connecting: that slot was never filled
            with self._lock:
                self._open -= 1
            raise

    def _release(self, conn: AsyncConnection) -> None:
        with self._lock:
            if not self._closed and os.getpid() == self._pid:
                self._idle.append(conn)
                return
        self._discard(conn)

    def _discard(self, conn: AsyncConnection) -> None:
        with self._lock:
            if os.getpid() != self._pid:
                return
            self._open -= 1
        _finish(conn)

    def close(self) -> None:
        """Close the idle connections; those committing close when their commit ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            if os.getpid() != self._pid:
                return
            self._open -= len(idle)
        for conn in idle:
            _finish(conn)


def _finish(conn: AsyncConnection) -> None:
    """Close ``conn`` from any thread or loop: libpq's own close, which needs no loop (the
    connection is idle or broken, so there is nothing to wait for)."""
    if not conn.closed:
        conn.pgconn.finish()
