"""SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` transactions, a busy timeout.

Tables are prefixed ``stepstone_`` (as in PostgreSQL), so a store can live in a file that
also holds an application's own tables. ``read_only=True`` opens an existing store for
inspection: nothing is created, migrated or switched to WAL, and a file that is not a
stepstone store is refused with one clear error.

Each thread gets its own connection (sqlite3 connections are not meant to be shared); the
database file's lock is the only concurrency control, so several threads and processes can
share one file safely. ``durability="full"`` (default) sets ``synchronous=FULL``: a commit
survives power loss. ``durability="normal"`` sets ``synchronous=NORMAL``: a commit survives
a process crash but the last commits may be lost on power loss (WAL is synced at
checkpoints, not on every commit).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from stepstone.exceptions import CheckpointCorruptError, StoreDamagedError, StoreError
from stepstone.store._base import (
    HEAD_COLUMNS,
    Backend,
    Decide,
    JournalRow,
    RunHead,
    checked_text,
    corrupt_error,
    head_from_row,
    heads_for_listing,
    journal_row,
    lenient_text,
    prefix_bounds,
    printable_key,
)
from stepstone.store._changes import ChangeFeed, queue_topic, run_topic
from stepstone.store._extras import EventValue, ExtraWrites, Message, StreamEntry, Timer
from stepstone.store._memory import consumed_already, run_key_conflict
from stepstone.store._sqlite_conns import ThreadConnections
from stepstone.store._sqlite_errors import file_error, file_errors, is_busy, is_foreign
from stepstone.store._sqlite_rows import (
    checked_extra,
    checked_head_row,
    checked_journal_row,
    checked_value,
    crc_triggers,
    event_crc,
    head_commit_params,
    head_insert_params,
    head_insert_sql,
    head_update_sql,
    journal_insert_sql,
    journal_params,
    kv_params,
    kv_upsert_sql,
    message_crc,
    stream_crc,
    timer_crc,
)
from stepstone.store._sqlite_wal import WalTender, wal_damage
from stepstone.store._webhooks import WEBHOOK_COLUMNS, WebhookRecord

__all__ = ["JOURNAL_TIMES", "MIGRATIONS", "SCHEMA", "TIMES_VERSION", "SQLiteBackend", "publish"]

#: What a run keeps beside its journal (``store/_extras.py``): its timers, the messages sent
#: to it, its events and its streams. Row-id tables with a key index, as the journal (a
#: message's id is its row id, in send order: AUTOINCREMENT never hands one out twice).
_EXTRAS = """
    CREATE TABLE stepstone_timers (
        run_key TEXT NOT NULL,
        name TEXT NOT NULL,
        wake_at REAL,
        topic TEXT,
        since REAL NOT NULL,
        crc INTEGER,
        PRIMARY KEY (run_key, name)
    );
    CREATE TABLE stepstone_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_key TEXT NOT NULL,
        topic TEXT NOT NULL,
        data TEXT NOT NULL,
        sent_at REAL NOT NULL,
        consumed_at REAL,
        crc INTEGER
    );
    CREATE INDEX stepstone_messages_run ON stepstone_messages (run_key, id);
    CREATE INDEX stepstone_messages_pending ON stepstone_messages (run_key, topic, id)
        WHERE consumed_at IS NULL;
    CREATE TABLE stepstone_events (
        run_key TEXT NOT NULL,
        name TEXT NOT NULL,
        data TEXT NOT NULL,
        updated_at REAL NOT NULL,
        crc INTEGER,
        PRIMARY KEY (run_key, name)
    );
    CREATE TABLE stepstone_streams (
        run_key TEXT NOT NULL,
        name TEXT NOT NULL,
        pos INTEGER NOT NULL,
        data TEXT NOT NULL,
        attempt INTEGER,
        written_at REAL NOT NULL,
        crc INTEGER,
        PRIMARY KEY (run_key, name, pos)
    );
"""

#: The webhook outbox (``store/_webhooks.py``): deliveries a server owes, by id.
_WEBHOOKS = """
    CREATE TABLE stepstone_webhooks (
        id TEXT PRIMARY KEY,
        run_key TEXT NOT NULL,
        url TEXT NOT NULL,
        event TEXT NOT NULL,
        status TEXT NOT NULL,
        payload TEXT,
        attempts INTEGER NOT NULL,
        next_at REAL NOT NULL,
        lease_until REAL NOT NULL,
        owner TEXT,
        log TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL
    );
    CREATE INDEX stepstone_webhooks_run ON stepstone_webhooks (run_key, created_at);
    CREATE INDEX stepstone_webhooks_open ON stepstone_webhooks (status, next_at);
"""

#: Schema changes in order; the list index + 1 is the schema version recorded in
#: ``stepstone_schema``. Never edit an entry, append a new one (and update
#: :data:`SCHEMA`, which a new file gets at once; a test checks that both agree). Before
#: changing the layout, freeze a store of the current one as
#: ``tests/store/fixtures/store_v<N>.sqlite``: every frozen store must keep opening. A
#: migration that renames kv, runs or journal also records the old names in
#: :data:`_LEGACY_TABLES`, so read-only opening can still read older stores.
#: Version 1 (stores written before the ``stepstone_`` prefix) used bare table names.
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
    """
    ALTER TABLE kv RENAME TO stepstone_kv;
    ALTER TABLE runs RENAME TO stepstone_runs;
    ALTER TABLE journal RENAME TO stepstone_journal;
    """,
    # Version 3: a checksum per row (see _sqlite_rows); older rows keep NULL, unchecked.
    """
    ALTER TABLE stepstone_kv ADD COLUMN crc INTEGER;
    ALTER TABLE stepstone_runs ADD COLUMN crc INTEGER;
    ALTER TABLE stepstone_journal ADD COLUMN crc INTEGER;
    """
    + crc_triggers("stepstone_kv", "stepstone_runs", "stepstone_journal"),
    # Version 4: timers, messages, events and streams (_EXTRAS).
    _EXTRAS,
    # The webhook outbox (_WEBHOOKS; its version: _WEBHOOKS_VERSION).
    _WEBHOOKS,
]

#: When the work a journal row records started and when its commit was made (database
#: clock), for operators; older rows keep NULL. Not covered by a row's checksum: a time
#: never steers a run (as a head's lease).
JOURNAL_TIMES = """
    ALTER TABLE stepstone_journal ADD COLUMN started_at REAL;
    ALTER TABLE stepstone_journal ADD COLUMN committed_at REAL;
