"""PostgreSQL connection plumbing shared by the backend's modules: the cursor and
connection types, how a lost connection is recognised, and the two outcomes of an attempt
that lost it (nothing left behind, or an answer that never came)."""

from __future__ import annotations

import logging
import os
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
    """The connection broke after a statement was sent: it may or may not have committed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


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
