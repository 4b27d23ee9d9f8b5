"""SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` transactions, a busy timeout.

Each thread gets its own connection (sqlite3 connections are not meant to be shared); the
database file's lock is the only concurrency control, so several threads and processes can
share one file safely. ``durability="full"`` (default) sets ``synchronous=FULL``: a commit
survives power loss. ``durability="normal"`` sets ``synchronous=NORMAL``: a commit survives
a process crash but the last commits may be lost on power loss (WAL is synced at
checkpoints, not on every commit).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from stepstone.exceptions import StoreError
from stepstone.store._base import (
    HEAD_COLUMNS,
    Backend,
    Decide,
    JournalRow,
    RunHead,
    head_from_row,
    head_to_row,
    prefix_bounds,
)
from stepstone.store._memory import run_key_conflict

__all__ = ["MIGRATIONS", "SQLiteBackend"]

#: Schema changes in order; the list index + 1 is the schema version. Never edit an entry,
#: append a new one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE kv (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE runs (
        key TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        next_step TEXT,
        run_uid TEXT NOT NULL,
        version INTEGER NOT NULL,
        iteration INTEGER NOT NULL,
        journal_len INTEGER NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start INTEGER,
        lease_until REAL NOT NULL,
        meta TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE journal (
        run_key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        name TEXT,
        data TEXT NOT NULL,
        PRIMARY KEY (run_key, seq)
    );
    """,
]

_HEAD_COLS = ", ".join(HEAD_COLUMNS)