"""
MIGRATIONS.append(JOURNAL_TIMES)

#: The current schema, created in one go in a new file (running version 1 there would
#: collide with an application's own ``kv`` table).
SCHEMA = (
    """
    CREATE TABLE stepstone_kv (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL,
        crc INTEGER
    );
    CREATE TABLE stepstone_runs (
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
        updated_at REAL NOT NULL,
        crc INTEGER
    ) WITHOUT ROWID;
    CREATE TABLE stepstone_journal (
        run_key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        name TEXT,
        data TEXT NOT NULL,
        crc INTEGER,
        started_at REAL,
        committed_at REAL,
        PRIMARY KEY (run_key, seq)
    );
"""
    + crc_triggers("stepstone_kv", "stepstone_runs", "stepstone_journal")
    + _EXTRAS
    + _WEBHOOKS
)

_TABLES = ("stepstone_kv", "stepstone_runs", "stepstone_journal")

#: The schema version from which a store keeps timers, messages, events and streams.
_EXTRAS_VERSION = 4

#: Their tables, with their columns.
_EXTRA_TABLES: dict[str, tuple[str, ...]] = {
    "stepstone_timers": ("run_key", "name", "wake_at", "topic", "since", "crc"),
    "stepstone_messages": ("id", "run_key", "topic", "data", "sent_at", "consumed_at", "crc"),
    "stepstone_events": ("run_key", "name", "data", "updated_at", "crc"),
    "stepstone_streams": ("run_key", "name", "pos", "data", "attempt", "written_at", "crc"),
}

#: The schema version from which a store keeps the webhook outbox.
_WEBHOOKS_VERSION = MIGRATIONS.index(_WEBHOOKS) + 1

#: Tables added after version 3, by the version that added them, with their columns.
_ADDED_TABLES: dict[int, dict[str, tuple[str, ...]]] = {
    _EXTRAS_VERSION: _EXTRA_TABLES,
    _WEBHOOKS_VERSION: {"stepstone_webhooks": WEBHOOK_COLUMNS},
}

#: The change feed of each store file this process opened (``store/_changes.py``): every
#: store object on one file wakes the same waiters.
_FEEDS: weakref.WeakValueDictionary[str, ChangeFeed] = weakref.WeakValueDictionary()
_FEEDS_LOCK = threading.Lock()

#: How often a waiter on a SQLite store looks again for what other processes changed.
POLL_INTERVAL = 0.1


def publish(path: Path, topic: str) -> None:
    """Wake this process's waiters of ``topic`` on the store file at ``path`` (if any
    store of this process has it open)."""
    with _FEEDS_LOCK:
        feed = _FEEDS.get(str(path.resolve()))
    if feed is not None:
        feed.publish(topic)


#: Table names of older schema versions that differ from :data:`_TABLES`, for reading a
#: store read-only without migrating it.
_LEGACY_TABLES: dict[int, tuple[str, str, str]] = {1: ("kv", "runs", "journal")}

_HEAD_COLS = ", ".join(HEAD_COLUMNS)
_WEBHOOK_COLS = ", ".join(WEBHOOK_COLUMNS)

#: The columns of the kv, runs and journal tables, as every schema version has them
#: (version :data:`_CRC_VERSION` adds ``crc`` to each: :func:`_columns_of`).
_COLUMNS = (
    ("key", "value", "updated_at"),
    (
        "key",
        "kind",
        "status",
        "next_step",
        "run_uid",
        "version",
        "iteration",
        "journal_len",
        "host",
        "pid",
        "pid_start",
        "lease_until",
        "meta",
        "created_at",
        "updated_at",
    ),
    ("run_key", "seq", "kind", "name", "data"),
)

#: Up to this many runs, :meth:`SQLiteBackend.journal_faults` reads each run's journal by
#: its key; more, it reads the whole table once.
_FAULTS_BY_KEY = 256

#: The schema version from which every row carries a checksum (``crc``).
_CRC_VERSION = 3

#: The schema version from which journal rows carry their times.
TIMES_VERSION = MIGRATIONS.index(JOURNAL_TIMES) + 1


def _columns_of(version: int) -> tuple[tuple[str, ...], ...]:
    """The columns of the kv, runs and journal tables of schema ``version``."""
    extra = ("crc",) if version >= _CRC_VERSION else ()
    kv, runs, journal = (columns + extra for columns in _COLUMNS)
    if version >= TIMES_VERSION:
        journal += ("started_at", "committed_at")
    return kv, runs, journal


#: A URL given where a file path belongs (``postgresql://...``, ``sqlite:///x.db``), also
#: as a ``Path`` made of one, which keeps one slash. A Windows drive (``C:/``) has a
#: one-letter scheme and is not matched; ``./name:/file`` reaches a directory named so.
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")


def _check_options(
    path: str | os.PathLike[str],
    durability: str,
    busy_timeout: float,
    read_only: bool,
    checkpoint_pages: int,
) -> None:
    """Refuse bad ``SQLiteBackend`` arguments before anything is opened, naming the value
    and the fix."""
    _check_tuning(durability, busy_timeout, checkpoint_pages)
    _check_path_name(path)
    _check_path_file(path, read_only)


def _check_tuning(durability: str, busy_timeout: float, checkpoint_pages: int) -> None:
    """Refuse a bad ``durability``, ``busy_timeout`` or ``checkpoint_pages``."""
    if (
        isinstance(checkpoint_pages, bool)
        or not isinstance(checkpoint_pages, int)
        or checkpoint_pages < 1
    ):
        raise ValueError(
            f"checkpoint_pages must be a whole number of WAL pages >= 1 (SQLite's default "
            f"is 1000), got {checkpoint_pages!r}"
        )
    if durability not in ("full", "normal"):
        raise ValueError(
            f"durability must be 'full' (survives power loss) or 'normal' (survives a "
            f"process crash), got {durability!r}"
        )
    if not isinstance(busy_timeout, int | float) or not 0 < busy_timeout < float("inf"):
        raise ValueError(
            f"busy_timeout must be a finite number of seconds > 0, got {busy_timeout!r}"
        )


def _check_path_name(path: str | os.PathLike[str]) -> None:
    """Refuse a store path that is no file name: not a path, empty, a URL, ``:memory:``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a SQLite store's path must be a str or a path, got {path!r}")
    if not os.fspath(path):
        raise ValueError("a SQLite store's path is empty: pass a file path, e.g. db='runs.sqlite'")
    if _URL_SCHEME.match(os.fspath(path)):
        raise ValueError(
            f"{os.fspath(path)!r} is a store URL, not a SQLite file path: pass it as "
            "Store(url=...) (--url on the command line); a file path goes to db= (--db)"
        )
    if os.fspath(path) == ":memory:":
        raise ValueError(
            "a SQLite store needs a file: ':memory:' would give every thread its own empty "
            "database; use Store() for a store in memory, or db='runs.sqlite'"
        )


