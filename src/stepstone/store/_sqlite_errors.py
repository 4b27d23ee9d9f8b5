"""What a failing SQLite file means to the user: the store error raised instead of
SQLite's own.

``sqlite3`` reports a damaged page, a full disk or a failed write as a bare
``DatabaseError`` ("database disk image is malformed", "disk I/O error") naming neither
the file nor what to do. Every operation of the SQLite backends goes through
:func:`file_errors`, which raises instead:

* :class:`~stepstone.exceptions.StoreDamagedError` for damaged pages (SQLite's
  ``SQLITE_CORRUPT`` and ``SQLITE_NOTADB``);
* :class:`~stepstone.exceptions.StoreFullError` for a full disk (``SQLITE_FULL``);
* :class:`~stepstone.exceptions.StoreError` for another failed read or write of the file
  (``SQLITE_IOERR``: a failing disk, or the process's file size limit), a file that cannot
  be written (``SQLITE_READONLY``) or opened (``SQLITE_CANTOPEN``).

Each message names the file, what SQLite said, and what to do. Other SQLite errors (a lock
held too long, a bug) pass through as they are.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from stepstone.exceptions import StoreDamagedError, StoreError, StoreFullError

__all__ = ["file_error", "file_errors", "is_busy", "is_foreign"]

F = TypeVar("F", bound=Callable[..., Any])

# SQLite's primary result codes (``sqlite3.Error.sqlite_errorcode`` carries the extended
# code, whose low byte is the primary one).
_BUSY, _READONLY, _IOERR, _CORRUPT, _CANTOPEN, _FULL, _NOTADB = 5, 8, 10, 11, 14, 13, 26


def file_error(path: Path, exc: sqlite3.Error) -> StoreError | None:
    """The store error ``exc`` means for the store file at ``path``, or None when it is no
    failure of the file itself."""
    code = _primary_code(exc)
    name = getattr(exc, "sqlite_errorname", None) or "an error"
    where = repr(str(path))
    if code in (_CORRUPT, _NOTADB):
        return StoreDamagedError(
            f"{where} is damaged: SQLite says {exc} ({name}); the operation stopped and "
            f"wrote nothing. See what is affected with `stepstone check --db {path}`, then "
            f"restore the file from a backup, or copy what is still readable into a new "
            f"file with the sqlite3 shell (`sqlite3 {path} .recover | sqlite3 recovered.sqlite`) "
            "and open that one"
        )
    if code == _FULL:
        return StoreFullError(
            f"could not write to {where}: the disk is full ({exc}); nothing was written. "
            "Free some space and run again with resume=True: a run continues after its last "
            "committed step, and the step that was being committed runs again"
        )
    if code == _IOERR:
        return StoreError(
            f"could not read or write {where}: {exc} ({name}: the disk failed, is full, or "
            "the process reached its file size limit). What was being committed may or may "
            "not be stored: fix the cause and run again with resume=True, which continues "
            "from what the file holds"
        )
    if code in (_READONLY, _CANTOPEN):
        return StoreError(
            f"cannot write to {where}: {exc} ({name}); check that the file, its -wal and "
            "-shm files and its directory are writable by this user, or open the store "
            "with read_only=True to read it"
        )
    return None


def is_foreign(exc: sqlite3.Error) -> bool:
    """Whether SQLite found no database header at all (``SQLITE_NOTADB``: another kind of
    file, or a store whose first page was overwritten)."""
    return _primary_code(exc) == _NOTADB


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite answered ``SQLITE_BUSY`` (or one of its extended codes): another
    connection holds the lock it needed."""
    return _primary_code(exc) == _BUSY


def _primary_code(exc: sqlite3.Error) -> int:
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def file_errors(method: F) -> F:
    """Decorate a method of an object with a ``path`` (the store file): SQLite's errors for
    the file itself become the store errors :func:`file_error` names."""

    @functools.wraps(method)
    def translated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            error = file_error(self.path, exc)
            if error is None:
                raise
            raise error from exc

    return cast(F, translated)