class SQLiteBackend(Backend):
    """Durable storage in one SQLite file (see module docstring)."""

    commit_inline = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["full", "normal"] = "full",
        busy_timeout: float = 30.0,
    ) -> None:
        if durability not in ("full", "normal"):
            raise ValueError(
                f"durability must be 'full' (survives power loss) or 'normal' (survives a "
                f"process crash), got {durability!r}"
            )
        if busy_timeout <= 0:
            raise ValueError(f"busy_timeout must be > 0 seconds, got {busy_timeout!r}")
        self.path = Path(path)
        if str(path) != ":memory:" and not self.path.parent.exists():
            raise StoreError(
                f"cannot open SQLite store {str(path)!r}: directory {str(self.path.parent)!r} "
                "does not exist; create it first"
            )
        self.durability = durability
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._setup()

    # -- connections ---------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if self._closed:
            raise StoreError(f"store {self.describe()} is closed")
        conn = sqlite3.connect(
            str(self.path),
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{str(self.path)!r} is not a SQLite database: {exc}") from exc
        if str(mode).lower() != "wal" and str(self.path) != ":memory:":
            conn.close()
            raise StoreError(f"could not switch {str(self.path)!r} to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.durability == 'full' else 'NORMAL'}")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front, so two
        writers never deadlock upgrading read locks; the busy timeout queues them.
        Inside an open transaction (a group commit) it is a savepoint: undone alone on
        error, committed with the enclosing transaction."""
        conn = self._conn()
        if conn.in_transaction:
            conn.execute("SAVEPOINT stepstone_nested")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK TO stepstone_nested")
                conn.execute("RELEASE stepstone_nested")
                raise
            conn.execute("RELEASE stepstone_nested")
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(
                f"could not lock {str(self.path)!r} for writing within {self.busy_timeout}s: "
                f"{exc}; another process holds a long write transaction"
            ) from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _setup(self) -> None:
        with self._tx() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS stepstone_schema "
                "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            row = conn.execute("SELECT MAX(version) FROM stepstone_schema").fetchone()
            current = row[0] or 0
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"{str(self.path)!r} has schema version {current}, newer than this "
                    f"stepstone ({len(MIGRATIONS)}); upgrade stepstone"
                )
            for version in range(current + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT INTO stepstone_schema (version, applied_at) VALUES (?, ?)",
                    (version, time.time()),
                )

    def close(self) -> None:
        self._closed = True
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    # -- key/value -----------------------------------------------------------------------
    def kv_get(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def kv_put(self, key: str, text: str) -> None:
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE key = ?", (key,)).fetchone():
                raise run_key_conflict(key)
            conn.execute(
                "INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (key, text, time.time()),
            )

    def kv_delete(self, key: str) -> bool:
        with self._tx() as conn:
            n = conn.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount
            n += conn.execute("DELETE FROM runs WHERE key = ?", (key,)).rowcount
            conn.execute("DELETE FROM journal WHERE run_key = ?", (key,))
            return n > 0

    def kv_keys(self, prefix: str | None) -> list[str]:
        conn = self._conn()
        if prefix is None:
            rows = conn.execute("SELECT key FROM kv UNION SELECT key FROM runs ORDER BY 1")
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(
                f"SELECT key FROM kv WHERE {where} UNION "
                f"SELECT key FROM runs WHERE {where} ORDER BY 1",
                args + args,
            )
        return [str(r[0]) for r in rows]

    def kv_items(self, prefix: str | None) -> list[tuple[str, str]]:
        conn = self._conn()
        if prefix is None:
            rows = conn.execute("SELECT key, value FROM kv ORDER BY key")
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(f"SELECT key, value FROM kv WHERE {where} ORDER BY key", args)
        return [(str(k), str(v)) for k, v in rows]

    def kv_cas(
        self, key: str, expected: Any, new_text: str, equal: Callable[[str, Any], bool]
    ) -> bool:
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE key = ?", (key,)).fetchone():
                raise run_key_conflict(key)
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            if expected is None:
                if row is not None:
                    return False
            elif row is None or not equal(str(row[0]), expected):
                return False
            conn.execute(
                "INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (key, new_text, time.time()),
            )
            return True

    # -- runs ----------------------------------------------------------------------------
    def run_get(self, key: str) -> RunHead | None:
        row = (
            self._conn().execute(f"SELECT {_HEAD_COLS} FROM runs WHERE key = ?", (key,)).fetchone()
        )
        return None if row is None else head_from_row(row)

    def run_transact(self, key: str, decide: Decide) -> RunHead | None:
        with self._tx() as conn:
            row = conn.execute(f"SELECT {_HEAD_COLS} FROM runs WHERE key = ?", (key,)).fetchone()
            head = None if row is None else head_from_row(row)
            kv_row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            claim = decide(head, None if kv_row is None else str(kv_row[0]))
            if claim is None:
                return head
            if claim.reset_journal:
                conn.execute("DELETE FROM journal WHERE run_key = ?", (key,))
            if claim.drop_kv:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            conn.execute(
                f"INSERT OR REPLACE INTO runs ({_HEAD_COLS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                head_to_row(claim.head),
            )
            if claim.rows:
                conn.executemany(
                    "INSERT INTO journal (run_key, seq, kind, name, data) VALUES (?, ?, ?, ?, ?)",
                    [(key, r.seq, r.kind, r.name, r.data) for r in claim.rows],
                )
            return claim.head

    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE runs SET status = ?, next_step = ?, version = ?, iteration = ?, "
                "journal_len = ?, lease_until = ?, meta = ?, updated_at = ? "
                "WHERE key = ? AND version = ? AND run_uid = ?",
                (
                    head.status,
                    head.next_step,
                    head.version,
                    head.iteration,
                    head.journal_len,
                    head.lease_until,
                    json.dumps(head.meta, separators=(",", ":")),
                    head.updated_at,
                    head.key,
                    expected_version,
                    head.run_uid,
                ),
            )
            if cur.rowcount != 1:
                return False
            if rows:
                conn.executemany(
                    "INSERT INTO journal (run_key, seq, kind, name, data) VALUES (?, ?, ?, ?, ?)",
                    [(head.key, r.seq, r.kind, r.name, r.data) for r in rows],
                )
            if writes:
                for wkey, _ in writes:
                    if conn.execute("SELECT 1 FROM runs WHERE key = ?", (wkey,)).fetchone():
                        raise run_key_conflict(wkey)
                now = head.updated_at
                conn.executemany(
                    "INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                    "updated_at = excluded.updated_at",
                    [(wkey, text, now) for wkey, text in writes],
                )
            return True

    def run_renew(self, key: str, run_uid: str, lease_until: float) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE runs SET lease_until = ? WHERE key = ? AND run_uid = ?",
                (lease_until, key, run_uid),
            )
            return cur.rowcount == 1

    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        rows = self._conn().execute(
            "SELECT seq, kind, name, data FROM journal WHERE run_key = ? AND seq >= ? ORDER BY seq",
            (key, since_seq),
        )
        return [JournalRow(int(s), str(k), n, str(d)) for s, k, n, d in rows]

    def run_list(self, prefix: str | None) -> list[RunHead]:
        conn = self._conn()
        if prefix is None:
            rows = conn.execute(f"SELECT {_HEAD_COLS} FROM runs ORDER BY key")
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(f"SELECT {_HEAD_COLS} FROM runs WHERE {where} ORDER BY key", args)
        return [head_from_row(r) for r in rows]


def _prefix_sql(prefix: str) -> tuple[str, tuple[str, ...]]:
    """An index range for keys starting with ``prefix`` (binary collation: exact and
    case-sensitive, where LIKE would not be)."""
    lo, hi = prefix_bounds(prefix)
    if hi is None:
        return "key >= ?", (lo,)
    return "key >= ? AND key < ?", (lo, hi)
