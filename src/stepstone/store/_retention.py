"""Retention settings for durable runs, and reclaiming a SQLite file's free pages.

:class:`Retention` only describes which finished runs may go; ``stepstone.durable.prune``
applies it (it needs the kernel's ownership rules so a live run is never deleted).
:func:`vacuum` gives the space of deleted rows back to the file system.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

from stepstone.exceptions import StoreError
from stepstone.store._base import Backend

__all__ = ["PRUNABLE_STATUSES", "Retention", "VacuumReport", "vacuum"]

#: Statuses a retention policy may name. A live owner is never pruned whatever its status;
#: ``claimed``/``running`` here only match runs whose owner died (stranded runs).
PRUNABLE_STATUSES = ("done", "failed", "paused", "claimed", "running")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """Which finished runs ``prune`` deletes.

    A run is deleted when its status is in ``statuses``, its key starts with ``prefix``, its
    owner is not alive, it has not changed for at least ``min_age``, and it is either older
    than ``ttl`` (time since its last commit) or not among the ``keep_last`` most recently
    updated matching runs. Fork runs (``on_concurrent="fork"``) go with their ``writes=``
    values.

    Attributes:
        ttl: Delete matching runs whose last commit is older than this.
        keep_last: Keep only the N most recently updated matching runs.
        statuses: Statuses that may be deleted (default: only ``"done"``).
        prefix: Only runs whose key starts with this (all runs when None). A tuple of
            prefixes applies the policy to each group separately: ``keep_last=10,
            prefix=("etl-", "report-")`` keeps the 10 newest of each.
        min_age: Never delete a run updated less than this long ago, whatever ``ttl`` and
            ``keep_last`` say (protects a run that just finished and is being read).

    Example::

        store = Store(db="runs.sqlite", retention=Retention(ttl=timedelta(days=30)))
        prune(store)          # from stepstone.durable
    """

    ttl: timedelta | None = None
    keep_last: int | None = None
    statuses: tuple[str, ...] = ("done",)
    prefix: str | tuple[str, ...] | None = None
    min_age: timedelta = timedelta(minutes=5)

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The key prefixes of the groups the policy applies to (``("",)``: every run)."""
        if self.prefix is None:
            return ("",)
        return (self.prefix,) if isinstance(self.prefix, str) else self.prefix

    def __post_init__(self) -> None:
        self._check_limits()
        self._normalize_prefix()
        self._normalize_statuses()

    def _check_limits(self) -> None:
        """Refuse a bad ``ttl``, ``keep_last`` or ``min_age`` (or neither limit)."""
        if self.ttl is None and self.keep_last is None:
            raise ValueError(
                "Retention needs ttl= (e.g. timedelta(days=30)) or keep_last= (e.g. 100), or both"
            )
        for name in ("ttl", "min_age"):
            value = getattr(self, name)
            if (value is not None or name == "min_age") and not isinstance(value, timedelta):
                raise TypeError(
                    f"Retention {name} must be a timedelta (e.g. timedelta(days=30)), got {value!r}"
                )
        if self.ttl is not None and self.ttl < timedelta(0):
            raise ValueError(f"Retention ttl must be >= 0, got {self.ttl!r}")
        if self.keep_last is not None and (
            isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int)
        ):
            raise TypeError(f"Retention keep_last must be a whole number, got {self.keep_last!r}")
        if self.keep_last is not None and self.keep_last < 0:
            raise ValueError(f"Retention keep_last must be >= 0, got {self.keep_last!r}")
        if self.min_age < timedelta(0):
            raise ValueError(f"Retention min_age must be >= 0, got {self.min_age!r}")

    def _normalize_prefix(self) -> None:
        """``prefix`` as a str, a tuple of str, or None (a list becomes a tuple)."""
        if isinstance(self.prefix, list):
            object.__setattr__(self, "prefix", tuple(self.prefix))
        prefixes = self.prefix if isinstance(self.prefix, tuple) else (self.prefix or "",)
        if not all(isinstance(p, str) for p in prefixes):
            raise TypeError(
                f"Retention prefix must be a str, a tuple of str, or None, got {self.prefix!r}"
            )
        if isinstance(self.prefix, tuple) and not self.prefix:
            raise ValueError("Retention prefix=() names no group; pass None for every run")

    def _normalize_statuses(self) -> None:
        """``statuses`` as a non-empty tuple of prunable statuses (a str becomes a tuple)."""
        if isinstance(self.statuses, str):
            object.__setattr__(self, "statuses", (self.statuses,))
        bad = [s for s in self.statuses if s not in PRUNABLE_STATUSES]
        if bad or not self.statuses:
            raise ValueError(
                f"Retention statuses must be a non-empty subset of {PRUNABLE_STATUSES}, got "
                f"{self.statuses!r}"
            )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VacuumReport:
    """What :func:`vacuum` did.

    Attributes:
        path: The SQLite file.
        bytes_before: Size of the file plus its WAL before.
        bytes_after: Size after.
        full: True when the file was rewritten once to switch it to incremental vacuum.
    """

    path: str
    bytes_before: int
    bytes_after: int
    full: bool


