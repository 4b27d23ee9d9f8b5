"""The work queue in a SQLite file: worker processes of one machine share one file.

Tables ``stepstone_queue`` and ``stepstone_queue_limits`` live beside the store's own
tables (created here, on first use, so the store's schema is untouched). Every primitive
is one ``BEGIN IMMEDIATE`` transaction: SQLite's write lock serializes claims, so an entry
is handed to one worker at a time. All workers are on one machine, so the local clock is
the one clock.

An entry's ``crc`` is a checksum of what its submission fixed (:data:`_FIXED`: its id,
queue, target, task, run key, priority, dedupe key, attempts allowed and submission time)
and, once its run finished with one, of its result, as the store's rows carry one
(``_sqlite_rows``): an entry whose task or target a damaged byte changed is corrupt, marked
failed by the claim that finds it, never run with what it did not hold; one whose result
changed is corrupt when read, never handed back as the run's result. Entries of a table
made before the column existed hold NULL, unchecked, and so do entries changed through
SQL (a trigger drops their checksum).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from stepstone.exceptions import CorruptRecordError, StoreError
from stepstone.store._base import lenient_text, printable_key
from stepstone.store._changes import run_topic
from stepstone.store._queue_base import (
    CANCELLED_RUNNING,
    ENTRY_COLUMNS,
    SCHEDULE_COLUMNS,
    Owner,
    QueueBackend,
    QueueEntry,
    ScheduleRow,
    TickEntry,
    entry_from_row,
    free_slots,
    key_in_use,
    rate_window,
    readable,
    schedule_from_row,
)
from stepstone.store._sqlite import damaged_definition, publish, run_script, trigger_state
from stepstone.store._sqlite_conns import ThreadConnections
from stepstone.store._sqlite_errors import file_error, file_errors
from stepstone.store._sqlite_rows import row_crc

__all__ = ["SQLiteQueue", "has_queue"]

T = TypeVar("T")
#: An entry's columns as selected: :data:`ENTRY_COLUMNS`, then its checksum.
COLS = ", ".join((*ENTRY_COLUMNS, "crc"))
#: The columns a submission fixes for good, which an entry's checksum covers.
_FIXED = (
    "id",
    "queue",
    "target",
    "task",
    "run_key",
    "priority",
    "dedupe_key",
    "max_attempts",
    "created_at",
)
_AT = [ENTRY_COLUMNS.index(name) for name in _FIXED]
_RESULT = ENTRY_COLUMNS.index("result")
#: Drops an entry's checksum when what it covers is changed through SQL (a hand edit, an
#: older stepstone), as the store's tables do (``crc_triggers``): only bytes changed beneath
#: SQLite make an entry corrupt.
_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS stepstone_queue_crc AFTER UPDATE ON stepstone_queue "
    "WHEN NEW.crc IS OLD.crc AND ("
    + " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in (*_FIXED, "result"))
    + ") BEGIN UPDATE stepstone_queue SET crc = NULL WHERE seq = NEW.seq; END"
)
#: The checksum ``finish`` leaves on an entry it found damaged: never a CRC-32 (so the
#: entry stays corrupt), and not its old value (which the trigger would take for an edit).
_DAMAGED = -1

SCHEMA = """
CREATE TABLE IF NOT EXISTS stepstone_queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    target TEXT NOT NULL,
    task TEXT NOT NULL,
    run_key TEXT NOT NULL,
    priority INTEGER NOT NULL,
    not_before REAL NOT NULL,
    dedupe_key TEXT UNIQUE,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    worker TEXT,
    host TEXT,
    pid INTEGER,
    pid_start INTEGER,
    lease_until REAL,
    started_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    crc INTEGER
);
CREATE INDEX IF NOT EXISTS stepstone_queue_pick
    ON stepstone_queue (queue, status, priority DESC, not_before, seq);
