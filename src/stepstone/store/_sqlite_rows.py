"""Checksummed rows of a SQLite store: what a write stores with each row, and the check of
what a read finds.

SQLite checks the structure of its pages (``PRAGMA integrity_check``) but not the bytes of
a value: a flipped bit inside a stored number or text reads back as another valid value,
and a run would resume from it. From schema version 3 every row of the kv, runs and
journal tables carries ``crc``, a CRC-32 of its columns as written; a read that finds
other bytes refuses the record as corrupt (CheckpointCorruptError naming it) instead of
returning them. What it covers:

* a kv row: its key and value;
* a run head: every column but ``lease_until``, the one a lease renewal updates alone (a
  damaged lease can only make a dead owner look alive for longer: on its own host, its pid
  being gone still shows it dead at once);
* a journal row: its run key, sequence number, kind, name and data.

The checksum is taken over the columns as SQLite returns them, their types included: a
journal or kv row's text columns joined (its sequence number as digits), a head's columns
by their ``repr`` (which tells text, integers, floats and NULL apart), each number written
as the type its column returns. A value whose type changed (a number turned into text or
NULL) never matches. Rows written before version 3 hold NULL there and are read unchecked
(their structure is still checked when decoded), and so are rows changed through SQL by
anything else (:func:`crc_triggers`).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

from stepstone.store._base import (
    HEAD_COLUMNS,
    JournalRow,
    RunHead,
    corrupt_error,
    meta_text,
    printable_key,
)

__all__ = [
    "checked_extra",
    "checked_head_row",
    "checked_journal_row",
    "checked_value",
    "crc_triggers",
    "head_commit_params",
    "head_insert_params",
    "head_insert_sql",
    "head_update_sql",
    "journal_insert_sql",
    "journal_params",
    "kv_params",
    "kv_upsert_sql",
    "event_crc",
    "message_crc",
    "row_crc",
    "stream_crc",
    "timer_crc",
]


def _changed(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in columns)


def crc_triggers(kv: str, runs: str, journal: str) -> str:
    """The triggers that drop a row's checksum when something else than this module
    changed what it covers through SQL: a hand edit in the sqlite3 shell, or an older
    stepstone still running against the store after a newer one upgraded it (its updates
    do not know the column). What SQLite itself wrote is taken as written; the checksum
    is there for bytes changed beneath it. A write from here changes the checksum with
    the content (a new head always has a new version), so it never fires for one.

    Schema version 3 created them with this text, and an open compares the file's with it:
    a change (a column added to a table) is a new migration that drops and creates them."""
    head = tuple(c for c in HEAD_COLUMNS if c != "lease_until")
    return f"""
    CREATE TRIGGER {kv}_crc AFTER UPDATE ON {kv}
    WHEN NEW.crc IS OLD.crc AND ({_changed(("key", "value"))})
    BEGIN UPDATE {kv} SET crc = NULL WHERE rowid = NEW.rowid; END;
    CREATE TRIGGER {runs}_crc AFTER UPDATE ON {runs}
    WHEN NEW.crc IS OLD.crc AND ({_changed(head)})
    BEGIN UPDATE {runs} SET crc = NULL WHERE key = NEW.key; END;
    CREATE TRIGGER {journal}_crc AFTER UPDATE ON {journal}
    WHEN NEW.crc IS OLD.crc AND ({_changed(("run_key", "seq", "kind", "name", "data"))})
    BEGIN UPDATE {journal} SET crc = NULL WHERE rowid = NEW.rowid; END;
"""


#: Position of ``lease_until`` in a head row (left out of the head's checksum).
_LEASE = HEAD_COLUMNS.index("lease_until")


def row_crc(values: tuple[Any, ...]) -> int:
    """The checksum of columns as SQLite returns them: their ``repr`` tells text, integers,
    floats and NULL apart (so does the type of each column as read)."""
    return zlib.crc32(repr(values).encode("utf-8", "surrogatepass"))


def _text_crc(*parts: str) -> int:
    return zlib.crc32("\x00".join(parts).encode("utf-8", "surrogatepass"))


def _journal_crc(key: Any, seq: Any, kind: Any, name: Any, data: Any) -> int | None:
    """The checksum of a journal row's columns; None (matching no stored checksum) when one
    is of a type no journal row is written with."""
    if type(key) is not str or type(seq) is not int or type(kind) is not str:
        return None
    if type(data) is not str or (name is not None and type(name) is not str):
        return None
    return _text_crc(key, str(seq), kind, "" if name is None else "+" + name, data)


def _kv_crc(key: Any, value: Any) -> int | None:
    """The checksum of a kv row's columns; None as for :func:`_journal_crc`."""
    if type(key) is not str or type(value) is not str:
        return None
    return _text_crc(key, value)


def _head_values(head: RunHead) -> tuple[Any, ...]:
    """A head's columns in :data:`HEAD_COLUMNS` order (as ``head_to_row``, which a test
    holds it to), each of the type its column returns
    (an integer column returns ``int``, a real one ``float``: a clock that gave ``5`` is
    stored and checked as ``5.0``)."""
    return (
        head.key,
        head.kind,
        head.status,
        head.next_step,
        head.run_uid,
        int(head.version),
        int(head.iteration),
        int(head.journal_len),
        head.host,
        int(head.pid),
        None if head.pid_start is None else int(head.pid_start),
        float(head.lease_until),
        meta_text(head.meta),
        float(head.created_at),
        float(head.updated_at),
    )


def _head_crc(values: Sequence[Any]) -> int:
    return row_crc((*values[:_LEASE], *values[_LEASE + 1 :]))


