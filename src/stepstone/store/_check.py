"""Checking a whole store: its file's pages, then every record, one key at a time.

``stepstone check`` and :func:`check_store` answer "what is damaged, and what is still
readable?" after a crash of the disk or a file copied half-way. The file is checked first
(SQLite's ``integrity_check``: a backend without pages of its own to check skips it), then
every key is read as :meth:`Store.read_entry <stepstone.store.Store.read_entry>` reads it
(a run through its kind's view, then its timers, messages, events and streams), so a
record an engine could not resume from is reported with the reason that engine would give.
One bad record never stops the check of the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepstone.exceptions import StoreDamagedError
from stepstone.store._base import Backend, printable_key, read_consistent
from stepstone.store._views import render_run

if TYPE_CHECKING:
    from stepstone.store._store import Store

__all__ = ["CheckProblem", "CheckReport", "check_store", "problem_text"]


@dataclasses.dataclass(frozen=True, slots=True)
class CheckProblem:
    """One thing found wrong: ``where`` is ``"file"`` (the store's pages), ``"keys"`` (the
    key listing itself) or ``"record"`` (the value or run under ``key``)."""

    where: str
    key: str | None
    detail: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """What :func:`check_store` read and found.

    Attributes:
        store: The store's description (``sqlite:/path/runs.sqlite``).
        file_checked: Whether the file's pages were checked (SQLite; PostgreSQL keeps its
            own pages' checksums).
        checksums: What finds a byte changed inside a stored value (SQLite: the checksum
            every row carries; PostgreSQL: its page checksums, when the cluster has them
            on), or None (nothing: a memory store, or it could not be told).
        quick: Whether the file check was SQLite's faster ``quick_check`` (it skips
            checking that indexes match their tables).
        runs: Runs read.
        values: Plain values read.
        journal_rows: Journal rows read, over all runs.
        problems: Everything found wrong, file first, then by key.
    """

    store: str
    file_checked: bool
    quick: bool
    runs: int
    values: int
    journal_rows: int
    problems: tuple[CheckProblem, ...]
    checksums: str | None = None

    @property
    def ok(self) -> bool:
        """Whether nothing was found wrong."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object (``stepstone check --json``)."""
        return {
            "store": self.store,
            "ok": self.ok,
            "file_checked": self.file_checked,
            "quick": self.quick,
            "runs": self.runs,
            "values": self.values,
            "journal_rows": self.journal_rows,
            "checksums": self.checksums,
            "problems": [dataclasses.asdict(p) for p in self.problems],
        }


def check_store(
    store: Store,
    *,
    quick: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check ``store``'s file and read every record in it; nothing is written.

    Args:
        store: The store (open it with ``read_only=True`` to be sure nothing changes).
        quick: Use SQLite's ``quick_check`` instead of ``integrity_check`` (much faster on
            a large file; it does not check that indexes match their tables).
        progress: Called as ``progress(done, total)`` after each key is read.

    Example::

        report = check_store(Store(db="runs.sqlite", read_only=True))
        for problem in report.problems:
            print(problem.where, problem.key, problem.detail)
    """
    backend = store.backend
    problems: list[CheckProblem] = []
    try:
        found = backend.integrity(quick=quick)
    except Exception as exc:  # noqa: BLE001 - reported: the records are still read below
        found = [problem_text(exc)]
    problems += [CheckProblem("file", None, line) for line in found or ()]
    keys = _keys(backend, problems)
    runs = values = rows = 0
    for done, key in enumerate(keys, 1):
        try:
            n = _read(store, key)
        except Exception as exc:  # noqa: BLE001 - one bad record never stops the check
            problems.append(CheckProblem("record", key, problem_text(exc)))
        else:
            if n is None:
                values += 1
            else:
                runs, rows = runs + 1, rows + n
        if progress is not None:
            progress(done, len(keys))
    try:
        headless = backend.headless_journal_keys()
    except Exception as exc:  # noqa: BLE001 - reported; what was read above stands
        problems.append(CheckProblem("keys", None, f"cannot list the journal: {problem_text(exc)}"))
    else:
        problems += [
            CheckProblem(
                "record",
                key,
                "journal rows with no run head (the head was lost, or a damaged byte moved it "
                f"to another key); remove them with store.delete({key!r})",
            )
            for key in headless
        ]
    try:
        checksums = backend.checksums()
    except Exception:  # noqa: BLE001 - a note only; the damage it would meet is reported above
        checksums = None
    return CheckReport(
        store=backend.describe(),
        checksums=checksums,
        file_checked=found is not None,
        quick=quick,
        runs=runs,
        values=values,
        journal_rows=rows,
        problems=tuple(problems),
    )


def _keys(backend: Backend, problems: list[CheckProblem]) -> list[str]:
    """Every key; when the listing fails, the runs' and the values' keys each listed on its
    own, so damage to one table still lets the other be read."""
    try:
        return backend.kv_keys(None)
    except Exception as exc:  # noqa: BLE001 - reported, then each table on its own
        problems.append(CheckProblem("keys", None, problem_text(exc)))
    keys: list[str] = []
    try:
        keys += [head.key for head in backend.run_list(None)]
    except Exception as exc:  # noqa: BLE001 - no run can be listed
        problems.append(CheckProblem("keys", None, f"cannot list the runs: {problem_text(exc)}"))
    try:
        keys += [key for key, _ in backend.kv_items(None)]
    except Exception as exc:  # noqa: BLE001 - no value can be listed
        problems.append(CheckProblem("keys", None, f"cannot list the values: {problem_text(exc)}"))
    return sorted(keys)


def _read(store: Store, key: str) -> int | None:
    """Read the record under ``key`` as an engine would: None for a plain value, else the
    run's journal rows (a key deleted meanwhile counts as a value)."""
    found = read_consistent(store.backend, key)
    if found is None:
        store.read_entry(key)
        return None
    head, journal = found  # the rows this head counts: a lost one is corrupt (render_run)
    render_run(head, journal)
    _read_extras(store.backend, key)
    return len(journal)


def _read_extras(backend: Backend, key: str) -> None:
    """Read every timer, message, event and stream value of the run under ``key`` (each
    row's checksum is checked as it is read; a backend that keeps none has none to read)."""
    if type(backend).timers is Backend.timers:
        return
    backend.timers(key)
    backend.messages(key)
    backend.events(key)
    for name, length in backend.streams(key):
        for start in range(0, length, 1000):
            backend.stream_read(key, name, start, 1000)


def problem_text(exc: BaseException) -> str:
    """``exc`` as one line of a report (a damaged file: what SQLite said)."""
    if isinstance(exc, StoreDamagedError) and exc.__cause__ is not None:
        # the full message names the fix; the report says it once, not on every line
        cause = exc.__cause__
        text = f"damaged: {cause} ({getattr(cause, 'sqlite_errorname', type(cause).__name__)})"
    else:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return printable_key(text)  # it may quote text a damaged file holds (invalid UTF-8)