CREATE INDEX IF NOT EXISTS stepstone_queue_key ON stepstone_queue (run_key);
CREATE TABLE IF NOT EXISTS stepstone_queue_limits (
    queue TEXT PRIMARY KEY,
    concurrency INTEGER,
    rate REAL
);
CREATE TABLE IF NOT EXISTS stepstone_schedules (
    name TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    priority INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    catch_up TEXT NOT NULL,
    grace REAL NOT NULL,
    paused INTEGER NOT NULL,
    next_tick REAL NOT NULL,
    last_tick REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""


class SQLiteQueue(QueueBackend):
    """The queue in the SQLite file at ``path`` (the store's file)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._conns = ThreadConnections(self._connect)
        self._create()

    @file_errors
    def _create(self) -> None:
        with self._tx() as conn:
            run_script(conn, SCHEMA)
            for table, expected in _columns().items():
                found = _table_columns(conn, table)
                if table == "stepstone_queue" and found == expected[:-1]:
                    # a queue table an older stepstone made, without checksums
                    conn.execute("ALTER TABLE stepstone_queue ADD COLUMN crc INTEGER")
                elif found != expected:
                    raise damaged_definition(
                        self.path,
                        f"its work queue table {table} has the columns ({', '.join(found)}) "
                        f"instead of ({', '.join(expected)})",
                    )
            conn.execute(_TRIGGER)
            if trigger_state(conn, _TRIGGER) is not None:  # there, but not as written
                raise damaged_definition(
                    self.path,
                    "the definition of its work queue's trigger stepstone_queue_crc changed",
                )

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (closed when the thread ends, or the queue closes)."""
        return self._conns.get()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.path), timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.text_factory = lenient_text  # bytes that are not UTF-8: a corrupt entry, by id
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise file_error(self.path, exc) or StoreError(
                f"could not lock {str(self.path)!r} for the work queue within "
                f"{self.busy_timeout}s: {exc}; another process holds a long write transaction"
            ) from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._tx() as conn:
            return fn(conn)

    def close(self) -> None:
        """Close every connection the queue opened, in any thread."""
        self._conns.close_all()

    def now(self) -> float:
        return time.time()

    @file_errors
    def enqueue(
        self,
        *,
        id: str,
        queue: str,
        target: str,
        task: str,
        run_key: str,
        priority: int,
        delay: float,
        not_before: float | None,
        dedupe_key: str | None,
        max_attempts: int,
    ) -> tuple[str, bool]:
        def insert(conn: sqlite3.Connection) -> tuple[str, bool]:
            if dedupe_key is not None:
                row = conn.execute(
                    "SELECT id FROM stepstone_queue WHERE dedupe_key = ?", (dedupe_key,)
                ).fetchone()
                if row is not None:
                    return str(row[0]), False
            busy = conn.execute(
                "SELECT id FROM stepstone_queue WHERE run_key = ? "
                "AND status IN ('queued', 'running')",
                (run_key,),
            ).fetchone()
            if busy is not None:
                raise key_in_use(run_key, str(busy[0]))
            now = time.time()
            # as they read back: an INTEGER column returns int, a REAL one float
            priority_, attempts = int(priority), int(max_attempts)
            fixed = (id, queue, target, task, run_key, priority_, dedupe_key, attempts, now)
            conn.execute(
                "INSERT INTO stepstone_queue (id, queue, target, task, run_key, priority, "
                "dedupe_key, max_attempts, created_at, not_before, status, attempts, "
                "updated_at, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', 0, ?, ?)",
                (
                    *fixed,
                    now + delay if not_before is None else not_before,
                    now,
                    _entry_crc(fixed, None),
                ),
            )
            return id, True

        return self._write(insert)

    @file_errors
    def claim(
        self,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int = 1,
        held: Collection[str] = (),
    ) -> list[QueueEntry]:
        def take(conn: sqlite3.Connection) -> list[QueueEntry]:
            now = time.time()
            _end_lapsed(conn, queue, now)
            free = _free_slots(conn, queue, now, limit)
            if free <= 0:
                return []
            # Rows are addressed by seq (the rowid), never through the index of ids: a byte
            # a damaged disk changed in an id must not lose the row found here.
            seqs = [
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM stepstone_queue WHERE queue = ? AND status = 'running' "
                    "AND lease_until < ? ORDER BY priority DESC, lease_until LIMIT ?",
                    (queue, now, free),
                ).fetchall()
            ]
            if len(seqs) < free:
                seqs += _pick_queued(conn, queue, now, free - len(seqs))
            taken = []
            for seq in seqs:
                entry = _start(conn, seq, owner, now, now + lease_seconds)
                if entry is not None:
                    taken.append(entry)
            return taken

        return self._write(take)

    @file_errors
    def renew(self, ids: Sequence[str], worker: str, lease_seconds: float) -> dict[str, bool]:
        if not ids:
            return {}

        def renew(conn: sqlite3.Connection) -> dict[str, bool]:
            marks = ", ".join("?" * len(ids))
            conn.execute(
                f"UPDATE stepstone_queue SET lease_until = ? WHERE id IN ({marks}) "
                "AND worker = ? AND status = 'running'",
                (time.time() + lease_seconds, *ids, worker),
            )
            rows = conn.execute(
                f"SELECT id, cancel_requested FROM stepstone_queue WHERE id IN ({marks}) "
                "AND worker = ? AND status = 'running'",
                (*ids, worker),
            ).fetchall()
            return {str(i): bool(c) for i, c in rows}

        return self._write(renew)

    @file_errors
    def finish(
        self, id: str, worker: str, status: str, result: str | None, error: str | None
    ) -> bool:
        def finish(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                f"SELECT {', '.join(_FIXED)}, crc FROM stepstone_queue "
                "WHERE id = ? AND worker = ? AND status = 'running'",
                (id, worker),
            ).fetchone()
            if row is None:
                return False
            fixed, crc = tuple(row[:-1]), row[-1]
            if crc is not None:  # NULL: an entry from before checksums, left unchecked
                crc = _entry_crc(fixed, result) if crc == _entry_crc(fixed, None) else _DAMAGED
            cur = conn.execute(
                "UPDATE stepstone_queue SET status = ?, result = ?, error = ?, "
                "lease_until = NULL, updated_at = ?, crc = ? "
                "WHERE id = ? AND worker = ? AND status = 'running'",
                (status, result, error, time.time(), crc, id, worker),
            )
            return cur.rowcount == 1

        return self._write(finish)

    @file_errors
    def hand_back(self, id: str, worker: str, delay: float) -> bool:
        def back(conn: sqlite3.Connection) -> bool:
            now = time.time()
            cur = conn.execute(
                "UPDATE stepstone_queue SET "
                "status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
                "error = CASE WHEN cancel_requested THEN ? ELSE error END, "
                "attempts = max(attempts - 1, 0), worker = NULL, host = NULL, pid = NULL, "
                "pid_start = NULL, lease_until = NULL, not_before = ?, updated_at = ? "
                "WHERE id = ? AND worker = ? AND status = 'running'",
                (CANCELLED_RUNNING, now + delay, now, id, worker),
            )
            return cur.rowcount == 1

        return self._write(back)

    @file_errors
    def park(
        self, id: str, worker: str, run_key: str, wake_at: float, topics: Sequence[str]
    ) -> bool:
        def back(conn: sqlite3.Connection) -> bool:
            now = time.time()
            due = wake_at
            if topics and _has_table(conn, "stepstone_messages"):
                marks = ", ".join("?" * len(topics))
                pending = conn.execute(
                    "SELECT 1 FROM stepstone_messages WHERE run_key = ? "
                    f"AND topic IN ({marks}) AND consumed_at IS NULL LIMIT 1",
                    (run_key, *topics),
                ).fetchone()
                if pending is not None:
                    due = now  # a message came before the park: runnable at once
            cur = conn.execute(
                "UPDATE stepstone_queue SET "
                "status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
                "error = CASE WHEN cancel_requested THEN ? ELSE error END, "
                "attempts = max(attempts - 1, 0), worker = NULL, host = NULL, pid = NULL, "
                "pid_start = NULL, lease_until = NULL, not_before = ?, updated_at = ? "
                "WHERE id = ? AND worker = ? AND status = 'running'",
                (CANCELLED_RUNNING, due, now, id, worker),
            )
            return cur.rowcount == 1

        return self._write(back)

    @file_errors
    def requeue(self, run_key: str) -> str | None:
        def requeue(conn: sqlite3.Connection) -> str | None:
            rows = conn.execute(
                f"SELECT status, {', '.join(_FIXED)}, result, crc FROM stepstone_queue "
                "WHERE run_key = ? ORDER BY seq DESC",
                (run_key,),
            ).fetchall()
            if not rows or any(r[0] in ("queued", "running") for r in rows):
                return None
            fixed, result, crc = tuple(rows[0][1:-2]), rows[0][-2], rows[0][-1]
            if crc is not None:  # as finish keeps it: a damaged entry stays damaged
                crc = _entry_crc(fixed, None) if crc == _entry_crc(fixed, result) else _DAMAGED
            now = time.time()
            conn.execute(
                "UPDATE stepstone_queue SET status = 'queued', attempts = 0, worker = NULL, "
                "host = NULL, pid = NULL, pid_start = NULL, lease_until = NULL, "
                "started_at = NULL, cancel_requested = 0, result = NULL, error = NULL, "
                "not_before = ?, updated_at = ?, crc = ? WHERE id = ?",
                (now, now, crc, fixed[0]),
            )
            return str(fixed[0])

        return self._write(requeue)

    @file_errors
    def active_entry(self, run_key: str) -> str | None:
        row = self._conn().execute(
            "SELECT id FROM stepstone_queue WHERE run_key = ? "
            "AND status IN ('queued', 'running') ORDER BY seq DESC LIMIT 1",
            (run_key,),
        )
        got = row.fetchone()
        return None if got is None else str(got[0])

    @file_errors
    def latest_entry(self, run_key: str) -> QueueEntry | None:
        row = self._conn().execute(
            f"SELECT {COLS} FROM stepstone_queue WHERE run_key = ? ORDER BY seq DESC LIMIT 1",
            (run_key,),
        )
        got = row.fetchone()
        return None if got is None else _entry(got)

    @file_errors
    def get(self, id: str) -> QueueEntry | None:
        row = self._conn().execute(f"SELECT {COLS} FROM stepstone_queue WHERE id = ?", (id,))
        got = row.fetchone()
        return None if got is None else _entry(got)

    @file_errors
    def cancel(self, id: str) -> str | None:
        def cancel(conn: sqlite3.Connection) -> str | None:
            conn.execute(
                "UPDATE stepstone_queue SET "
                "error = CASE WHEN status = 'queued' THEN 'cancelled before it started' "
                "ELSE error END, "
                "cancel_requested = (status = 'running'), "
                "status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END, "
                "updated_at = ? WHERE id = ? AND status IN ('queued', 'running')",
                (time.time(), id),
            )
            row = conn.execute(
                "SELECT status, run_key, cancel_requested FROM stepstone_queue WHERE id = ?",
                (id,),
            ).fetchone()
            if row is not None and row[2]:
                woken.append(str(row[1]))
            return None if row is None else str(row[0])

        woken: list[str] = []
        status = self._write(cancel)
        for key in woken:  # a run waiting in a worker of this process hears of it at once
            publish(self.path, run_topic(key))
        return status

    @file_errors
    def running_on(self, host: str) -> list[QueueEntry]:
        rows = self._conn().execute(
            f"SELECT {COLS} FROM stepstone_queue WHERE status = 'running' AND host = ?", (host,)
        )
        return readable(rows.fetchall(), _entry)

    @file_errors
    def expire(self, id: str, worker: str) -> bool:
        def expire(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE stepstone_queue SET lease_until = 0 "
                "WHERE id = ? AND worker = ? AND status = 'running'",
                (id, worker),
            )
            return cur.rowcount == 1

        return self._write(expire)

    def probe(self, timeout: float) -> str | None:
        # A write lock, as every queue primitive takes: another process holding the file's
        # lock (or a file gone, unreadable) is what keeps a worker from handing runs back.
        try:
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=rw",
                uri=True,
                timeout=timeout,
                isolation_level=None,
            )
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as exc:
            return str(exc)
        return None

    @file_errors
    def set_limits(self, queue: str, *, concurrency: int | None, rate: float | None) -> None:
        self._write(
            lambda conn: conn.execute(
                "INSERT INTO stepstone_queue_limits (queue, concurrency, rate) VALUES (?, ?, ?) "
                "ON CONFLICT (queue) DO UPDATE SET concurrency = excluded.concurrency, "
                "rate = excluded.rate",
                (queue, concurrency, rate),
            )
        )

    @file_errors
    def entries(self, queue: str | None, status: str | None) -> list[QueueEntry]:
        rows = self._conn().execute(
            f"SELECT {COLS} FROM stepstone_queue WHERE (? IS NULL OR queue = ?) "
            "AND (? IS NULL OR status = ?) ORDER BY seq",
            (queue, queue, status, status),
        )
        return [_entry(r) for r in rows.fetchall()]

    @file_errors
    def prune(self, older_than: float, queue: str | None) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM stepstone_queue WHERE status IN ('done', 'failed', 'cancelled') "
                "AND updated_at < ? AND (? IS NULL OR queue = ?)",
                (time.time() - older_than, queue, queue),
            )
            return cur.rowcount

        return self._write(prune)

    # -- schedules -------------------------------------------------------------------------
    @file_errors
    def schedule_put(self, row: ScheduleRow) -> None:
        marks = ", ".join("?" * len(SCHEDULE_COLUMNS))
        values = tuple(getattr(row, c) for c in SCHEDULE_COLUMNS)
        self._write(
            lambda conn: conn.execute(
                f"INSERT OR REPLACE INTO stepstone_schedules ({_SCHEDULE_COLS}) VALUES ({marks})",
                values,
            )
        )

    @file_errors
    def schedule_get(self, name: str) -> ScheduleRow | None:
        row = (
            self._conn()
            .execute(f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules WHERE name = ?", (name,))
            .fetchone()
        )
        return None if row is None else schedule_from_row(row)

    @file_errors
    def schedules(self) -> list[ScheduleRow]:
        rows = self._conn().execute(
            f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules ORDER BY name"
        )
        return [schedule_from_row(r) for r in rows.fetchall()]

    @file_errors
    def schedule_pause(self, name: str, paused: bool, next_tick: float | None) -> bool:
        def pause(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE stepstone_schedules SET paused = ?, "
                "next_tick = coalesce(?, next_tick), updated_at = ? WHERE name = ?",
                (int(paused), next_tick, time.time(), name),
            )
            return cur.rowcount == 1

        return self._write(pause)

    @file_errors
    def schedule_delete(self, name: str) -> bool:
        return self._write(
            lambda conn: (
                conn.execute("DELETE FROM stepstone_schedules WHERE name = ?", (name,)).rowcount
                == 1
            )
        )

    @file_errors
    def schedules_due(self, queues: Sequence[str]) -> list[ScheduleRow]:
        if not queues:
            return []
        marks = ", ".join("?" * len(queues))
        rows = self._conn().execute(
            f"SELECT {_SCHEDULE_COLS} FROM stepstone_schedules WHERE NOT paused "
            f"AND next_tick <= ? AND queue IN ({marks}) ORDER BY next_tick",
            (time.time(), *queues),
        )
        return [schedule_from_row(r) for r in rows.fetchall()]

    @file_errors
    def schedule_fire(
        self, name: str, expected_next: float, new_next: float, entries: Sequence[TickEntry]
    ) -> list[str] | None:
        def fire(conn: sqlite3.Connection) -> list[str] | None:
            row = conn.execute(
                "SELECT queue, target, priority, max_attempts FROM stepstone_schedules "
                "WHERE name = ? AND next_tick = ? AND NOT paused",
                (name, expected_next),
            ).fetchone()
            if row is None:
                return None
            queue, target, priority, max_attempts = row
            conn.execute(
                "UPDATE stepstone_schedules SET next_tick = ?, "
                "last_tick = coalesce(?, last_tick), updated_at = ? WHERE name = ?",
                (new_next, _last_tick(entries), time.time(), name),
            )
            queued: list[str] = []
            now = time.time()
            for entry in entries:
                if conn.execute(
                    "SELECT 1 FROM stepstone_queue WHERE dedupe_key = ?", (entry.dedupe_key,)
                ).fetchone():
                    continue
                fixed = (
                    entry.id,
                    str(queue),
                    str(target),
                    entry.task,
                    entry.run_key,
                    int(priority),
                    entry.dedupe_key,
                    int(max_attempts),
                    now,
                )
                conn.execute(
                    "INSERT INTO stepstone_queue (id, queue, target, task, run_key, priority, "
                    "dedupe_key, max_attempts, created_at, not_before, status, attempts, "
                    "updated_at, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', 0, ?, ?)",
                    (*fixed, now, now, _entry_crc(fixed, None)),
                )
                queued.append(entry.id)
            return queued

        return self._write(fire)


_SCHEDULE_COLS = ", ".join(SCHEDULE_COLUMNS)


def _last_tick(entries: Sequence[TickEntry]) -> float | None:
    return max(e.tick for e in entries) if entries else None


def has_queue(path: str | os.PathLike[str]) -> bool:
    """Whether the SQLite file at ``path`` holds a work queue (read without creating one;
    asked each time: another process may create one at any moment)."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stepstone_queue'"
        ).fetchone()
        return row is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _end_lapsed(conn: sqlite3.Connection, queue: str, now: float) -> None:
    """End the running entries of ``queue`` whose lease lapsed and that must not run
    again: ``cancelled`` when a cancel was requested, ``failed`` after their last attempt."""
    conn.execute(
        "UPDATE stepstone_queue SET status = 'cancelled', lease_until = NULL, "
        "error = ?, updated_at = ? WHERE queue = ? AND status = 'running' "
        "AND lease_until < ? AND cancel_requested",
        (CANCELLED_RUNNING, now, queue, now),
    )
    conn.execute(
        "UPDATE stepstone_queue SET status = 'failed', lease_until = NULL, "
        "updated_at = ?, error = 'its worker died or lost its lease on each of its ' "
        "|| attempts || ' attempts (max_attempts=' || max_attempts || '); last worker ' "
        "|| coalesce(worker, '?') || ' (pid ' || coalesce(pid, '?') || ' on host ' "
        "|| coalesce(host, '?') || ')' WHERE queue = ? AND status = 'running' "
        "AND lease_until < ? AND attempts >= max_attempts",
        (now, queue, now),
    )


def _free_slots(conn: sqlite3.Connection, queue: str, now: float, limit: int) -> int:
    """How many entries of ``queue`` a claim of up to ``limit`` may start now, under the
    queue's concurrency and rate limits."""
    concurrency = rate = None
    running = started = 0
    limits = conn.execute(
        "SELECT concurrency, rate FROM stepstone_queue_limits WHERE queue = ?", (queue,)
    ).fetchone()
    if limits is not None:
        concurrency, rate = limits
        running, started = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'running' AND lease_until >= ?), "
            "count(*) FILTER (WHERE started_at > ?) FROM stepstone_queue WHERE queue = ?",
            (now, now - rate_window(rate), queue),
        ).fetchone()
    return free_slots(limit, concurrency, running, rate, started)


