"""PostgreSQL backend: psycopg 3 and a connection pool; the database does all the locking.

Same records as SQLite (plain values, run heads, append-only journals) in tables prefixed
``stepstone_``. Concurrency control is PostgreSQL's:

* ``run_commit`` is one conditional ``UPDATE`` of the head (version and run_uid must
  match) whose journal rows and ``writes=`` values are inserted by the same statement, so
  they exist exactly when the head moved.
* A run awaited on an event loop (a worker's runs, ``await agent.run(...)``) sends its
  claim of an empty key and its step commits on psycopg async connections, awaited on
  the loop, with no hop to a thread (``_postgres_async``), as a worker does its claims of
  queue entries and its records of how runs ended; everything else goes through the pool
  from the caller's thread.
* Every write of a key first takes a transaction-level advisory lock per key (in a fixed
  order, so two writers never deadlock): this keeps a key from becoming a plain value
  and a run at once. ``run_transact`` also reads the head ``FOR UPDATE``, so no commit
  slips in between its read and its write. A step commit with ``writes=`` and a plain
  write send their lock statement and their statement pipelined, as one implicit
  transaction: one round trip.
* ``setup()`` creates or upgrades the schema under a database-wide advisory lock, so any
  number of processes may start at once.

**Lost connections.** A server restart or a network cut breaks pooled connections. Each
primitive then reconnects and retries for up to ``reconnect_timeout`` seconds, but only
what is safe: reads, lease renewals and plain writes are idempotent; a transaction that
failed before its ``COMMIT`` left nothing behind; one that failed during ``COMMIT`` is
looked up (``txid_status``) and only retried if it aborted; a ``run_commit`` whose answer
was lost is checked against the stored head (version and run_uid), so a step is never
committed twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Literal, TypeVar

from stepstone.core._threads import to_thread
from stepstone.exceptions import MissingExtraError, StoreError
from stepstone.store._base import (
    Backend,
    Claim,
    Decide,
    JournalRow,
    RunHead,
    head_from_row,
    head_to_row,
    head_update_params,
    heads_for_listing,
    journal_row,
)
from stepstone.store._changes import CHANNEL, ChangeFeed, ListeningFeed, run_topic
from stepstone.store._extras import EventValue, ExtraWrites, Message, StreamEntry, Timer
from stepstone.store._memory import consumed_already, run_key_conflict
from stepstone.store._webhooks import WEBHOOK_COLUMNS, WebhookRecord

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # tested in a subprocess that blocks the import
    raise MissingExtraError(exc.name or "psycopg", "postgres") from exc

from stepstone.store._postgres_async import AsyncCommits, Failed
from stepstone.store._postgres_commit import WHY_SQL, commit_statement
from stepstone.store._postgres_conn import (
    Connection,
    Cursor,
    Lost,
    Unknown,
    abandon,
    close_pool,
    connection_lost,
    one,
    warmest_first,
)
from stepstone.store._postgres_errors import refused_connection, server_error
from stepstone.store._postgres_schema import (
    CLAIM_FRESH_SQL,
    CLAIM_HEAD,
    CLAIM_READ_ASYNC_SQL,
    CLAIM_READ_SQL,
    DELETE_SQL,
    HEAD_COLS,
    INSERT_JOURNAL_SQL,
    KEY_LOCK_CLASS,
    KEY_STATE_SQL,
    LOCK_XID_SQL,
    MIGRATIONS,
    PUT_HEAD_SQL,
    PUT_SQL,
    UPSERT_KV_SQL,
    check_schema,
    lock_id,
    lock_ids,
    migrate,
    prefix_where,
)
from stepstone.store._postgres_wire import moved, send_commit

__all__ = ["MIGRATIONS", "Connection", "Cursor", "PostgresBackend", "migrate"]

log = logging.getLogger("stepstone")

#: Seconds the connection pool keeps trying to add one connection before it gives up (and
#: a waiting caller asks again: see PostgresBackend._getconn).
_POOL_RECONNECT = 2.0

#: Seconds between two returns of the spare connection to the pool (see _putconn).
_SPARE_RENEW = 60.0

T = TypeVar("T")

_CURSOR = "_stepstone_cursor"  # the cursor _one_statement keeps on each pooled connection


class PostgresBackend(Backend):
    """Durable storage in a PostgreSQL database (see module docstring).

    Args:
        url: A libpq URL (``postgresql://user:password@host:5432/dbname``); percent-encode
            special characters in the password. Query parameters are libpq's
            (``?sslmode=require``, ``?options=-csearch_path%3Dmyschema``).
        min_size: Connections the pool keeps open.
        max_size: Most connections the pool opens (one per concurrent operation; the lease
            keeper thread uses one now and then).
        reconnect_timeout: Seconds to keep reconnecting and retrying after the server went
            away (a restart, a failover) before an operation fails with StoreError.
        connect_timeout: Seconds one connection attempt may take.
        read_only: Inspect an existing store: the schema is checked, never created or
            upgraded, and writes raise StoreError (the server enforces it too: sessions
            are ``default_transaction_read_only``).
        prepare: Prepare the statements each connection runs often (once per connection,
            after a few uses). Pass False behind a pooler that does not keep a session per client
            (PgBouncer in transaction mode).

    The schema is created (or upgraded) by :meth:`setup`, which also runs on first use.
    """

    async_commit = True  # step commits from async code go on async connections

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        reconnect_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        read_only: bool = False,
        prepare: bool = True,
    ) -> None:
        if min_size < 0 or max_size < max(1, min_size):
            raise ValueError(
                f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}"
            )
        if reconnect_timeout < 0:
            raise ValueError(f"reconnect_timeout must be >= 0 seconds, got {reconnect_timeout!r}")
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"invalid PostgreSQL URL: {exc}") from None
        self.url = url
        self.min_size = min_size
        self.max_size = max_size
        self.reconnect_timeout = float(reconnect_timeout)
        self._params = params
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = max(1, round(connect_timeout))
        if "application_name" not in params:
            self._kwargs["application_name"] = "stepstone"
        self.read_only = read_only
        if read_only:
            self._kwargs["options"] = " ".join(
                filter(
                    None, [str(params.get("options") or ""), "-c default_transaction_read_only=on"]
                )
            )
        # psycopg prepares a statement once a connection has run it a few times; None
        # never prepares (PgBouncer in transaction mode hands each transaction a different
        # server connection, which would not have the statement).
        self.prepare = prepare
        if not prepare:
            self._kwargs["prepare_threshold"] = None
        self._pool: ConnectionPool[Any] | None = None
        self._pool_pid = 0
        self._pool_lock = threading.Lock()  # guards pool creation only, never a store operation
        # The connection returned last, kept out of the pool for the next caller (see
        # _putconn); a forked child's copies of the parent's pool and spare are kept
        # referenced in _inherited, never used.
        self._spare: list[Connection] = []
        self._spare_renew = 0.0
        self._inherited: list[object] = []
        self._ready = False
        self._closed = False
        self._offset = 0.0  # server clock minus this host's clock, seconds
        self._offset_at = float("-inf")
        # step commits of runs on an event loop (see _postgres_async)
        self._async = AsyncCommits(url, self._kwargs, max_size, prepare)
        weakref.finalize(self, self._async.close)
        # waiters on messages, events and streams: one LISTEN connection while any waits
        self._feed = ListeningFeed(POLL_INTERVAL, self._listen, name="stepstone-pg-listen")
        weakref.finalize(self, self._feed.close)

    # -- connections -----------------------------------------------------------------------
    def connect(self) -> Connection:
        """A new autocommit connection of its own, with this store's settings (its
        connect timeout, read-only when the store is): for maintenance work outside the
        pool, such as ``vacuum``. The caller closes it."""
        return psycopg.connect(self.url, **self._kwargs)

    def describe(self) -> str:
        p = {k: str(v) for k, v in self._params.items() if v is not None}
        user = p.get("user", "")
        host = p.get("host") or p.get("hostaddr") or "localhost"
        port = p.get("port", "5432")
        return f"postgresql://{user + '@' if user else ''}{host}:{port}/{p.get('dbname', user)}"

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise StoreError(
                f"store {self.describe()} was opened read-only; open it without "
                "read_only=True to write"
            )

    def setup(self) -> None:
        """Create the tables, or upgrade them to this version's schema. Idempotent.

        Safe to call from several processes at once (they queue on an advisory lock).
        Runs automatically on first use; call it at deploy time to fail early on a wrong
        URL or missing privileges.
        """
        if self._closed:
            raise StoreError(f"store {self.describe()} is closed")
        try:
            with self.connect() as conn:
                if self.read_only:
                    check_schema(conn, self.describe())
                else:
                    migrate(conn)
        except psycopg.Error as exc:
            what = "read" if self.read_only else "set up the stepstone schema in"
            mapped = server_error(self.describe(), f"{what} it", exc)
            if mapped is not None:
                raise mapped from exc
            if not isinstance(exc, psycopg.OperationalError):
                raise
            refused = refused_connection(self.describe(), exc)
            if refused is not None:
                raise refused from exc
            raise StoreError(
                f"cannot {what} {self.describe()}: {exc}; check the URL (host, port, "
                "database, user, password) and that the server accepts connections"
            ) from exc
        self._ready = True

    def clock(self) -> float:
        """The server's clock, as this host's clock plus an offset measured on the server
        (re-measured every minute), so leases do not depend on the hosts' clocks agreeing."""
        now = time.time()
        if now - self._offset_at > 60.0:
            try:
                self._measure_offset()
            except StoreError:
                # The server is unreachable: keep the last offset (the operation that
                # needs the server reports the outage itself) and measure again soon.
                log.debug("stepstone: could not read the server clock", exc_info=True)
                self._offset_at = now - 50.0
        return time.time() + self._offset

    def _measure_offset(self) -> None:
        """One attempt, no retries: an unreachable server raises StoreError at once."""
        best: tuple[float, float] | None = None
        try:
            with self._connection(2.0) as conn, conn.cursor() as cur:
                for _ in range(3):  # keep the sample with the shortest round trip
                    before = time.time()
                    server = one(
                        cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
                    )
                    after = time.time()
                    sample = (float(server) - (before + after) / 2, after - before)
                    if best is None or sample[1] < best[1]:
                        best = sample
        except (psycopg.Error, Lost) as exc:
            raise StoreError(f"cannot read the clock of {self.describe()}: {exc}") from exc
        assert best is not None
        self._offset, self._offset_at = best[0], time.time()

    def _pool_here(self) -> ConnectionPool[Any]:
        if self._closed:
            raise StoreError(f"store {self.describe()} is closed")
        if not self._ready:
            self.setup()
        pool = self._pool
        if pool is not None and self._pool_pid == os.getpid():
            return pool
        with self._pool_lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                return self._pool
            if self._pool is not None:
                # Forked: the parent's pool threads did not survive; keep its connections
                # referenced (never closed from here) and open our own.
                self._inherited += (self._pool, self._spare)
                self._spare = []
            pool = ConnectionPool(
                self.url,
                kwargs=self._kwargs,
                min_size=self.min_size,
                max_size=self.max_size,
                open=False,
                name=f"stepstone-{os.getpid()}",
                # Give up on a dead server quickly and reconnect on demand: the pool's own
                # backoff would otherwise grow to minutes while our retries wait.
                reconnect_timeout=_POOL_RECONNECT,
            )
            warmest_first(pool)
            pool.open()
            self._pool, self._pool_pid = pool, os.getpid()
            weakref.finalize(self, close_pool, pool, os.getpid())
            return pool

    def _getconn(self, pool: ConnectionPool[Any], timeout: float) -> Connection:
        try:
            return self._spare.pop()
        except IndexError:
            pass
        # Wait in short turns: the pool makes one attempt (of _POOL_RECONNECT seconds) to
        # add a connection for the clients waiting when it ran out, and none for a client
        # still waiting after that attempt failed. A server back after a short restart
        # would leave such a client waiting out its whole timeout; each turn's retry asks
        # the pool again.
        try:
            turn = min(timeout, _POOL_RECONNECT + 1.0)
            conn: Connection = pool.getconn(timeout=max(0.1, turn))
        except PoolTimeout as exc:
            raise Lost(exc) from exc
        except PoolClosed as exc:
            raise StoreError(f"store {self.describe()} is closed") from exc
        return conn

    @contextmanager
    def _connection(self, timeout: float) -> Iterator[Connection]:
        pool = self._pool_here()
        conn = self._getconn(pool, timeout)
        try:
            yield conn
        finally:
            self._putconn(pool, conn)

    def _putconn(self, pool: ConnectionPool[Any], conn: Connection) -> None:
        """Give ``conn`` back: kept aside as the spare, which the next caller takes first
        (the spare it replaces goes to the pool), or to the pool.

        Every step commit takes a connection and gives it back, and psycopg_pool's
        getconn and putconn (their locks, checks and bookkeeping) cost a run about 18 us
        of CPU per step on a machine where the raw commit costs 300 us, measured A/B.
        The spare skips them for a caller that takes a connection while none is in use
        (a run committing its steps one after another), and, like the pool's own order
        (:func:`warmest_first`), serves the next statement with the connection returned
        last. It is still the pool's (checked out, counted in ``max_size``), and goes
        back to the pool once every ``_SPARE_RENEW`` seconds so the pool's lifetime rules
        still apply to it. A connection in a transaction, or broken, always goes to the
        pool (which rolls it back or discards it).
        """
        if not self._closed and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
            now = time.monotonic()
            if now < self._spare_renew:
                spare = self._spare
                spare.append(conn)
                while len(spare) > 1:  # another thread's, returned before this one
                    try:
                        older = spare.pop(0)
                    except IndexError:  # taken meanwhile
                        break
                    pool.putconn(older)
                return
            self._spare_renew = now + _SPARE_RENEW
        pool.putconn(conn)

    def _retry(self, what: str, attempt: Callable[[float], T]) -> T:
        """Call ``attempt(deadline)`` until it does not raise Lost, for at most
        ``reconnect_timeout`` seconds."""
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.05
        while True:
            try:
                return attempt(deadline)
            except psycopg.Error as exc:
                mapped = server_error(self.describe(), what, exc)
                if mapped is None:
                    raise
                raise mapped from exc
            except Lost as lost:
                left = deadline - time.monotonic()
                first = delay == 0.05
                why = self._why_no_connection(lost.cause) if first or left <= 0 else None
                if left <= 0:
                    if isinstance(why, StoreError):
                        raise why from lost.cause
                    raise StoreError(
                        f"lost the connection to {self.describe()} while trying to {what}, "
                        f"and could not reconnect within reconnect_timeout="
                        f"{self.reconnect_timeout}s: {why or lost.cause}"
                    ) from lost.cause
                # once per operation: a long outage must not flood the log
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "stepstone: connection to %s lost while trying to %s (%s); retrying "
                    "for up to %ss",
                    self.describe(),
                    what,
                    why or lost.cause,
                    self.reconnect_timeout,
                )
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
                self._drop_stale()

    def _why_no_connection(self, cause: BaseException) -> str | StoreError | None:
        """When the pool timed out getting a connection (it keeps its connect errors to
        itself), what a new connection meets now: the store error of a server with no
        connection slot left, the server's refusal, or that one connects. None for any other
        lost connection."""
        if not isinstance(cause, PoolTimeout):
            return None
        try:
            kwargs = {"connect_timeout": 5, **self._kwargs}  # never wait on it for long
            psycopg.connect(self.url, **kwargs).close()
        except psycopg.Error as exc:
            refused = refused_connection(self.describe(), exc)
            return refused if refused is not None else f"{cause}; a new connection fails: {exc}"
        return (
            f"{cause}, while a new connection succeeds now: either all max_size="
            f"{self.max_size} of this store's pooled connections were in use (raise max_size "
            "or run fewer operations at once), or the server accepts connections again only "
            "since just now"
        )

    def _drop_stale(self) -> None:
        """Test the idle pooled connections and replace the broken ones (after a restart
        every idle connection is dead; without this each retry would find the next one)."""
        pool = self._pool
        if pool is not None and self._pool_pid == os.getpid():
            try:
                pool.check()
            except Exception:  # best effort: the retry itself reports real failures
                log.debug("stepstone: pool check failed", exc_info=True)

    def _read(self, what: str, fn: Callable[[Cursor], T]) -> T:
        """Run ``fn`` on a pooled autocommit connection; retried after a lost connection,
        so ``fn`` must be a read or an idempotent single-statement write."""

        def attempt(deadline: float) -> T:
            with self._connection(deadline - time.monotonic()) as conn:
                try:
                    with conn.cursor() as cur:
                        return fn(cur)
                except psycopg.Error as exc:
                    if connection_lost(conn, exc):
                        raise Lost(exc) from exc
                    raise

        return self._retry(what, attempt)

    def _transaction(self, what: str, lock_keys: Sequence[str], fn: Callable[[Cursor], T]) -> T:
        """Run ``fn`` in one transaction holding the advisory locks of ``lock_keys``.

        After a lost connection the transaction is retried (``fn`` runs again) unless its
        COMMIT was sent and the server says it committed: then ``fn``'s result stands.
        """

        def body(conn: Connection, _xids: list[int]) -> T:
            with conn.cursor() as cur:
                return fn(cur)

        return self._in_transaction(what, lock_keys, body, pipeline=False)

    def _pipelined(self, what: str, lock_keys: Sequence[str], fn: Callable[[Connection], T]) -> T:
        """:meth:`_transaction` in pipeline mode: ``fn`` queues statements with
        ``conn.execute`` and the server gets them only when ``fn`` fetches a result (or at
        COMMIT), so BEGIN, the lock and ``fn``'s reads cost one round trip, and its writes
        with the COMMIT another."""
        return self._in_transaction(what, lock_keys, lambda conn, _xids: fn(conn), pipeline=True)

    def _in_transaction(
        self,
        what: str,
        lock_keys: Sequence[str] | None,
        fn: Callable[[Connection, list[int]], T],
        pipeline: bool,
    ) -> T:
        """The transaction of :meth:`_transaction` and :meth:`_pipelined`. With
        ``lock_keys`` None, ``fn`` takes the locks itself and appends the transaction id
        to the list it is given."""
        ids = None if lock_keys is None else lock_ids(lock_keys)

        def attempt(deadline: float) -> T:
            xids: list[int] = []
            committing = False
            with self._connection(deadline - time.monotonic()) as conn:
                try:
                    # In pipeline mode BEGIN and COMMIT are sent as plain statements: psycopg's
                    # transaction block would add syncs (round trips) of its own.
                    with (
                        conn.pipeline() if pipeline else nullcontext(),
                        nullcontext() if pipeline else conn.transaction(),
                    ):
                        if pipeline:
                            conn.execute(b"BEGIN")
                        lock = (
                            None
                            if ids is None
                            else conn.execute(LOCK_XID_SQL, (KEY_LOCK_CLASS, ids))
                        )
                        result = fn(conn, xids)
                        row = None if lock is None else lock.fetchone()
                        if row:
                            xids.append(int(row[0]))
                        committing = True
                        if pipeline:
                            conn.execute(b"COMMIT")
                    return result
                except psycopg.Error as exc:
                    if isinstance(exc, pg_errors.DeadlockDetected):
                        raise Lost(exc) from exc  # rolled back by the server: retry
                    if not connection_lost(conn, exc):
                        raise
                    lost: psycopg.Error = exc
                finally:
                    if pipeline:
                        abandon(conn)
            if committing and xids and self._committed(xids[-1], what, deadline):
                return result
            raise Lost(lost) from lost

        return self._retry(what, attempt)

    def _committed(self, xid: int, what: str, deadline: float) -> bool:
        """Whether transaction ``xid``, whose COMMIT got no answer, committed."""
        while True:
            try:
                status = self._read(
                    "look up a transaction's outcome",
                    lambda cur: one(cur.execute("SELECT txid_status(%s)", (xid,))),
                )
            except pg_errors.InvalidParameterValue:
                # "transaction ID is in the future": a server crash lost the end of its WAL
                # (an unflushed claim) and with it every trace of the transaction.
                return False
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status is None or time.monotonic() > deadline:
                raise StoreError(
                    f"lost the connection to {self.describe()} while committing (to {what}) "
                    f"and could not learn whether transaction {xid} committed "
                    f"(txid_status: {status!r})"
                )
            time.sleep(0.05)  # "in progress": the old session is still finishing it

    def _one_statement(
        self, deadline: float, sql: bytes, params: Any, *, commit: bool = False
    ) -> tuple[Any, ...] | None:
        """Run ``sql`` (first row returned) as its own autocommit transaction: one round
        trip. ``commit``: ``sql`` is a step commit, sent past psycopg's cursor when it can
        be (see ``_postgres_wire``); its row is then ``(moved,)``.

        Raises:
            Unknown: the connection broke after sending; it may have committed.
        """
        # The hot path of every step commit: no context manager, and one cursor kept per
        # connection (on the connection, so it goes when the pool discards the connection).
        pool = self._pool_here()
        conn = self._getconn(pool, deadline - time.monotonic())
        session = conn.pgconn.backend_pid  # (after a break libpq may no longer say)
        try:
            if commit:
                moved = send_commit(conn, sql, params, self.prepare)
                if moved is not None:
                    return (moved,)
            cur: Cursor | None = getattr(conn, _CURSOR, None)
            if cur is None:
                cur = conn.cursor()
                setattr(conn, _CURSOR, cur)
            return cur.execute(sql, params).fetchone()
        except psycopg.Error as exc:
            if connection_lost(conn, exc):
                raise Unknown(exc, session) from exc
            raise
        finally:
            self._putconn(pool, conn)

    def close(self) -> None:
        self._closed = True
        self._async.close()
        self._feed.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
            spare, self._spare = self._spare, []
        if pool is not None and self._pool_pid == os.getpid():
            for conn in spare:
                pool.putconn(conn)
            pool.close()

    # -- key/value -------------------------------------------------------------------------
    def kv_get(self, key: str) -> str | None:
        value = self._read(
            "read a value",
            lambda cur: one(cur.execute("SELECT value FROM stepstone_kv WHERE key = %s", (key,))),
        )
        return None if value is None else str(value)

    def kv_put(self, key: str, text: str) -> None:
        self._refuse_if_read_only()

        # Idempotent: after a lost answer it is simply sent again.
        def attempt(deadline: float) -> None:
            params = (key, text, time.time(), lock_id(key), key)
            try:
                row = self._one_statement(deadline, PUT_SQL.encode(), params)
            except Unknown as unknown:
                raise Lost(unknown.cause) from unknown.cause
            if row is None:
                raise run_key_conflict(key)

        self._retry("write a value", attempt)

    def kv_delete(self, key: str) -> bool:
        self._refuse_if_read_only()

        def delete(conn: Connection) -> bool:
            return bool(one(conn.execute(DELETE_SQL, {"key": key})))

        return self._pipelined("delete a key", [key], delete)

    def kv_keys(self, prefix: str | None) -> list[str]:
        where, args = prefix_where("key", prefix)
        sql = (
            f"SELECT key FROM stepstone_kv WHERE {where} UNION "
            f"SELECT key FROM stepstone_runs WHERE {where} ORDER BY 1"
        )
        rows = self._read(
            "list keys", lambda cur: cur.execute(sql.encode(), args + args).fetchall()
        )
        return [str(r[0]) for r in rows]

    def kv_items(self, prefix: str | None) -> list[tuple[str, str]]:
        where, args = prefix_where("key", prefix)
        sql = f"SELECT key, value FROM stepstone_kv WHERE {where} ORDER BY key"
        rows = self._read("list values", lambda cur: cur.execute(sql.encode(), args).fetchall())
        return [(str(k), str(v)) for k, v in rows]

    def kv_cas(
        self, key: str, expected: Any, new_text: str, equal: Callable[[str, Any], bool]
    ) -> bool:
        self._refuse_if_read_only()

        def cas(conn: Connection) -> bool:
            row = conn.execute(KEY_STATE_SQL, (key, key)).fetchone()
            assert row is not None
            is_run, current = row
            if is_run:
                raise run_key_conflict(key)
            if expected is None:
                if current is not None:
                    return False
            elif current is None or not equal(str(current), expected):
                return False
            conn.execute(UPSERT_KV_SQL, (key, new_text, time.time()))
            return True

        return self._pipelined("compare-and-swap a value", [key], cas)

    # -- runs ------------------------------------------------------------------------------
    def run_get(self, key: str) -> RunHead | None:
        row = self._read(
            "read a run",
            lambda cur: cur.execute(
                f"SELECT {HEAD_COLS} FROM stepstone_runs WHERE key = %s", (key,)
            ).fetchone(),
        )
        return None if row is None else head_from_row(row)

    def run_transact(self, key: str, decide: Decide) -> RunHead | None:
        return self._transact(key, decide, flush=True)

    def run_claim(self, key: str, decide: Decide) -> RunHead | None:
        """A claim commits with ``synchronous_commit`` off: it returns once its commit record
        is in the server's WAL buffers, without waiting for the WAL flush. Every session sees
        it at once; any later synchronous commit (the run's first step, its release, or any
        other writer's commit, which lie after it in the WAL) flushes it too. A server crash
        before that may lose the claim, whole: the key is then as it was before the claim,
        as if the claiming process had died before its first step, and the claimer's first
        commit finds the run gone and raises the ownership error (nothing was committed).

        A claim of a key that holds nothing is one round trip instead of two: ``decide``
        is asked first what it would write under an empty key, and one statement inserts
        that head only if the key's locked reads find neither a run nor a value. When they
        find one, ``decide`` gets what they found: a decision that writes nothing (a done
        run) stands as it is; one that writes goes through the two-round-trip transaction,
        which reads and decides again under the lock."""
        self._refuse_if_read_only()
        claim = _fresh_claim(decide)
        if claim is None:
            return self._transact(key, decide, flush=False)
        found = self._retry("claim a run", lambda deadline: self._claim_fresh(deadline, claim))
        if found is True:
            return claim.head
        head, kv_text = found
        if decide(head, kv_text) is None:
            return head
        return self._transact(key, decide, flush=False)

    async def arun_claim(self, key: str, decide: Decide) -> RunHead | None:
        """:meth:`run_claim` awaited on the event loop: the one-statement claim of an empty
        key is sent on an async connection (``_postgres_async``); anything else (a key
        that holds something, a server error, a lost answer) goes to :meth:`run_claim` in
        a thread, which decides again."""
        self._refuse_if_read_only()
        if not self._ready:  # a process's first claim sets the schema up
            await asyncio.to_thread(self.setup)
        claim = _fresh_claim(decide)
        if claim is not None:
            new = claim.head
            try:
                inserted = await self._async.send(
                    CLAIM_FRESH_SQL, (lock_id(new.key), *head_to_row(new)), moved
                )
            except Failed as failed:
                if failed.lost:
                    return await to_thread(self._settle_claim, decide, new, failed)
            else:
                if inserted:
                    return new
        return await to_thread(self.run_claim, key, decide)

    def _settle_claim(self, decide: Decide, new: RunHead, failed: Failed) -> RunHead | None:
        """After a claim of an empty key whose answer was lost: ``new`` when it went in
        (our new run_uid under the key says so, once the session that ran it has ended),
        else :meth:`run_claim` again."""
        self.wait_session_gone(failed.session)
        current = self.run_get(new.key)
        if current is not None and current.run_uid == new.run_uid:
            return new
        log.debug("stepstone: a claim's answer was lost (%s); claiming again", failed.error)
        return self.run_claim(new.key, decide)

    def wait_session_gone(self, session: int, deadline: float | None = None) -> None:
        """Wait (until ``deadline``; default: ``reconnect_timeout`` from now) for the server
        session ``session`` to end. Before a statement whose answer was lost is looked
        for: one held back by a lock goes on running after its client is gone, and once
        its session has ended it has committed or never will."""
        if deadline is None:
            deadline = time.monotonic() + self.reconnect_timeout
        while time.monotonic() < deadline:
            alive = self._read(
                "wait for a lost session to end",
                lambda cur: one(
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (session,))
                ),
            )
            if not alive:
                return
            time.sleep(0.05)

    def _claim_fresh(
        self, deadline: float, claim: Claim
    ) -> Literal[True] | tuple[RunHead | None, str | None]:
        """Put ``claim``'s head under its key if the key holds nothing: True when it went
        in, else the head and value the locked reads found (the statement wrote nothing)."""
        new = claim.head
        params = (lock_id(new.key), *head_to_row(new))  # the row begins with the key
        try:
            row = self._one_statement(deadline, CLAIM_FRESH_SQL, params)
        except Unknown as unknown:
            # Our run_uid is new: a head holding it means the statement went in.
            self.wait_session_gone(unknown.session)
            current = self.run_get(new.key)
            if current is not None and current.run_uid == new.run_uid:
                return True
            raise Lost(unknown.cause) from unknown.cause
        assert row is not None  # the claim read always returns one row
        inserted, read = row[0], row[1:]
        if inserted:
            return True
        head = None if read[2] is None else head_from_row(read[CLAIM_HEAD])
        return head, None if read[1] is None else str(read[1])

    def _transact(self, key: str, decide: Decide, *, flush: bool) -> RunHead | None:
        self._refuse_if_read_only()

        # Pipelined: BEGIN and stepstone_claim_read (the key's lock, then the value and the
        # head FOR UPDATE) go in one round trip; decide runs while the transaction holds
        # both locks; the writes go with the COMMIT in a second round trip.
        def transact(conn: Connection, xids: list[int]) -> RunHead | None:
            read = CLAIM_READ_SQL if flush else CLAIM_READ_ASYNC_SQL
            row = conn.execute(read, (lock_id(key), key)).fetchone()
            assert row is not None
            xids.append(int(row[0]))
            head = None if row[2] is None else head_from_row(row[CLAIM_HEAD])
            kv_text = row[1]
            claim = decide(head, None if kv_text is None else str(kv_text))
            if claim is None:
                return head
            reset = claim.reset_journal
            restart = reset and head is not None  # a run started over drops its records
            conn.execute(
                PUT_HEAD_SQL,
                (
                    *(key, reset, key, claim.drop_kv),
                    *(key, restart, key, restart, key, restart),
                    *head_to_row(claim.head),
                ),
            )
            if claim.rows:
                conn.cursor().executemany(
                    INSERT_JOURNAL_SQL,
                    [
                        (key, r.seq, r.kind, r.name, r.data, r.started_at, r.committed_at)
                        for r in claim.rows
                    ],
                )
            return claim.head

        what = "update a run" if flush else "claim a run"
        return self._in_transaction(what, None, transact, pipeline=True)

    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        self._refuse_if_read_only()
        sql, params, keys = commit_statement(head, expected_version, rows, writes, self.prepare)

        def attempt(deadline: float) -> bool:
            while True:
                try:
                    row = self._one_statement(deadline, sql, params, commit=True)
                except Unknown as unknown:
                    return self._commit_outcome(head, expected_version, unknown)
                if row is not None and row[0]:
                    return True
                verdict = self._why_not(head, expected_version, keys)
                if verdict is not None:
                    return verdict

        return self._retry("commit a step", attempt)

    async def arun_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        self._refuse_if_read_only()
        if not self._ready:  # never in practice: a run's claim (on the pool) sets it up
            await asyncio.to_thread(self.setup)
        return await self._async.commit(self, head, expected_version, rows, writes)

    def settle_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
        failed: Failed,
    ) -> bool:
        """What ``run_commit`` returns for a commit sent on an async connection that
        failed: ``failed.lost``, the connection broke after sending, so the stored head
        tells whether it landed; otherwise (a server error) it changed nothing and is sent
        again here, where errors are reported as the store's."""
        if failed.lost:
            try:
                unknown = Unknown(failed.error, failed.session)
                return self._commit_outcome(head, expected_version, unknown)
            except Lost:
                pass  # it surely did not land
        return self.run_commit(head, expected_version, rows, writes)

    def _commit_outcome(self, head: RunHead, expected_version: int, unknown: Unknown) -> bool:
        """Whether a commit whose answer was lost applied; Lost when it surely did not."""
        self.wait_session_gone(unknown.session)
        # The statement may have committed: the stored head tells. Our run_uid with our
        # new version means it did (only this owner moves the head under this run_uid);
        # the expected version means it did not, so send it again.
        current = self.run_get(head.key)
        if current is None or current.run_uid != head.run_uid:
            return False
        if current.version == head.version:
            return True
        if current.version == expected_version:
            raise Lost(unknown.cause) from unknown.cause
        return False

    def _why_not(self, head: RunHead, expected_version: int, keys: list[str]) -> bool | None:
        """After a commit that changed nothing: False when the head no longer matched;
        StoreKeyConflictError when it did but a write key holds a run; None (send it
        again) when that run was deleted in between."""
        row = self._read(
            "check why a commit did not apply",
            lambda cur: cur.execute(
                WHY_SQL, (head.key, expected_version, head.run_uid, keys)
            ).fetchone(),
        )
        matched, conflict = (False, None) if row is None else row
        if not matched:
            return False
        if conflict is not None:
            raise run_key_conflict(str(conflict))
        return None

    def run_renew(self, key: str, run_uid: str, lease_until: float) -> bool:
        self._refuse_if_read_only()

        def renew(cur: Cursor) -> bool:
            cur.execute(
                "UPDATE stepstone_runs SET lease_until = %s WHERE key = %s AND run_uid = %s",
                (lease_until, key, run_uid),
            )
            return cur.rowcount == 1

        # Idempotent (sets, never adds), so a retry after a lost answer is harmless.
        return self._read("renew a lease", renew)

    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        rows = self._read(
            "read a journal",
            lambda cur: cur.execute(
                "SELECT seq, kind, name, data, started_at, committed_at FROM stepstone_journal "
                "WHERE run_key = %s AND seq >= %s ORDER BY seq",
                (key, since_seq),
            ).fetchall(),
        )
        return [journal_row(key, *row) for row in rows]

    def run_journal_row(self, key: str, seq: int) -> JournalRow | None:
        found = self._read(
            "read a journal row",
            lambda cur: cur.execute(
                "SELECT seq, kind, name, data, started_at, committed_at FROM stepstone_journal "
                "WHERE run_key = %s AND seq = %s",
                (key, seq),
            ).fetchone(),
        )
        return None if found is None else journal_row(key, *found)

    def headless_journal_keys(self) -> list[str]:
        sql = (
            "SELECT DISTINCT run_key FROM stepstone_journal j WHERE NOT EXISTS "
            "(SELECT 1 FROM stepstone_runs r WHERE r.key = j.run_key) ORDER BY run_key"
        )
        rows = self._read("list journal rows with no run", lambda cur: cur.execute(sql).fetchall())
        return [str(key) for (key,) in rows]

    def checksums(self) -> str | None:
        setting = self._read(
            "read data_checksums", lambda cur: cur.execute("SHOW data_checksums").fetchone()
        )
        if setting is not None and str(setting[0]) == "on":
            return "the server's page checksums (data_checksums is on)"
        return (
            "none: the cluster's data checksums are off, so a byte a disk changed inside a "
            "value goes unnoticed; create the cluster with initdb --data-checksums (or turn "
            "them on with pg_checksums --enable while the server is stopped)"
        )

    def run_list(self, prefix: str | None) -> list[RunHead]:
        where, args = prefix_where("key", prefix)
        sql = f"SELECT {HEAD_COLS} FROM stepstone_runs WHERE {where} ORDER BY key"
        rows = self._read("list runs", lambda cur: cur.execute(sql.encode(), args).fetchall())
        return heads_for_listing(rows)

    # -- timers, messages, events, streams (store/_extras.py) ----------------------------
    # Every write of a run's records holds the run key's advisory lock: appends to a
    # stream take their offsets one at a time, and a message and the parking of the run's
    # queue entry (store/_queue_postgres.py, park) see each other (see message_send).

    def run_commit_extras(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
        extras: ExtraWrites,
    ) -> bool:
        self._refuse_if_read_only()
        key = extras.key or head.key  # whose records

        def commit(cur: Cursor) -> bool:
            if writes:
                conflict = one(
                    cur.execute(
                        "SELECT min(key) FROM stepstone_runs WHERE key = ANY(%s)",
                        ([w for w, _ in writes],),
                    )
                )
                if conflict is not None:
                    raise run_key_conflict(str(conflict))
            cur.execute(_HEAD_UPDATE_SQL, head_update_params(head, expected_version))
            if cur.rowcount != 1:
                return False
            now = head.updated_at  # every row's committed_at: the commit's time
            if rows:
                cur.executemany(
                    INSERT_JOURNAL_SQL,
                    [(head.key, r.seq, r.kind, r.name, r.data, r.started_at, now) for r in rows],
                )
            if writes:
                cur.executemany(UPSERT_KV_SQL, [(w, text, now) for w, text in writes])
            _write_extras(cur, key, extras, now)
            return True

        keys = [head.key, key, *(w for w, _ in writes)]
        return self._transaction("commit a step with its records", keys, commit)

    def message_send(
        self, run_key: str, topic: str, data: str, *, refuse: Collection[str]
    ) -> int | None:
        self._refuse_if_read_only()

        # Under the run key's lock, which the parking of its queue entry takes too: a
        # message stored before a park is seen by it (the entry stays runnable), and one
        # stored after finds the entry parked and makes it runnable.
        def send(cur: Cursor) -> int | None:
            status = one(
                cur.execute("SELECT status FROM stepstone_runs WHERE key = %s", (run_key,))
            )
            if status is not None and status in refuse:
                return None
            mid = one(
                cur.execute(
                    "INSERT INTO stepstone_messages (run_key, topic, data, sent_at) "
                    f"VALUES (%s, %s, %s, {_NOW}) RETURNING id",
                    (run_key, topic, data),
                )
            )
            cur.execute(_WAKE_SQL, {"key": run_key, "topic": topic})
            return int(mid)

        return self._transaction("send a message", [run_key], send)

    def message_next(self, run_key: str, topic: str) -> Message | None:
        row = self._read(
            "read a message",
            lambda cur: cur.execute(
                f"SELECT {_MESSAGE_COLS} FROM stepstone_messages WHERE run_key = %s "
                "AND topic = %s AND consumed_at IS NULL ORDER BY id LIMIT 1",
                (run_key, topic),
            ).fetchone(),
        )
        return None if row is None else _message(row)

    def messages(self, run_key: str) -> list[Message]:
        rows = self._read(
            "read messages",
            lambda cur: cur.execute(
                f"SELECT {_MESSAGE_COLS} FROM stepstone_messages WHERE run_key = %s ORDER BY id",
                (run_key,),
            ).fetchall(),
        )
        return [_message(row) for row in rows]

    def event_set(self, run_key: str, name: str, data: str) -> None:
        self._refuse_if_read_only()
        # Idempotent (sets, never adds): sent again after a lost answer.
        self._read(
            "set an event",
            lambda cur: cur.execute(_EVENT_SQL, (run_key, name, data, self.clock())),
        )

    # -- the webhook outbox (store/_webhooks.py) ------------------------------------------
    def webhook_add(self, record: WebhookRecord) -> bool:
        self._refuse_if_read_only()
        # Idempotent: sent again after a lost answer, it finds its own row and adds nothing
        # (the answer then says False; the row is there either way).
        count = self._read(
            "record a webhook",
            lambda cur: (
                cur.execute(
                    f"INSERT INTO stepstone_webhooks ({_WEBHOOK_COLS}) "
                    f"VALUES ({', '.join(['%s'] * len(WEBHOOK_COLUMNS))}) "
                    "ON CONFLICT (id) DO NOTHING",
                    record.row(),
                ).rowcount
            ),
        )
        return bool(count == 1)

    def webhook_get(self, id: str) -> WebhookRecord | None:
        row = self._read(
            "read a webhook",
            lambda cur: cur.execute(
                f"SELECT {_WEBHOOK_COLS} FROM stepstone_webhooks WHERE id = %s", (id,)
            ).fetchone(),
        )
        return None if row is None else WebhookRecord.of(row)

    def webhook_list(
        self, run_key: str | None, statuses: Collection[str] | None = None
    ) -> list[WebhookRecord]:
        if statuses is not None and not statuses:
            return []
        where: list[str] = []
        params: list[Any] = []
        if run_key is not None:
            where.append("run_key = %s")
            params.append(run_key)
        if statuses is not None:
            where.append("status = ANY(%s)")
            params.append(list(statuses))
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            "list webhooks",
            lambda cur: cur.execute(
                f"SELECT {_WEBHOOK_COLS} FROM stepstone_webhooks{clause} ORDER BY created_at, id",
                params,
            ).fetchall(),
        )
        return [WebhookRecord.of(row) for row in rows]

    def webhook_update(self, record: WebhookRecord, expected_version: int) -> bool:
        self._refuse_if_read_only()
        names = WEBHOOK_COLUMNS[1:]
        sets = ", ".join(f"{n} = %s" for n in names)
        # Sent again after a lost answer, a change that landed finds the new version: it
        # counts as done when the row is exactly the record (the same change).
        found = self._read(
            "update a webhook",
            lambda cur: cur.execute(
                f"UPDATE stepstone_webhooks SET {sets} WHERE id = %s AND version = %s "
                f"RETURNING {_WEBHOOK_COLS}",
                (*record.row()[1:], record.id, expected_version),
            ).fetchone(),
        )
        if found is not None:
            return True
        return self.webhook_get(record.id) == record

    def event_get(self, run_key: str, name: str) -> EventValue | None:
        row = self._read(
            "read an event",
            lambda cur: cur.execute(
                "SELECT name, data, updated_at FROM stepstone_events "
                "WHERE run_key = %s AND name = %s",
                (run_key, name),
            ).fetchone(),
        )
        return None if row is None else EventValue(name=row[0], data=row[1], updated_at=row[2])

    def events(self, run_key: str) -> list[EventValue]:
        rows = self._read(
            "read events",
            lambda cur: cur.execute(
                "SELECT name, data, updated_at FROM stepstone_events WHERE run_key = %s "
                "ORDER BY name",
                (run_key,),
            ).fetchall(),
        )
        return [EventValue(name=n, data=d, updated_at=float(u)) for n, d, u in rows]

    def stream_append(self, run_key: str, name: str, data: str, attempt: int | None) -> int:
        self._refuse_if_read_only()
        params = {"key": run_key, "name": name, "data": data, "attempt": attempt}
        offset = self._transaction(
            "append to a stream",
            [run_key],
            lambda cur: one(cur.execute(_APPEND_SQL + " RETURNING pos", params)),
        )
        return int(offset)

    def stream_read(self, run_key: str, name: str, start: int, limit: int) -> list[StreamEntry]:
        rows = self._read(
            "read a stream",
            lambda cur: cur.execute(
                "SELECT pos, data, attempt, written_at FROM stepstone_streams "
                "WHERE run_key = %s AND name = %s AND pos >= %s ORDER BY pos LIMIT %s",
                (run_key, name, start, limit),
            ).fetchall(),
        )
        return [
            StreamEntry(name=name, offset=int(p), data=d, attempt=a, written_at=float(w))
            for p, d, a, w in rows
        ]

    def streams(self, run_key: str) -> list[tuple[str, int]]:
        rows = self._read(
            "list streams",
            lambda cur: cur.execute(
                "SELECT name, max(pos) + 1 FROM stepstone_streams WHERE run_key = %s "
                "GROUP BY name ORDER BY name",
                (run_key,),
            ).fetchall(),
        )
        return [(str(n), int(c)) for n, c in rows]

    def timers(self, run_key: str | None) -> list[Timer]:
        rows = self._read(
            "read timers",
            lambda cur: cur.execute(
                "SELECT run_key, name, wake_at, topic, since FROM stepstone_timers "
                "WHERE %s::text IS NULL OR run_key = %s ORDER BY run_key, name",
                (run_key, run_key),
            ).fetchall(),
        )
        return [
            Timer(run_key=k, name=n, wake_at=w, topic=t, since=float(since))
            for k, n, w, t, since in rows
        ]

    def changes(self) -> ChangeFeed:
        return self._feed

    def notify_run(self, key: str) -> None:
        # A NOTIFY of the run's topic: its waiters in every process listening look again.
        self._read(
            "notify a run's waiters",
            lambda cur: cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, run_topic(key))),
        )
        self._feed.publish(run_topic(key))

    def _listen(
        self,
        stop: threading.Event,
        publish: Callable[[str], None],
        ready: Callable[[], None],
    ) -> None:
        """The change feed's listener (``store/_changes.py``): one connection of its own
        that ``LISTEN``s, publishing each notification's topic; reconnects after a lost
        connection (waking every waiter, who look again), until ``stop`` is set."""
        backoff = 0.1
        while not stop.is_set():
            try:
                with self.connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    ready()
                    backoff = 0.1
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            publish(note.payload)
            except psycopg.Error as exc:
                log.debug("stepstone: change listener: %s; listening again", exc)
                ready()
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