def _check_path_file(path: str | os.PathLike[str], read_only: bool) -> None:
    """Refuse a store path whose directory is missing, that is a directory, or (read
    only) that names no file."""
    file = Path(path)
    if not file.parent.exists():
        raise StoreError(
            f"cannot open SQLite store {str(path)!r}: directory {str(file.parent)!r} "
            "does not exist; create it first"
        )
    if read_only:
        if file.is_dir():
            raise StoreError(
                f"{str(path)!r} is a directory, not a SQLite store file; pass the file"
            )
        if not file.exists():
            raise StoreError(f"no store file at {str(path)!r}; check the path")
    elif file.is_dir():
        raise StoreError(f"{str(path)!r} is a directory; pass a file path for the store")


def _not_a_store(path: Path, exc: sqlite3.DatabaseError, fix: str) -> StoreError:
    """Opening ``path`` failed with ``exc``: a damaged store, or no SQLite file at all."""
    error = file_error(path, exc)
    if isinstance(error, StoreDamagedError) and not is_foreign(exc):
        return error
    said = str(exc)
    if "readonly database" in said or "unable to open database file" in said:
        return StoreError(
            f"cannot open {str(path)!r}: SQLite says {said}. The file or its directory is not "
            "writable by this user, and a store in WAL mode creates its -shm file beside it "
            "even to be read; run as the store's owner, or copy the file (with its -wal) to "
            "a directory you can write"
        )
    return StoreError(
        f"{str(path)!r} is not a SQLite database, or its first page is damaged ({exc}); {fix}"
    )