@functools.cache
def head_insert_sql(runs: str) -> str:
    """A claim's insert (or replacement) of the head in table ``runs``
    (:func:`head_insert_params`)."""
    marks = ", ".join("?" * (len(HEAD_COLUMNS) + 1))
    return f"INSERT OR REPLACE INTO {runs} ({', '.join(HEAD_COLUMNS)}, crc) VALUES ({marks})"


@functools.cache
def head_update_sql(runs: str) -> str:
    """A step commit's compare-and-swap of the head in table ``runs``: every column is
    written, so the row holds exactly the head its checksum covers
    (:func:`head_commit_params`)."""
    columns = ", ".join(f"{name} = ?" for name in HEAD_COLUMNS[1:])
    return f"UPDATE {runs} SET {columns}, crc = ? WHERE key = ? AND version = ? AND run_uid = ?"


@functools.cache
def journal_insert_sql(journal: str) -> str:
    """The insert of a journal row into table ``journal`` (:func:`journal_params`)."""
    return (
        f"INSERT INTO {journal} (run_key, seq, kind, name, data, crc, started_at, committed_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )


@functools.cache
def kv_upsert_sql(kv: str) -> str:
    """The insert or update of a value in table ``kv`` (:func:`kv_params`)."""
    return (
        f"INSERT INTO {kv} (key, value, updated_at, crc) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
        "updated_at = excluded.updated_at, crc = excluded.crc"
    )


def head_insert_params(head: RunHead) -> tuple[Any, ...]:
    """A head as parameters of ``INSERT ... (HEAD_COLUMNS..., crc)``."""
    values = _head_values(head)
    return (*values, _head_crc(values))


def head_commit_params(head: RunHead, expected_version: int) -> tuple[Any, ...]:
    """A step commit's head update as parameters of :func:`head_update_sql`: the new head's
    columns but its key, its checksum, then the compare-and-swap's key, expected version
    and run_uid."""
    values = _head_values(head)
    return (*values[1:], _head_crc(values), head.key, expected_version, head.run_uid)


def journal_params(key: str, row: JournalRow, committed_at: float | None = None) -> tuple[Any, ...]:
    """A journal row as parameters of ``INSERT ... (run_key, seq, kind, name, data, crc,
    started_at, committed_at)``; ``committed_at``: the commit's time (a step commit's new
    head's ``updated_at``), else the row's own (a claim's rows: as they carry it)."""
    return (
        key,
        row.seq,
        row.kind,
        row.name,
        row.data,
        _journal_crc(key, row.seq, row.kind, row.name, row.data),
        row.started_at,
        row.committed_at if committed_at is None else committed_at,
    )


def kv_params(key: str, text: str, now: float) -> tuple[str, str, float, int | None]:
    """A value as parameters of ``INSERT ... (key, value, updated_at, crc)``."""
    return (key, text, now, _kv_crc(key, text))


def _mismatch(key: Any, what: str) -> Exception:
    return corrupt_error(
        key,
        f"{what} does not match its checksum (its bytes changed after it was written: a "
        "damaged disk, or the file edited outside SQLite)",
    )


def checked_value(key: Any, value: Any, crc: Any) -> Any:
    """``value`` read under ``key``, its stored checksum ``crc`` checked (None: a row written
    before checksums, not checked)."""
    if crc is not None and crc != _kv_crc(key, value):
        raise _mismatch(key, "the value")
    return value


def checked_head_row(row: Sequence[Any]) -> Sequence[Any]:
    """A head row selected as ``HEAD_COLUMNS..., crc``, without its checksum once checked."""
    values, crc = row[:-1], row[-1]
    if crc is not None and crc != _head_crc(values):
        raise _mismatch(values[0] if values else "?", "the run head")
    return values


def checked_journal_row(
    key: str, seq: Any, kind: Any, name: Any, data: Any, crc: Any
) -> tuple[Any, Any, Any, Any]:
    """A journal row's columns, its stored checksum ``crc`` checked."""
    if crc is not None and crc != _journal_crc(key, seq, kind, name, data):
        raise _mismatch(key, f"journal row {printable_key(seq)}")
    return seq, kind, name, data


# -- timers, messages, events, streams (schema version 4) ----------------------------------
# Each row carries a CRC-32 of what it was written with (row_crc: the columns' repr, types
# included). A message's covers what its send fixed (not its id, given by SQLite, nor
# consumed_at, which its receipt sets); a timer's, an event's and a stream value's cover
# every column.


def message_crc(run_key: Any, topic: Any, data: Any, sent_at: Any) -> int:
    """The checksum of a message's columns (its id and consumption left out)."""
    return row_crc((run_key, topic, data, sent_at))


def event_crc(run_key: Any, name: Any, data: Any, updated_at: Any) -> int:
    return row_crc((run_key, name, data, updated_at))


def stream_crc(
    run_key: Any, name: Any, offset: Any, data: Any, attempt: Any, written_at: Any
) -> int:
    return row_crc((run_key, name, offset, data, attempt, written_at))


def timer_crc(run_key: Any, name: Any, wake_at: Any, topic: Any, since: Any) -> int:
    return row_crc((run_key, name, wake_at, topic, since))


def checked_extra(key: Any, what: str, crc: Any, expected: int) -> None:
    """Raise CheckpointCorruptError naming ``what`` of the run under ``key`` when a stored
    checksum ``crc`` is not ``expected``."""
    if crc is not None and crc != expected:
        raise _mismatch(key, what)