#: How often a waiter on a PostgreSQL store looks again without a notification (a safety
#: net: notifications wake it at once; and a run's end is looked for this often).
POLL_INTERVAL = 1.0

_NOW = "extract(epoch FROM clock_timestamp())::float8"

_HEAD_UPDATE_SQL = (
    "UPDATE stepstone_runs SET status = %s, next_step = %s, version = %s, iteration = %s, "
    "journal_len = %s, lease_until = %s, meta = %s, updated_at = %s "
    "WHERE key = %s AND version = %s AND run_uid = %s"
)

_MESSAGE_COLS = "id, run_key, topic, data, sent_at, consumed_at"

_EVENT_SQL = (
    "INSERT INTO stepstone_events (run_key, name, data, updated_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (run_key, name) DO UPDATE SET data = EXCLUDED.data, "
    "updated_at = EXCLUDED.updated_at"
)

# The next offset is read under the run key's advisory lock (every appender takes it).
_APPEND_SQL = (
    "INSERT INTO stepstone_streams (run_key, name, pos, data, attempt, written_at) "
    "SELECT %(key)s, %(name)s, coalesce(max(pos) + 1, 0), %(data)s, %(attempt)s, "
    f"{_NOW} FROM stepstone_streams WHERE run_key = %(key)s AND name = %(name)s"
)