class SQLiteBackend(Backend):
    """Durable storage in one SQLite file (see module docstring).

    Args:
        path: The file (created with the schema if missing, unless ``read_only``).
        durability: ``"full"`` (survives power loss) or ``"normal"`` (survives a crash).
        busy_timeout: Seconds to wait for another writer's lock.
        read_only: Open an existing store for reading only: no file, table, migration or
            WAL switch is ever made, and every write raises :class:`StoreError`.
        preallocate_wal: With ``durability="full"``, keep the WAL file allocated ahead of
            the commits (512 KB at open, doubled whenever the commits outgrow it, up to
            the size it reaches between two automatic checkpoints, about 4 MB), so commits
            overwrite allocated space instead of growing the file (a growing file makes
            every fsync write file metadata too: about twice the cost). Costs that disk
            space while the store is open.
        checkpoint_pages: WAL pages after which a commit copies them into the database
            file (SQLite's automatic checkpoint; 1000 by default, as SQLite's). More
            makes checkpoints rarer, which pays with large step outputs, at the cost of
            a WAL (and its preallocation) of about that many 4 KB pages.
    """

    commit_inline = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["full", "normal"] = "full",
        busy_timeout: float = 30.0,
        read_only: bool = False,
        preallocate_wal: bool = True,
        checkpoint_pages: int = 1000,
    ) -> None:
        _check_options(path, durability, busy_timeout, read_only, checkpoint_pages)
        self.path = Path(path)
        self.read_only = read_only
        self.durability = durability
        self.busy_timeout = busy_timeout
        self._conns = ThreadConnections(self._connect)
        self._closed = False
        self.schema_version = len(MIGRATIONS)
        self._kv, self._runs, self._journal = _TABLES
        self._checksums = True  # rows carry a crc: every store but an older one read-only
        self._times = True  # journal rows carry their times: likewise
        self._extras = True  # timers, messages...: every store but an older one read-only
        self._webhooks = True  # the webhook outbox: likewise
        with _FEEDS_LOCK:
            feed = _FEEDS.get(str(self.path.resolve()))
            if feed is None:
                feed = ChangeFeed(poll=POLL_INTERVAL)
                _FEEDS[str(self.path.resolve())] = feed
        self._feed = feed
        self.preallocate_wal = preallocate_wal
        self.checkpoint_pages = checkpoint_pages
        tend = preallocate_wal and durability == "full"
        self._wal = WalTender(Path(f"{self.path}-wal")) if tend and not read_only else None
        try:
            self._check_wal()
            if read_only:
                self._check_read_only()
            else:
                self._setup()
        except BaseException:
            self.close()  # a store that failed to open keeps no connection open
            raise

    def _check_wal(self) -> None:
        """Refuse a store whose WAL holds commits SQLite would silently drop (a changed
        byte in a committed frame or in the WAL's header): opening it would read the
        store as it was before them, resume runs from there, and the first write would
        overwrite them for good."""
        problem = wal_damage(self.path)
        if problem is not None:
            raise StoreDamagedError(
                f"{str(self.path)!r} is damaged: {problem}; nothing was written. Restore "
                "the store (the file with its -wal) from a backup; to open it anyway, "
                f"giving those transactions up, move {self.path}-wal and {self.path}-shm "
                "away first"
            )

    # -- connections ---------------------------------------------------------------------
    def _connect_read_only(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro",
            uri=True,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.text_factory = lenient_text
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            return self._connect_read_only()
        conn = sqlite3.connect(
            str(self.path),
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.text_factory = lenient_text  # invalid UTF-8: CheckpointCorruptError, by key
        try:
            mode = self._switch_to_wal(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if is_busy(exc):
                raise StoreError(
                    f"could not open {str(self.path)!r}: another process kept it locked "
                    f"for {self.busy_timeout}s ({exc}); retry, or raise busy_timeout"
                ) from exc
            raise _not_a_store(
                self.path, exc, "pass a stepstone store file, or a new path to create one"
            ) from exc
        except UnicodeDecodeError as exc:  # SQLite's message quotes a damaged schema text
            conn.close()
            raise _damaged_schema(self.path, "or another table definition is damaged") from exc
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"could not switch {str(self.path)!r} to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.durability == 'full' else 'NORMAL'}")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        conn.execute(f"PRAGMA wal_autocheckpoint={self.checkpoint_pages}")
        return conn

    def _switch_to_wal(self, conn: sqlite3.Connection) -> str:
        """Put the file in WAL mode (a no-op once it is) and return the mode it is in.

        Processes that open a new file at once each read it in rollback mode, and the
        switch upgrades that read lock to a write lock: SQLite answers a second upgrade
        with SQLITE_BUSY at once, without waiting (waiting could deadlock). The switch is
        retried until the busy timeout; the other process has switched the file by then."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.002)

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (closed when the thread ends, or the store closes)."""
        if self._closed:
            raise StoreError(f"store {self.describe()} is closed")
        return self._conns.get()

    @contextmanager
    def _tx(self, *, flush: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the write lock up front, so two
        writers never deadlock upgrading read locks; the busy timeout queues them. On an
        error (including a failed COMMIT) the transaction is rolled back. ``flush=False``
        commits without syncing the WAL (as ``synchronous=NORMAL``): the next synced
        commit of the file, from any connection, syncs it too."""
        if self.read_only:
            raise StoreError(
                f"store {self.describe()} was opened read-only; open it without "
                "read_only=True to write"
            )
        conn = self._conn()
        if not flush and self.durability == "full":
            conn.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._tx() as inner:
                    yield inner
            finally:
                conn.execute("PRAGMA synchronous=FULL")
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise file_error(self.path, exc) or StoreError(
                f"could not lock {str(self.path)!r} for writing within {self.busy_timeout}s: "
                f"{exc}; another process holds a long write transaction"
            ) from exc
        if self._wal is not None and not self._wal.tend(conn):
            self._wal = None  # the disk is full: commits grow the file as SQLite does
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @file_errors
    def _setup(self) -> None:
        if self._schema_is_current() and (self._wal is None or self._wal.allocated()):
            return  # nothing to write: no migration, the WAL's space allocated
        with self._tx() as conn:
            fresh = not _has_table(conn, "stepstone_schema")
            if fresh:
                conn.execute(
                    "CREATE TABLE stepstone_schema "
                    "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
                )
                current = 0
            else:
                current = _schema_version(conn, self.path)
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"{str(self.path)!r} has schema version {current}, newer than this "
                    f"stepstone ({len(MIGRATIONS)}); upgrade stepstone"
                )
            _check_layout(conn, current, self.path)
            if current == 0:
                # A new store gets the current schema at once; the migrations are for files
                # an older stepstone wrote.
                run_script(conn, SCHEMA)
                conn.execute(
                    "INSERT INTO stepstone_schema (version, applied_at) VALUES (?, ?)",
                    (len(MIGRATIONS), time.time()),
                )
                return
            for version in range(current + 1, len(MIGRATIONS) + 1):
                run_script(conn, MIGRATIONS[version - 1])
                conn.execute(
                    "INSERT INTO stepstone_schema (version, applied_at) VALUES (?, ?)",
                    (version, time.time()),
                )

    def _schema_is_current(self) -> bool:
        """Whether the file already holds this stepstone's schema, its tables as that
        version has them: read in one snapshot without the write lock, so that opening a
        store beside a busy writer does not queue behind its commits (WAL readers never
        wait). A new file, an older or newer schema, or a WAL to allocate goes through
        :meth:`_setup`'s write transaction, which reads it all again under the lock."""
        conn = self._conn()
        conn.execute("BEGIN")  # deferred: a read snapshot, no lock on writers
        try:
            if not _has_table(conn, "stepstone_schema"):
                return False
            current = _schema_version(conn, self.path)
            if current != len(MIGRATIONS):
                return False
            _check_layout(conn, current, self.path)
            return True
        finally:
            if conn.in_transaction:  # SQLite ends it itself on some errors
                conn.execute("ROLLBACK")

    def _check_read_only(self) -> None:
        """Refuse a file that is not a stepstone store; read an older one as it is."""
        conn = self._conn()
        where = repr(str(self.path))
        try:
            has_schema = _has_table(conn, "stepstone_schema")
            version = _schema_version(conn, self.path) if has_schema else 0
            if has_schema and version <= len(MIGRATIONS):
                _check_layout(conn, version, self.path)
        except StoreDamagedError:
            self.close()
            raise
        except UnicodeDecodeError as exc:  # SQLite's message quotes a damaged schema text
            self.close()
            raise _damaged_schema(self.path, "or another table definition is damaged") from exc
        except sqlite3.DatabaseError as exc:
            self.close()
            raise _not_a_store(self.path, exc, "pass a stepstone store file") from exc
        if not has_schema or version == 0:
            self.close()
            raise StoreError(
                f"{where} is a SQLite file but not a stepstone store (no stepstone_schema "
                "table); pass the file your Store(db=...) writes to"
            )
        if version > len(MIGRATIONS):
            self.close()
            raise StoreError(
                f"{where} has stepstone schema version {version}, newer than this stepstone "
                f"({len(MIGRATIONS)}); upgrade stepstone"
            )
        self.schema_version = version
        self._kv, self._runs, self._journal = _tables_of(version)
        self._checksums = version >= _CRC_VERSION
        self._times = version >= TIMES_VERSION
        self._extras = version >= _EXTRAS_VERSION
        self._webhooks = version >= _WEBHOOKS_VERSION

    def close(self) -> None:
        self._closed = True
        self._conns.close_all()

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def integrity(self, *, quick: bool = False) -> list[str] | None:
        """SQLite's ``integrity_check`` (or ``quick_check``) of the file, at most 100 of its
        answers, each finding a line of its own, on a read-only connection of its own (the
        file is read as the last commit left it, WAL included)."""
        conn = self._connect_read_only()
        try:
            pragma = "quick_check" if quick else "integrity_check"
            lines = [str(row[0]) for row in conn.execute(f"PRAGMA {pragma}(100)")]
        except sqlite3.DatabaseError as exc:
            return [f"{exc} ({getattr(exc, 'sqlite_errorname', 'error')})"]
        finally:
            conn.close()
        if lines == ["ok"]:
            return []
        # One answer row may hold several findings, one a line, under a header naming the
        # database ("*** in database main ***"): a report lists each finding on its own.
        return [
            part
            for line in lines
            for part in line.splitlines()
            if part.strip() and not part.startswith("*** in database ")
        ]

    @file_errors
    def checksums(self) -> str | None:
        if not self._checksums:
            return (
                f"none: this store's schema (version {self.schema_version}) predates row "
                "checksums; open it once for writing to add them (rows gain theirs when "
                "next written)"
            )
        conn = self._conn()
        bare = sum(
            int(conn.execute(f"SELECT count(*) FROM {table} WHERE crc IS NULL").fetchone()[0])
            for table in (self._kv, self._runs, self._journal)
        )
        if not bare:
            return "a checksum on every row"
        return (
            f"a checksum on every row but {bare} written by an older stepstone (read "
            "unchecked; a value or run head gains one when next written)"
        )

    # -- checked rows (every read of a row checks its checksum: _sqlite_rows) -------------
    @property
    def _value_sql(self) -> str:
        return f"SELECT value{', crc' if self._checksums else ''} FROM {self._kv} WHERE key = ?"

    def _value(self, key: Any, row: Sequence[Any]) -> str:
        """The value of a kv row selected by :attr:`_value_sql`, its checksum checked."""
        return str(checked_value(key, row[0], row[1]) if self._checksums else row[0])

    def _head(self, row: Sequence[Any]) -> RunHead:
        """A head selected as :attr:`_head_cols`, its checksum checked, decoded."""
        return head_from_row(checked_head_row(row) if self._checksums else row)

    @property
    def _head_cols(self) -> str:
        return f"{_HEAD_COLS}, crc" if self._checksums else _HEAD_COLS

    @property
    def _journal_cols(self) -> str:
        crc = ", crc" if self._checksums else ""
        return f"seq, kind, name, data{crc}{', started_at, committed_at' if self._times else ''}"

    def _journal_row(self, key: str, row: Sequence[Any]) -> JournalRow:
        """A journal row selected as :attr:`_journal_cols`, its checksum checked, decoded."""
        if self._times and self._checksums:  # the current schema: one unpacking
            seq, kind, name, data, crc, started_at, committed_at = row
            if crc is not None:
                checked_journal_row(key, seq, kind, name, data, crc)
            return journal_row(key, seq, kind, name, data, started_at, committed_at)
        body, times = (row[:-2], row[-2:]) if self._times else (row, ())
        return journal_row(
            key, *(checked_journal_row(key, *body) if self._checksums else body), *times
        )

    # -- key/value -----------------------------------------------------------------------
    @file_errors
    def kv_get(self, key: str) -> str | None:
        row = self._conn().execute(self._value_sql, (key,)).fetchone()
        return None if row is None else self._value(key, row)

    @file_errors
    def kv_put(self, key: str, text: str) -> None:
        with self._tx() as conn:
            if conn.execute(f"SELECT 1 FROM {self._runs} WHERE key = ?", (key,)).fetchone():
                raise run_key_conflict(key)
            conn.execute(kv_upsert_sql(self._kv), kv_params(key, text, time.time()))

    @file_errors
    def kv_delete(self, key: str) -> bool:
        with self._tx() as conn:
            n = conn.execute(f"DELETE FROM {self._kv} WHERE key = ?", (key,)).rowcount
            n += conn.execute(f"DELETE FROM {self._runs} WHERE key = ?", (key,)).rowcount
            conn.execute(f"DELETE FROM {self._journal} WHERE run_key = ?", (key,))
            _drop_extras(conn, key, messages=True)
            return n > 0

    @file_errors
    def kv_keys(self, prefix: str | None) -> list[str]:
        conn = self._conn()
        if prefix is None:
            rows = conn.execute(
                f"SELECT key FROM {self._kv} UNION SELECT key FROM {self._runs} ORDER BY 1"
            )
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(
                f"SELECT key FROM {self._kv} WHERE {where} UNION "
                f"SELECT key FROM {self._runs} WHERE {where} ORDER BY 1",
                args + args,
            )
        return [str(r[0]) for r in rows]

    @file_errors
    def kv_items(self, prefix: str | None) -> list[tuple[str, str]]:
        conn = self._conn()
        cols = f"key, value{', crc' if self._checksums else ''}"
        if prefix is None:
            rows = conn.execute(f"SELECT {cols} FROM {self._kv} ORDER BY key")
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(f"SELECT {cols} FROM {self._kv} WHERE {where} ORDER BY key", args)
        return [(str(row[0]), self._value(row[0], row[1:])) for row in rows]

    @file_errors
    def kv_cas(
        self, key: str, expected: Any, new_text: str, equal: Callable[[str, Any], bool]
    ) -> bool:
        with self._tx() as conn:
            if conn.execute(f"SELECT 1 FROM {self._runs} WHERE key = ?", (key,)).fetchone():
                raise run_key_conflict(key)
            row = conn.execute(self._value_sql, (key,)).fetchone()
            if expected is None:
                if row is not None:
                    return False
            elif row is None or not equal(self._value(key, row), expected):
                return False
            conn.execute(kv_upsert_sql(self._kv), kv_params(key, new_text, time.time()))
            return True

    # -- runs ----------------------------------------------------------------------------
    @file_errors
    def run_get(self, key: str) -> RunHead | None:
        row = (
            self._conn()
            .execute(f"SELECT {self._head_cols} FROM {self._runs} WHERE key = ?", (key,))
            .fetchone()
        )
        return None if row is None else self._head(row)

    @file_errors
    def run_transact(self, key: str, decide: Decide) -> RunHead | None:
        with self._tx() as conn:
            return self.transact_in(conn, key, decide)

    @file_errors
    def run_claim(self, key: str, decide: Decide) -> RunHead | None:
        """A claim commits without its own fsync: other processes see it at once, and the
        run's first step commit (or its release) syncs the WAL with it. A power loss
        before that loses the claim with the step, as if the run had not started."""
        with self._tx(flush=False) as conn:
            return self.transact_in(conn, key, decide)

    def transact_in(self, conn: sqlite3.Connection, key: str, decide: Decide) -> RunHead | None:
        """:meth:`run_transact` inside the open write transaction of ``conn``."""
        row = conn.execute(
            f"SELECT {self._head_cols} FROM {self._runs} WHERE key = ?", (key,)
        ).fetchone()
        head = None if row is None else self._head(row)
        kv_row = conn.execute(self._value_sql, (key,)).fetchone()
        claim = decide(head, None if kv_row is None else self._value(key, kv_row))
        if claim is None:
            return head
        if (
            head is None
            and conn.execute(
                f"SELECT 1 FROM {self._journal} WHERE run_key = ? LIMIT 1", (key,)
            ).fetchone()
        ):
            # Rows no head counts: the run's head was lost or its key damaged in the file.
            # Starting over would drop them, and run again every step they hold.
            raise corrupt_error(
                key,
                "the key has journal rows but no run head (its head was lost, or a damaged "
                "byte moved it to another key)",
            )
        if claim.reset_journal:
            conn.execute(f"DELETE FROM {self._journal} WHERE run_key = ?", (key,))
            if head is not None:  # a run started over
                _drop_extras(conn, key, messages=False)
        if claim.drop_kv:
            conn.execute(f"DELETE FROM {self._kv} WHERE key = ?", (key,))
        conn.execute(head_insert_sql(self._runs), head_insert_params(claim.head))
        if claim.rows:
            conn.executemany(
                journal_insert_sql(self._journal), [journal_params(key, r) for r in claim.rows]
            )
        return claim.head

    @file_errors
    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                head_update_sql(self._runs), head_commit_params(head, expected_version)
            )
            if cur.rowcount != 1:
                return False
            if rows:
                conn.executemany(
                    journal_insert_sql(self._journal),
                    [journal_params(head.key, r, head.updated_at) for r in rows],
                )
            if writes:
                for wkey, _ in writes:
                    if conn.execute(
                        f"SELECT 1 FROM {self._runs} WHERE key = ?", (wkey,)
                    ).fetchone():
                        raise run_key_conflict(wkey)
                now = head.updated_at
                conn.executemany(
                    kv_upsert_sql(self._kv), [kv_params(wkey, text, now) for wkey, text in writes]
                )
            return True

    @file_errors
    def run_renew(self, key: str, run_uid: str, lease_until: float) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE {self._runs} SET lease_until = ? WHERE key = ? AND run_uid = ?",
                (lease_until, key, run_uid),
            )
            return cur.rowcount == 1

    @file_errors
    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        rows = self._conn().execute(
            f"SELECT {self._journal_cols} FROM {self._journal} "
            "WHERE run_key = ? AND seq >= ? ORDER BY seq",
            (key, since_seq),
        )
        return [self._journal_row(key, row) for row in rows]

    @file_errors
    def run_journal_row(self, key: str, seq: int) -> JournalRow | None:
        found = (
            self._conn()
            .execute(
                f"SELECT {self._journal_cols} FROM {self._journal} WHERE run_key = ? AND seq = ?",
                (key, seq),
            )
            .fetchone()
        )
        return None if found is None else self._journal_row(key, found)

    @file_errors
    def journal_faults(self, keys: Sequence[str]) -> dict[str, str]:
        if not self._checksums or not keys:
            return {}
        conn = self._conn()
        select = f"SELECT run_key, {self._journal_cols} FROM {self._journal}"
        if len(keys) <= _FAULTS_BY_KEY:  # a page of runs: each journal by the key's index
            found = (
                row
                for key in keys
                for row in conn.execute(f"{select} WHERE run_key = ? ORDER BY seq", (key,))
            )
        else:  # most of a store: one pass over the table
            wanted = set(keys)
            found = (row for row in conn.execute(select) if row[0] in wanted)
        faults: dict[str, str] = {}
        for row in found:
            key = row[0]
            if key in faults:
                continue
            try:
                self._journal_row(key, row[1:])
            except CheckpointCorruptError as exc:
                faults[key] = exc.fault or str(exc)
        return faults

    @file_errors
    def headless_journal_keys(self) -> list[str]:
        rows = self._conn().execute(
            f"SELECT DISTINCT run_key FROM {self._journal} "
            f"WHERE run_key NOT IN (SELECT key FROM {self._runs}) ORDER BY run_key"
        )
        return [printable_key(key) for (key,) in rows]

    @file_errors
    def run_list(self, prefix: str | None) -> list[RunHead]:
        conn = self._conn()
        if prefix is None:
            rows = conn.execute(f"SELECT {self._head_cols} FROM {self._runs} ORDER BY key")
        else:
            where, args = _prefix_sql(prefix)
            rows = conn.execute(
                f"SELECT {self._head_cols} FROM {self._runs} WHERE {where} ORDER BY key", args
            )
        return heads_for_listing(list(rows), self._head)

    # -- timers, messages, events, streams (store/_extras.py) ----------------------------
    @file_errors
    def run_commit_extras(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
        extras: ExtraWrites,
    ) -> bool:
        key = extras.key or head.key  # whose records
        with self._tx() as conn:
            cur = conn.execute(
                head_update_sql(self._runs), head_commit_params(head, expected_version)
            )
            if cur.rowcount != 1:
                return False
            if rows:
                conn.executemany(
                    journal_insert_sql(self._journal),
                    [journal_params(head.key, r, head.updated_at) for r in rows],
                )
            now = head.updated_at
            if writes:
                for wkey, _ in writes:
                    if conn.execute(
                        f"SELECT 1 FROM {self._runs} WHERE key = ?", (wkey,)
                    ).fetchone():
                        raise run_key_conflict(wkey)
                conn.executemany(
                    kv_upsert_sql(self._kv), [kv_params(wkey, text, now) for wkey, text in writes]
                )
            _write_extras(conn, key, extras, now)
        self._feed.publish(run_topic(key))
        return True

    @file_errors
    def message_send(
        self, run_key: str, topic: str, data: str, *, refuse: Collection[str]
    ) -> int | None:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT status FROM {self._runs} WHERE key = ?", (run_key,)
            ).fetchone()
            if row is not None and row[0] in refuse:
                return None
            now = time.time()
            cur = conn.execute(
                "INSERT INTO stepstone_messages (run_key, topic, data, sent_at, crc) "
                "VALUES (?, ?, ?, ?, ?)",
                (run_key, topic, data, now, message_crc(run_key, topic, data, now)),
            )
            mid = int(cur.lastrowid or 0)
            woken: list[tuple[Any, ...]] = []
            if conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stepstone_queue'"
            ).fetchone():
                # A run a worker parked waiting for this topic: runnable now (same transaction).
                woken = conn.execute(
                    "UPDATE stepstone_queue SET not_before = ?, updated_at = ? "
                    "WHERE run_key = ? AND status = 'queued' AND not_before > ? AND EXISTS "
                    "(SELECT 1 FROM stepstone_timers WHERE run_key = ? AND topic = ?) "
                    "RETURNING queue",
                    (now, now, run_key, now, run_key, topic),
                ).fetchall()
        self._feed.publish(run_topic(run_key))
        for (queue,) in woken:  # the workers of this process take it at once
            self._feed.publish(queue_topic(str(queue)))
        return mid

    def _message(self, row: Sequence[Any]) -> Message:
        mid, key, topic, data, sent_at, consumed_at, crc = row
        checked_extra(key, f"message {mid}", crc, message_crc(key, topic, data, sent_at))
        return Message(
            id=int(mid),
            run_key=checked_text(key, key, f"message {mid} run key"),
            topic=checked_text(topic, key, f"message {mid} topic"),
            data=checked_text(data, key, f"message {mid}"),
            sent_at=float(sent_at),
            consumed_at=None if consumed_at is None else float(consumed_at),
        )

    @file_errors
    def message_next(self, run_key: str, topic: str) -> Message | None:
        if not self._extras:
            return None
        row = (
            self._conn()
            .execute(
                f"SELECT {_MESSAGE_COLS} FROM stepstone_messages "
                "WHERE run_key = ? AND topic = ? AND consumed_at IS NULL ORDER BY id LIMIT 1",
                (run_key, topic),
            )
            .fetchone()
        )
        return None if row is None else self._message(row)

    @file_errors
    def messages(self, run_key: str) -> list[Message]:
        if not self._extras:
            return []
        rows = self._conn().execute(
            f"SELECT {_MESSAGE_COLS} FROM stepstone_messages WHERE run_key = ? ORDER BY id",
            (run_key,),
        )
        return [self._message(row) for row in rows]

    @file_errors
    def event_set(self, run_key: str, name: str, data: str) -> None:
        with self._tx() as conn:
            _put_event(conn, run_key, name, data, time.time())
        self._feed.publish(run_topic(run_key))

    # -- the webhook outbox (store/_webhooks.py) ------------------------------------------
    @file_errors
    def webhook_add(self, record: WebhookRecord) -> bool:
        if not self._webhooks:
            raise self._no_webhooks()
        with self._tx() as conn:
            cur = conn.execute(
                f"INSERT OR IGNORE INTO stepstone_webhooks ({_WEBHOOK_COLS}) "
                f"VALUES ({', '.join('?' * len(WEBHOOK_COLUMNS))})",
                record.row(),
            )
            return cur.rowcount == 1

    @file_errors
    def webhook_get(self, id: str) -> WebhookRecord | None:
        if not self._webhooks:
            return None
        row = (
            self._conn()
            .execute(f"SELECT {_WEBHOOK_COLS} FROM stepstone_webhooks WHERE id = ?", (id,))
            .fetchone()
        )
        return None if row is None else WebhookRecord.of(row)

    @file_errors
    def webhook_list(
        self, run_key: str | None, statuses: Collection[str] | None = None
    ) -> list[WebhookRecord]:
        if not self._webhooks:
            return []
        where: list[str] = []
        params: list[Any] = []
        if run_key is not None:
            where.append("run_key = ?")
            params.append(run_key)
        if statuses is not None:
            if not statuses:
                return []
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params += list(statuses)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = (
            self._conn()
            .execute(
                f"SELECT {_WEBHOOK_COLS} FROM stepstone_webhooks{clause} ORDER BY created_at, id",
                params,
            )
            .fetchall()
        )
        return [WebhookRecord.of(row) for row in rows]

    @file_errors
    def webhook_update(self, record: WebhookRecord, expected_version: int) -> bool:
        if not self._webhooks:
            raise self._no_webhooks()
        names = WEBHOOK_COLUMNS[1:]
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE stepstone_webhooks SET {', '.join(f'{n} = ?' for n in names)} "
                "WHERE id = ? AND version = ?",
                (*record.row()[1:], record.id, expected_version),
            )
            return cur.rowcount == 1

    @staticmethod
    def _event(key: str, row: Sequence[Any]) -> EventValue:
        name, data, updated_at, crc = row
        checked_extra(key, f"event {name!r}", crc, event_crc(key, name, data, updated_at))
        return EventValue(
            name=checked_text(name, key, "an event name"),
            data=checked_text(data, key, f"event {name!r}"),
            updated_at=float(updated_at),
        )

    @file_errors
    def event_get(self, run_key: str, name: str) -> EventValue | None:
        if not self._extras:
            return None
        row = (
            self._conn()
            .execute(
                "SELECT name, data, updated_at, crc FROM stepstone_events "
                "WHERE run_key = ? AND name = ?",
                (run_key, name),
            )
            .fetchone()
        )
        return None if row is None else self._event(run_key, row)

    @file_errors
    def events(self, run_key: str) -> list[EventValue]:
        if not self._extras:
            return []
        rows = self._conn().execute(
            "SELECT name, data, updated_at, crc FROM stepstone_events "
            "WHERE run_key = ? ORDER BY name",
            (run_key,),
        )
        return [self._event(run_key, row) for row in rows]

    @file_errors
    def stream_append(self, run_key: str, name: str, data: str, attempt: int | None) -> int:
        with self._tx() as conn:
            offset = _append(conn, run_key, name, data, attempt, time.time())
        self._feed.publish(run_topic(run_key))
        return offset

    @file_errors
    def stream_read(self, run_key: str, name: str, start: int, limit: int) -> list[StreamEntry]:
        if not self._extras:
            return []
        rows = self._conn().execute(
            "SELECT pos, data, attempt, written_at, crc FROM stepstone_streams "
            "WHERE run_key = ? AND name = ? AND pos >= ? ORDER BY pos LIMIT ?",
            (run_key, name, start, limit),
        )
        out: list[StreamEntry] = []
        for pos, data, attempt, written_at, crc in rows:
            expected = stream_crc(run_key, name, pos, data, attempt, written_at)
            checked_extra(run_key, f"value {pos} of stream {name!r}", crc, expected)
            out.append(
                StreamEntry(
                    name=name,
                    offset=int(pos),
                    data=checked_text(data, run_key, f"value {pos} of stream {name!r}"),
                    attempt=None if attempt is None else int(attempt),
                    written_at=float(written_at),
                )
            )
        return out

    @file_errors
    def streams(self, run_key: str) -> list[tuple[str, int]]:
        if not self._extras:
            return []
        rows = self._conn().execute(
            "SELECT name, max(pos) + 1 FROM stepstone_streams WHERE run_key = ? "
            "GROUP BY name ORDER BY name",
            (run_key,),
        )
        return [(checked_text(name, run_key, "a stream name"), int(n)) for name, n in rows]

    @file_errors
    def timers(self, run_key: str | None) -> list[Timer]:
        if not self._extras:
            return []
        rows = self._conn().execute(
            "SELECT run_key, name, wake_at, topic, since, crc FROM stepstone_timers "
            "WHERE ? IS NULL OR run_key = ? ORDER BY run_key, name",
            (run_key, run_key),
        )
        out: list[Timer] = []
        for key, name, wake_at, topic, since, crc in rows:
            checked_extra(key, f"timer {name!r}", crc, timer_crc(key, name, wake_at, topic, since))
            out.append(
                Timer(
                    run_key=checked_text(key, key, "a timer's run key"),
                    name=checked_text(name, key, "a timer name"),
                    wake_at=None if wake_at is None else float(wake_at),
                    topic=None if topic is None else checked_text(topic, key, "a timer topic"),
                    since=float(since),
                )
            )
        return out

    def changes(self) -> ChangeFeed:
        return self._feed


