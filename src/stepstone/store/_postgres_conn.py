"""PostgreSQL connection plumbing shared by the backend's modules: the cursor and
connection types, how a lost connection is recognised, and the two outcomes of an attempt
that lost it (nothing left behind, or an answer that never came)."""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

__all__ = [
    "Connection",
    "Cursor",
    "abandon",
    "close_pool",
    "connection_lost",
    "Lost",
    "one",
    "Unknown",
    "warmest_first",
]

log = logging.getLogger("stepstone")

Cursor = psycopg.Cursor[Any]
Connection = psycopg.Connection[Any]

# Connection failures: class 08 (connection exception), and the server shutting down
# (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now).
LOST_STATES = ("57P01", "57P02", "57P03")


class Lost(Exception):
    """The connection broke and the attempt left nothing behind: safe to retry."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Unknown(Exception):
    """The connection broke after a statement was sent: it may or may not have committed.
    ``session``: the server process that ran it (it may still be running it: once that
    process has ended, the statement has committed or never will)."""

    def __init__(self, cause: BaseException, session: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.session = session


def connection_lost(
    conn: Connection | psycopg.AsyncConnection[Any] | None, exc: BaseException
) -> bool:
    if isinstance(exc, PoolTimeout):
        return True
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("08") or state in LOST_STATES


def close_pool(pool: ConnectionPool[Any], pid: int) -> None:
    # A forked child must not close its parent's connections (that would end their
    # sessions on the server too).
    if os.getpid() == pid:
        pool.close()


class _WarmestFirst(deque[Any]):
    """A pool's idle connections, taken from the end they are returned to."""

    def popleft(self) -> Any:
        return self.pop()


def warmest_first(pool: ConnectionPool[Any]) -> bool:
    """Make ``pool`` (not opened yet) hand out the idle connection returned last: whether
    it could.

    psycopg_pool hands its idle connections out in turn: it returns them to one end of a
    deque and takes them from the other. A run commits its steps one after another, and a
    pool holds two idle connections as soon as a second was opened once while the first
    was busy (a claim reading the server's clock does that). Its commits then alternate
    between two server processes, each woken with cold caches: measured on a 2-core
    machine, 10% more time per step (10-step runs 2.04-2.18x a raw upsert instead of
    1.83-1.97x; 100-step runs 1.59-1.67x instead of 1.49-1.54x). Taken from the end they
    are returned to, the connection that served the last statement serves the next one,
    and connections opened for a burst stay idle until the pool closes them.

    The pool's own shrinking takes from that end too, so it closes the most recently used
    idle connection rather than the least: only how many stay open matters there. A
    psycopg_pool that keeps its idle connections otherwise is left as it is (False).
    """
    idle = getattr(pool, "_pool", None)
    if type(idle) is not deque or idle:
        return False
    pool._pool = _WarmestFirst()
    return True


def abandon(conn: Connection) -> None:
    """Roll back what a pipelined transaction left open (after its error or a failed
    decision), outside the pipeline; a broken connection is left to the pool."""
    try:
        if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute(b"ROLLBACK")
    except psycopg.Error:
        log.debug("stepstone: rollback after a failed transaction failed", exc_info=True)


def one(cur: Cursor) -> Any:
    row = cur.fetchone()
    return None if row is None else row[0]