# A queue entry of the run parked waiting for a message on the topic: runnable now, and
# the workers of its queue told.
_WAKE_SQL = f"""
WITH woke AS (
    UPDATE stepstone_queue SET not_before = {_NOW}, updated_at = {_NOW}
    WHERE run_key = %(key)s AND status = 'queued' AND not_before > {_NOW}
      AND EXISTS (SELECT 1 FROM stepstone_timers t
                  WHERE t.run_key = %(key)s AND t.topic = %(topic)s)
    RETURNING queue
)
SELECT pg_notify('{CHANNEL}', 'q:' || left(md5(queue), 16)) FROM woke
"""


def _write_extras(cur: Cursor, key: str, extras: ExtraWrites, now: float) -> None:
    """Write a commit's messages consumed, events, stream items and timers for run ``key``,
    in the commit's transaction (a message not pending raises: all of it rolls back)."""
    if extras.consume:
        cur.execute(
            "UPDATE stepstone_messages SET consumed_at = %s WHERE id = ANY(%s) "
            "AND run_key = %s AND consumed_at IS NULL RETURNING id",
            (now, list(extras.consume), key),
        )
        done = {int(r[0]) for r in cur.fetchall()}
        for mid in extras.consume:
            if mid not in done:
                raise consumed_already(key, mid)  # rolled back: nothing is written
    for name, data in extras.events:
        cur.execute(_EVENT_SQL, (key, name, data, now))
    for name, data in extras.stream:
        cur.execute(_APPEND_SQL, {"key": key, "name": name, "data": data, "attempt": None})
    if extras.clear_timers:
        cur.execute(
            "DELETE FROM stepstone_timers WHERE run_key = %s AND name = ANY(%s)",
            (key, list(extras.clear_timers)),
        )
    for timer in extras.timers:
        cur.execute(
            "INSERT INTO stepstone_timers (run_key, name, wake_at, topic, since) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_key, name) DO UPDATE SET "
            "wake_at = EXCLUDED.wake_at, topic = EXCLUDED.topic, since = EXCLUDED.since",
            (key, timer.name, timer.wake_at, timer.topic, timer.since),
        )


def _message(row: Sequence[Any]) -> Message:
    mid, key, topic, data, sent_at, consumed_at = row
    return Message(
        id=int(mid),
        run_key=key,
        topic=topic,
        data=data,
        sent_at=float(sent_at),
        consumed_at=None if consumed_at is None else float(consumed_at),
    )


def _fresh_claim(decide: Decide) -> Claim | None:
    """What ``decide`` would write under an empty key, when a one-statement claim can write
    it (a head alone), else None."""
    try:
        guess = decide(None, None)
    except Exception:  # noqa: BLE001 - this decide never starts a run under an empty key
        return None
    if guess is None or guess.rows or guess.drop_kv:
        return None
    return guess


_WEBHOOK_COLS = ", ".join(WEBHOOK_COLUMNS)