_MESSAGE_COLS = "id, run_key, topic, data, sent_at, consumed_at, crc"


def _write_extras(conn: sqlite3.Connection, key: str, extras: ExtraWrites, now: float) -> None:
    """Write a commit's messages consumed, events, stream items and timers for run ``key``,
    in the commit's transaction (a message not pending raises: all of it rolls back)."""
    for mid in extras.consume:
        cur = conn.execute(
            "UPDATE stepstone_messages SET consumed_at = ? "
            "WHERE id = ? AND run_key = ? AND consumed_at IS NULL",
            (now, mid, key),
        )
        if cur.rowcount != 1:
            raise consumed_already(key, mid)  # rolled back: nothing is written
    for name, data in extras.events:
        _put_event(conn, key, name, data, now)
    for name, data in extras.stream:
        _append(conn, key, name, data, None, now)
    if extras.clear_timers:
        conn.executemany(
            "DELETE FROM stepstone_timers WHERE run_key = ? AND name = ?",
            [(key, name) for name in extras.clear_timers],
        )
    for timer in extras.timers:
        since = float(timer.since)
        wake = None if timer.wake_at is None else float(timer.wake_at)
        conn.execute(
            "INSERT OR REPLACE INTO stepstone_timers "
            "(run_key, name, wake_at, topic, since, crc) VALUES (?, ?, ?, ?, ?, ?)",
            (
                key,
                timer.name,
                wake,
                timer.topic,
                since,
                timer_crc(key, timer.name, wake, timer.topic, since),
            ),
        )