def _start(
    conn: sqlite3.Connection, seq: int, owner: Owner, now: float, lease_until: float
) -> QueueEntry | None:
    """Start the entry at ``seq`` for ``owner``: the entry, or None when its row is corrupt
    (then marked failed: it fails alone, never blocking the queue)."""
    conn.execute(
        "UPDATE stepstone_queue SET status = 'running', attempts = attempts + 1, "
        "worker = ?, host = ?, pid = ?, pid_start = ?, lease_until = ?, "
        "started_at = ?, updated_at = ? WHERE seq = ?",
        (owner.worker, owner.host, owner.pid, owner.pid_start, lease_until, now, now, seq),
    )
    got = conn.execute(f"SELECT {COLS} FROM stepstone_queue WHERE seq = ?", (seq,)).fetchone()
    try:
        return _entry(got)
    except CorruptRecordError as exc:
        conn.execute(
            "UPDATE stepstone_queue SET status = 'failed', lease_until = NULL, "
            "error = ?, updated_at = ? WHERE seq = ?",
            (str(exc), now, seq),
        )
        return None


def _pick_queued(conn: sqlite3.Connection, queue: str, now: float, limit: int) -> list[int]:
    """The seqs of up to ``limit`` due queued entries of ``queue``, in the order workers
    take them. An entry whose cancel was requested is marked ``cancelled`` on the way,
    never picked: an older stepstone's hand-back left such entries queued (it ignored the
    request), and the cancel was acknowledged, so the run must not go on."""
    while True:
        rows = conn.execute(
            "SELECT seq, CASE WHEN cancel_requested THEN 1 ELSE 0 END FROM stepstone_queue "
            "WHERE queue = ? AND status = 'queued' AND not_before <= ? "
            "ORDER BY priority DESC, not_before, seq LIMIT ?",
            (queue, now, limit),
        ).fetchall()
        cancelled = [seq for seq, requested in rows if requested]
        if not cancelled:
            return [seq for seq, _ in rows]
        conn.execute(
            "UPDATE stepstone_queue SET status = 'cancelled', error = ?, lease_until = NULL, "
            f"updated_at = ? WHERE seq IN ({', '.join('?' * len(cancelled))})",
            (CANCELLED_RUNNING, now, *cancelled),
        )