def _size(path: Path) -> int:
    total = 0
    for p in (path, path.with_name(path.name + "-wal")):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


def vacuum(backend: Backend, *, busy_timeout: float = 30.0) -> VacuumReport:
    """Give a store's free space back after a prune.

    On SQLite the file shrinks: the first call on a file rewrites it once (``VACUUM``) to
    switch it to ``auto_vacuum=INCREMENTAL``; later calls only run ``PRAGMA
    incremental_vacuum``, which moves no live data and costs little. Both end with a WAL
    checkpoint that truncates the ``-wal`` file. Safe while other processes use the file:
    it waits for their write locks. On PostgreSQL it runs ``VACUUM (ANALYZE)`` on
    stepstone's tables (deleted rows' space becomes reusable; empty tail pages are freed).

    Raises:
        StoreError: the store is neither a SQLite file nor PostgreSQL, or the file stayed
            locked longer than ``busy_timeout``.
    """
    import sqlite3  # only here: `import stepstone` stays free of the driver

    if type(backend).__name__ == "PostgresBackend":
        return _vacuum_postgres(backend)
    path = getattr(backend, "path", None)
    if not isinstance(path, Path) or str(path) == ":memory:":
        raise StoreError(f"vacuum works on SQLite files and PostgreSQL, not {backend.describe()}")
    before = _size(path)
    conn = sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None)
    try:
        mode = int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])
        full = mode != 2
        if full:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
        else:
            # executescript steps the pragma to completion; execute() frees only one page
            conn.executescript("PRAGMA incremental_vacuum;")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.OperationalError as exc:
        raise StoreError(
            f"could not vacuum {str(path)!r}: {exc}; another process held the file longer "
            f"than {busy_timeout}s, retry when it is idle"
        ) from exc
    finally:
        conn.close()
    return VacuumReport(path=str(path), bytes_before=before, bytes_after=_size(path), full=full)


_PG_TABLES = ("stepstone_journal", "stepstone_runs", "stepstone_kv")


def _vacuum_postgres(backend: Backend) -> VacuumReport:
    """``VACUUM (ANALYZE)`` stepstone's tables: deleted rows' space becomes reusable, and
    empty pages at the end of a table go back to the file system. (``VACUUM FULL``
    rewrites the tables under an exclusive lock: a maintenance-window decision left to
    the operator.)"""
    import psycopg

    try:
        with backend.connect() as conn:  # type: ignore[attr-defined]  # a PostgresBackend

            def size() -> int:
                row = conn.execute(
                    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relname = ANY(%s) AND n.nspname = ANY(current_schemas(false))",
                    (list(_PG_TABLES),),
                ).fetchone()
                return int(row[0]) if row else 0

            before = size()
            for table in _PG_TABLES:
                conn.execute(f"VACUUM (ANALYZE) {table}")
            after = size()
    except psycopg.Error as exc:
        raise StoreError(
            f"could not vacuum {backend.describe()}: {exc}; check the connection and that "
            "the user owns stepstone's tables"
        ) from exc
    return VacuumReport(path=backend.describe(), bytes_before=before, bytes_after=after, full=False)