def _put_event(conn: sqlite3.Connection, key: str, name: str, data: str, now: float) -> None:
    now = float(now)
    conn.execute(
        "INSERT INTO stepstone_events (run_key, name, data, updated_at, crc) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_key, name) DO UPDATE SET "
        "data = excluded.data, updated_at = excluded.updated_at, crc = excluded.crc",
        (key, name, data, now, event_crc(key, name, data, now)),
    )


def _append(
    conn: sqlite3.Connection, key: str, name: str, data: str, attempt: int | None, now: float
) -> int:
    """Append to a stream inside ``conn``'s write transaction: the next offset is read
    under the write lock, so two writers never take one offset."""
    (offset,) = conn.execute(
        "SELECT coalesce(max(pos) + 1, 0) FROM stepstone_streams WHERE run_key = ? AND name = ?",
        (key, name),
    ).fetchone()
    offset, now = int(offset), float(now)
    conn.execute(
        "INSERT INTO stepstone_streams (run_key, name, pos, data, attempt, written_at, crc) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (key, name, offset, data, attempt, now, stream_crc(key, name, offset, data, attempt, now)),
    )
    return offset


def _drop_extras(conn: sqlite3.Connection, key: str, *, messages: bool) -> None:
    """Delete the run's timers, events and streams (and, with ``messages``, its messages)
    in ``conn``'s write transaction."""
    tables = ["stepstone_timers", "stepstone_events", "stepstone_streams"]
    if messages:
        tables.append("stepstone_messages")
    for table in tables:
        conn.execute(f"DELETE FROM {table} WHERE run_key = ?", (key,))