def _columns() -> dict[str, tuple[str, ...]]:
    """The columns of the queue's tables as :data:`SCHEMA` makes them (``crc`` last)."""
    conn = sqlite3.connect(":memory:")
    try:
        run_script(conn, SCHEMA)
        tables = ("stepstone_queue", "stepstone_queue_limits", "stepstone_schedules")
        return {t: _table_columns(conn, t) for t in tables}
    finally:
        conn.close()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})"))


def _entry_crc(fixed: tuple[object, ...], result: object) -> int:
    """The checksum of an entry: what its submission fixed, and its result once it has one."""
    return row_crc(fixed if result is None else (*fixed, result))


def _entry(row: Sequence[object]) -> QueueEntry:
    """An entry selected as :data:`COLS`, its checksum checked (CorruptRecordError naming it
    when what its submission fixed, or its result, changed), decoded."""
    values, crc = row[:-1], row[-1]
    fixed = tuple(values[i] for i in _AT)
    if crc is not None and crc != _entry_crc(fixed, values[_RESULT]):
        raise CorruptRecordError(
            f"queue entry {printable_key(values[0])!r} is corrupt (what its submission or its "
            "run stored does not match its checksum: a damaged disk, or the file edited "
            "outside SQLite); it cannot run, and its result cannot be trusted"
        )
    return entry_from_row(values)