def _prefix_sql(prefix: str) -> tuple[str, tuple[str, ...]]:
    """An index range for keys starting with ``prefix`` (binary collation: exact and
    case-sensitive, where LIKE would not be)."""
    lo, hi = prefix_bounds(prefix)
    if hi is None:
        return "key >= ?", (lo,)
    return "key >= ? AND key < ?", (lo, hi)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def _schema_version(conn: sqlite3.Connection, path: Path) -> int:
    row = conn.execute("SELECT MAX(version) FROM stepstone_schema").fetchone()
    version = int(row[0] or 0)  # an INTEGER PRIMARY KEY: always an integer
    if version < 0:
        raise _damaged_schema(path, f"records schema version {version!r}, not a version number")
    return version


def _check_layout(conn: sqlite3.Connection, version: int, path: Path) -> None:
    """Raise StoreDamagedError unless the tables match the schema ``version`` recorded
    (0: none yet), with their columns: a lost or changed version row must never make the
    store create its tables again, or run a migration over tables it already migrated, and
    a damaged table definition is found at open, not as a bare "no such column" later."""
    present = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    tables = _tables_of(version) if version else ()
    extras = {t: c for v, added in _ADDED_TABLES.items() if v <= version for t, c in added.items()}
    every_added = {t for added in _ADDED_TABLES.values() for t in added}
    expected = set(tables) | set(extras)
    later = {t for v in range(version + 1, len(MIGRATIONS) + 1) for t in _tables_of(v)}
    later = (later | every_added) - expected
    missing, extra = expected - present, later & present
    if version == 0:
        extra = (set(_TABLES) | every_added) & present
    if not missing and not extra:
        checks = [*zip(tables, _columns_of(version), strict=False), *extras.items()]
        for table, columns in checks:
            found_columns = tuple(str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})"))
            if found_columns != columns:
                raise _damaged_schema(
                    path,
                    f"records schema version {version}, but table {table} has the columns "
                    f"({', '.join(found_columns)}) instead of ({', '.join(columns)})",
                )
        if version >= _CRC_VERSION:
            _check_triggers(conn, tables, version, path)
        return
    found = f"lacks {', '.join(sorted(missing))}" if missing else ""
    found += (" and " if missing and extra else "") + (
        f"has {', '.join(sorted(extra))}, which a later version creates" if extra else ""
    )
    raise _damaged_schema(path, f"records schema version {version}, but the file {found}")


def _check_triggers(
    conn: sqlite3.Connection, tables: tuple[str, ...], version: int, path: Path
) -> None:
    """Raise StoreDamagedError unless the checksum triggers of ``tables`` are there as
    written: a damaged byte in one's text would make every update of its table fail with a
    bare "no such column"."""
    for statement in statements(crc_triggers(*tables)):
        state = trigger_state(conn, statement)
        if state is not None:
            name = statement.split()[2]
            raise _damaged_schema(
                path, f"records schema version {version}, but its trigger {name} is {state}"
            )


def trigger_state(conn: sqlite3.Connection, statement: str) -> str | None:
    """None when the trigger the ``CREATE TRIGGER`` ``statement`` makes is in the file as
    that statement wrote it; ``"missing"`` or ``"damaged"`` otherwise. (SQLite keeps a
    statement's text without its ``IF NOT EXISTS``.)"""
    text = " ".join(statement.replace(" IF NOT EXISTS", "").split()).rstrip(";")
    row = conn.execute(
        "SELECT CAST(sql AS BLOB) FROM sqlite_master WHERE type = 'trigger' AND name = ?",
        (text.split()[2],),
    ).fetchone()
    if row is None:
        return "missing"
    written = " ".join(bytes(row[0]).decode("utf-8", "replace").split()).rstrip(";")
    return None if written == text else "damaged"


def _tables_of(version: int) -> tuple[str, str, str]:
    """The kv, runs and journal tables of schema ``version``."""
    return _LEGACY_TABLES.get(version, _TABLES)


def _damaged_schema(path: Path, what: str) -> StoreDamagedError:
    return damaged_definition(path, f"its stepstone_schema table {what}")


def damaged_definition(path: Path, what: str) -> StoreDamagedError:
    """The error for a file whose table or trigger definitions are damaged as ``what``
    says (found before anything is written)."""
    return StoreDamagedError(
        f"{str(path)!r} is damaged: {what}; nothing was written. See what is affected with "
        f"`stepstone check --db {path}`, then restore the file from a backup"
    )


def statements(script: str) -> Iterator[str]:
    """The statements of ``script``, each ending at the ``;`` that completes it (a
    trigger's body holds its own)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending.strip()
            pending = ""
    if pending.strip(" \n;"):
        yield pending.strip()  # incomplete: executing it raises


def run_script(conn: sqlite3.Connection, script: str) -> None:
    """Run the statements of ``script`` in ``conn``'s open transaction, one by one
    (``executescript()`` would COMMIT it)."""
    for statement in statements(script):
        conn.execute(statement)
