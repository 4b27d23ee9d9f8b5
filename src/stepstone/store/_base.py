"""The backend contract: a handful of blocking primitives every backend implements.

Everything else (JSON encoding, async twins, checkpoint views, the durable kernel) is built
on top of these in shared code. Concurrency control lives in the database: each primitive
is one transaction, and the two conditional ones (``kv_cas``, ``run_commit``) decide inside
it. A new backend passes ``stepstone.testing.store_conformance``.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from stepstone.core._serialization import compact_encoder
from stepstone.exceptions import CheckpointCorruptError, StoreError
from stepstone.store._changes import ChangeFeed, run_topic
from stepstone.store._extras import EventValue, ExtraWrites, Message, StreamEntry, Timer
from stepstone.store._webhooks import WebhookRecord

__all__ = [
    "HEAD_COLUMNS",
    "RUN_STATUSES",
    "Backend",
    "Claim",
    "JournalRow",
    "RunHead",
    "checked_text",
    "commit_each",
    "corrupt_error",
    "head_from_row",
    "head_to_row",
    "head_update_params",
    "heads_for_listing",
    "journal_problem",
    "journal_row",
    "lenient_text",
    "meta_text",
    "prefix_bounds",
    "printable_key",
    "read_consistent",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunHead:
    """The small, updated-in-place record of one durable run (a Plan, graph or agent run).

    Attributes:
        key: The checkpoint key.
        kind: Which engine wrote it (``"plan"``, ``"graph"``, ``"agent"``).
        status: ``claimed | running | paused | failed | done``.
        next_step: What the run does next (engine-defined), None when done.
        run_uid: Hex stamp of the owning run; changes on every claim or takeover.
        version: Bumped by every commit; commits compare-and-swap on it.
        iteration: The engine's persisted iteration counter.
        journal_len: Number of journal rows; the next row's ``seq``.
        host: Owner's host id (hostname/boot id).
        pid: Owner's process id on that host.
        pid_start: Owner process start time (ticks), to detect recycled pids.
        lease_until: Unix time until which the owner's claim holds without renewal.
        meta: Small engine-defined JSON dict (fingerprint, error, schema version...).
        created_at: Unix time of the first claim.
        updated_at: Unix time of the last change.
    """

    key: str
    kind: str
    status: str
    next_step: str | None
    run_uid: str
    version: int
    iteration: int
    journal_len: int
    host: str
    pid: int
    pid_start: int | None
    lease_until: float
    meta: dict[str, Any]
    created_at: float
    updated_at: float

    def replace(self, **changes: Any) -> RunHead:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


#: Column order of a run head in the SQL backends (the order of RunHead's fields).
HEAD_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunHead))

#: A head's meta as the SQL backends store it: ``json.dumps(meta, separators=(",", ":"))``
#: with one encoder built once (``json.dumps`` builds one per call, per commit).
meta_text = compact_encoder(ensure_ascii=True, allow_nan=True)

_INT_COLUMNS = frozenset({"version", "iteration", "journal_len", "pid"})
_FLOAT_COLUMNS = frozenset({"lease_until", "created_at", "updated_at"})


def head_to_row(head: RunHead) -> tuple[Any, ...]:
    """A head as SQL parameters in :data:`HEAD_COLUMNS` order (meta as JSON text)."""
    return tuple(
        meta_text(head.meta) if name == "meta" else getattr(head, name) for name in HEAD_COLUMNS
    )


def head_update_params(head: RunHead, expected_version: int) -> tuple[Any, ...]:
    """A step commit's head update as SQL parameters: the new status, next_step, version,
    iteration, journal_len, lease_until, meta (JSON text) and updated_at, then the
    compare-and-swap's key, expected version and run_uid."""
    return (
        head.status,
        head.next_step,
        head.version,
        head.iteration,
        head.journal_len,
        head.lease_until,
        meta_text(head.meta),
        head.updated_at,
        head.key,
        expected_version,
        head.run_uid,
    )


def lenient_text(raw: bytes) -> str:
    """Decode a text column without failing: invalid UTF-8 bytes become lone surrogates,
    which :func:`checked_text` then reports as corruption naming the record (a SQLite
    ``text_factory``; the default one raises a bare ``OperationalError`` naming nothing)."""
    return raw.decode("utf-8", "surrogateescape")


def printable_key(key: Any) -> str:
    """``key`` as it can be printed, with invalid UTF-8 bytes shown as ``\\xNN``."""
    text = str(key)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape")
        return raw.decode("utf-8", "backslashreplace")
    return text


def corrupt_error(key: Any, what: str) -> CheckpointCorruptError:
    """The error for a record that cannot be decoded: names the key, the fault, the fix."""
    shown = printable_key(key)
    error = CheckpointCorruptError(
        f"record {shown!r} is corrupt: {what}. Nothing was changed; remove it with "
        f"store.delete({shown!r}) to start over under that key (other records are not "
        "affected)"
    )
    error.fault = what  # the fault alone, for a listing of the record's damaged rows
    return error


def checked_text(value: Any, key: Any, what: str) -> str:
    """``value`` as ``str``; raises CheckpointCorruptError when it is not valid UTF-8 text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise corrupt_error(
                key, f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise corrupt_error(key, f"{what} is not valid UTF-8 (at character {exc.start})") from None
    return text


#: Every status a run's head can hold: claimed and running (live while its lease lasts),
#: paused, failed and done.
RUN_STATUSES = ("claimed", "running", "paused", "failed", "done")


def head_from_row(row: Sequence[Any]) -> RunHead:
    """Undo :func:`head_to_row` for a row selected in :data:`HEAD_COLUMNS` order.

    Raises:
        CheckpointCorruptError: a column cannot be decoded (bad JSON, invalid UTF-8, a
            number that is not one, a status no run has); the message names the key and
            the column.
    """
    if len(row) != len(HEAD_COLUMNS):
        raise corrupt_error(row[0] if row else "?", f"head has {len(row)} columns")
    values: dict[str, Any] = dict(zip(HEAD_COLUMNS, row, strict=True))
    key = values["key"]
    values["key"] = checked_text(key, key, "the key")
    for name in ("kind", "status", "run_uid", "host"):
        values[name] = checked_text(values[name], key, f"column {name}")
    if values["status"] not in RUN_STATUSES:
        raise corrupt_error(
            key, f"head column status is {values['status']!r}, not one of {', '.join(RUN_STATUSES)}"
        )
    if values["next_step"] is not None:
        values["next_step"] = checked_text(values["next_step"], key, "column next_step")
    _decode_head_numbers(values, key)
    values["meta"] = _decode_head_meta(values["meta"], key)
    return RunHead(**values)


def _decode_head_numbers(values: dict[str, Any], key: Any) -> None:
    """Turn a head's number columns in ``values`` into ``int`` / ``float`` in place."""
    try:
        for name in _INT_COLUMNS:
            values[name] = int(values[name])
        for name in _FLOAT_COLUMNS:
            values[name] = float(values[name])
        if values["pid_start"] is not None:
            values["pid_start"] = int(values["pid_start"])
    except (TypeError, ValueError) as exc:
        raise corrupt_error(key, f"head has a non-numeric number column ({exc})") from None


def _decode_head_meta(value: Any, key: Any) -> dict[str, Any]:
    """A head's ``meta`` column decoded: a JSON object."""
    text = checked_text(value, key, "column meta")
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise corrupt_error(key, f"head column meta is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise corrupt_error(key, f"head column meta is a JSON {type(meta).__name__}, not an object")
    return meta


def heads_for_listing(
    rows: Sequence[Sequence[Any]], decode: Callable[[Sequence[Any]], RunHead] | None = None
) -> list[RunHead]:
    """Decode heads for a listing (each with ``decode``, :func:`head_from_row` by default):
    one corrupt head never hides the others.

    A head that cannot be decoded is listed as status ``"corrupt"`` with the reason in
    ``meta["corrupt"]`` (reading or resuming it raises CheckpointCorruptError).
    """
    out: list[RunHead] = []
    for row in rows:
        try:
            out.append((decode or head_from_row)(row))
        except CheckpointCorruptError as exc:
            key = printable_key(row[0]) if row else "?"
            kind = row[1] if len(row) > 1 and isinstance(row[1], str) else "?"
            stamps = [_number(row, HEAD_COLUMNS.index(c)) for c in ("created_at", "updated_at")]
            out.append(
                RunHead(
                    key=key,
                    kind=printable_key(kind),
                    status="corrupt",
                    next_step=None,
                    run_uid="",
                    version=0,
                    iteration=0,
                    journal_len=0,
                    host="",
                    pid=0,
                    pid_start=None,
                    lease_until=0.0,
                    meta={"corrupt": str(exc)},
                    created_at=stamps[0],
                    updated_at=stamps[1],
                )
            )
    return out


def _number(row: Sequence[Any], index: int) -> float:
    try:
        return float(row[index])
    except (IndexError, TypeError, ValueError):
        return 0.0


def journal_row(
    key: str,
    seq: Any,
    kind: Any,
    name: Any,
    data: Any,
    started_at: Any = None,
    committed_at: Any = None,
) -> JournalRow:
    """A journal row read from a database, its columns checked (invalid UTF-8, or a
    sequence number that is not an integer, raises CheckpointCorruptError naming the key
    and the row). A time that is not a number reads as None: times only inform."""
    if (
        type(seq) is int
        and type(kind) is str
        and type(data) is str
        and (name is None or type(name) is str)
        and (kind.isascii() or _utf8(kind))
        and (data.isascii() or _utf8(data))
        and (name is None or name.isascii() or _utf8(name))
    ):  # the usual row, checked without building the names an error would need
        return JournalRow(seq, kind, name, data, _time(started_at), _time(committed_at))
    where = f"journal row {printable_key(seq)}"
    if type(seq) is not int:
        raise corrupt_error(key, f"{where} has a sequence number that is not an integer")
    return JournalRow(
        seq,
        checked_text(kind, key, f"{where} kind"),
        None if name is None else checked_text(name, key, f"{where} name"),
        checked_text(data, key, f"{where} data"),
        _time(started_at),
        _time(committed_at),
    )


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _time(value: Any) -> float | None:
    """A stored time as a float, or None (none stored, or not a number)."""
    if type(value) is float:
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class JournalRow:
    """One append-only journal entry of a run (a step result, an effect, a marker).

    ``data`` is JSON text; ``kind`` and ``name`` are engine-defined and indexed.
    ``started_at`` and ``committed_at`` are when the work the row records started and
    when the commit that wrote it was made (Unix times on the database's clock, as the
    kernel reads it: :meth:`Backend.clock`); every row of one commit has the same ones.
    Rows written before journal rows had times have None.
    """

    seq: int
    kind: str
    name: str | None
    data: str
    started_at: float | None = None
    committed_at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """What a claim decision writes, atomically, in :meth:`Backend.run_transact`.

    Attributes:
        head: The new head (inserted or replacing the old one).
        reset_journal: Drop the run's existing journal rows first (a fresh start).
        rows: Journal rows to append (for example, an imported legacy checkpoint), stored
            with the times they carry (a run's start row: the claim's).
        drop_kv: Delete the plain KV value under the same key (a legacy checkpoint that
            was stored as a value and is now imported as a run).
    """

    head: RunHead
    reset_journal: bool = False
    rows: Sequence[JournalRow] = ()
    drop_kv: bool = False


Decide = Callable[[RunHead | None, str | None], Claim | None]


class Backend(abc.ABC):
    """Blocking storage primitives. Values are JSON text; the facade encodes and decodes."""

    #: True when primitives may block on I/O (the async twins then run them in a thread).
    blocking: bool = True

    #: True when the kernel may run ``run_commit`` on the event loop thread. Right for a
    #: local file: a SQLite commit (~0.2 ms with fsync) costs less than the thread round
    #: trip (~40 us) plus the wait, and commits to one file serialize anyway. Network
    #: backends keep it False so a slow server never stalls the loop.
    commit_inline: bool = False

    #: True when :meth:`arun_commit` and :meth:`arun_claim` commit from async code without
    #: a thread hop (on the event loop); the kernel then calls them for the claims and step
    #: commits of runs on a loop.
    async_commit: bool = False

    _polling_feed: ChangeFeed | None = None

    # -- key/value ---------------------------------------------------------------------
    @abc.abstractmethod
    def kv_get(self, key: str) -> str | None:
        """The JSON text under ``key``, or None."""

    @abc.abstractmethod
    def kv_put(self, key: str, text: str) -> None:
        """Insert or replace ``key``. Raises StoreKeyConflictError if ``key`` is a run."""

    @abc.abstractmethod
    def kv_delete(self, key: str) -> bool:
        """Delete the value or run (head and journal) under ``key``; True if one existed."""

    @abc.abstractmethod
    def kv_keys(self, prefix: str | None) -> list[str]:
        """Sorted keys of values and runs, optionally only those starting with ``prefix``."""

    @abc.abstractmethod
    def kv_items(self, prefix: str | None) -> list[tuple[str, str]]:
        """Sorted ``(key, text)`` pairs of plain values (runs are not included)."""

    @abc.abstractmethod
    def kv_cas(
        self, key: str, expected: Any, new_text: str, equal: Callable[[str, Any], bool]
    ) -> bool:
        """Atomically replace ``key`` with ``new_text`` if its current value matches.

        ``expected is None`` means "only if absent". Otherwise ``equal(current_text,
        expected)`` decides. Raises StoreKeyConflictError if ``key`` is a run.
        """

    # -- runs --------------------------------------------------------------------------
    @abc.abstractmethod
    def run_get(self, key: str) -> RunHead | None:
        """The head of the run under ``key``, or None."""

    @abc.abstractmethod
    def run_transact(self, key: str, decide: Decide) -> RunHead | None:
        """Read the head and KV text under ``key``, call ``decide``, apply its Claim.

        All in one transaction that excludes other writers of ``key``; if ``decide``
        raises, nothing is written and the exception propagates. Returns the written head
        (or the current head when ``decide`` returned None).
        """

    def run_claim(self, key: str, decide: Decide) -> RunHead | None:
        """:meth:`run_transact` for a run's claim. A backend may skip flushing it to disk
        on its own when the run's next commit (or release) flushes it with its own data:
        other writers must see it at once all the same. ``decide`` depends only on its
        arguments, so a backend may also call it ahead (with what an empty key holds) to
        claim an empty key in fewer round trips."""
        return self.run_transact(key, decide)

    async def arun_claim(self, key: str, decide: Decide) -> RunHead | None:
        """:meth:`run_claim` awaited on the event loop (only when ``async_commit``)."""
        raise NotImplementedError(f"{type(self).__name__} has no async claim")

    @abc.abstractmethod
    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        """One step's atomic commit.

        If the stored head of ``head.key`` has ``expected_version`` and ``head.run_uid``,
        replace it with ``head``, append ``rows`` and upsert ``writes`` (key, JSON text) into
        the KV space, all in one transaction, and return True. Otherwise write nothing and
        return False. A row keeps its ``started_at``; its ``committed_at`` is the commit's
        time, the new head's ``updated_at``, whatever the row says (so a database fills it
        from the head in the same statement).
        """

    async def arun_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        """:meth:`run_commit` awaited on the event loop (only when ``async_commit``)."""
        raise NotImplementedError(f"{type(self).__name__} has no async commit")

    @abc.abstractmethod
    def run_renew(self, key: str, run_uid: str, lease_until: float) -> bool:
        """Extend the lease if ``run_uid`` still owns ``key``; False if it does not."""

    @abc.abstractmethod
    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        """Journal rows of ``key`` with ``seq >= since_seq``, in order."""

    def run_journal_row(self, key: str, seq: int) -> JournalRow | None:
        """The journal row ``seq`` of ``key`` alone (None when there is none), read so that
        a damaged row elsewhere in the journal does not stop it: what
        :func:`read_salvaged` reads row by row. Backends whose rows can be damaged
        override it with a one-row query; this one reads from ``seq`` on."""
        for row in self.run_journal(key, seq):
            return row if row.seq == seq else None
        return None

    @abc.abstractmethod
    def run_list(self, prefix: str | None) -> list[RunHead]:
        """Heads of runs whose key starts with ``prefix`` (all when None), sorted by key."""

    # -- timers, messages, events, streams (store/_extras.py) ---------------------------
    # Not abstract: a backend written before them works as it did, and refuses these with
    # one clear error (_no_extras).

    def run_commit_extras(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
        extras: ExtraWrites,
    ) -> bool:
        """:meth:`run_commit` with ``extras`` written in the same transaction: messages of
        the run consumed, events set, stream values appended, timers set and cleared.

        Returns False, writing nothing, when the head did not match (as ``run_commit``).

        Raises:
            CorruptRecordError: a message to consume is not the run's, or not pending
                (nothing was written).
        """
        raise self._no_extras()

    def message_send(
        self, run_key: str, topic: str, data: str, *, refuse: Collection[str]
    ) -> int | None:
        """Store a message for the run under ``run_key`` (which may not exist yet) and
        return its id; None, storing nothing, when the run's status is in ``refuse``.
        In the same transaction, a queue entry of that run that is parked waiting for a
        message on ``topic`` (a timer of the run with that topic) becomes runnable now."""
        raise self._no_extras()

    def message_next(self, run_key: str, topic: str) -> Message | None:
        """The oldest pending message of ``run_key`` on ``topic``, or None."""
        raise self._no_extras()

    def messages(self, run_key: str) -> list[Message]:
        """Every message of ``run_key`` (pending and consumed), in send order."""
        raise self._no_extras()

    def event_set(self, run_key: str, name: str, data: str) -> None:
        """Set the event ``name`` of ``run_key`` (last write wins)."""
        raise self._no_extras()

    def event_get(self, run_key: str, name: str) -> EventValue | None:
        """The event ``name`` of ``run_key``, or None when it was never set."""
        raise self._no_extras()

    def events(self, run_key: str) -> list[EventValue]:
        """Every event of ``run_key``, sorted by name."""
        raise self._no_extras()

    def stream_append(self, run_key: str, name: str, data: str, attempt: int | None) -> int:
        """Append ``data`` to the stream ``name`` of ``run_key``; returns its offset."""
        raise self._no_extras()

    def stream_read(self, run_key: str, name: str, start: int, limit: int) -> list[StreamEntry]:
        """Up to ``limit`` values of the stream from offset ``start`` on, in order."""
        raise self._no_extras()

    def streams(self, run_key: str) -> list[tuple[str, int]]:
        """The streams of ``run_key`` with their lengths, sorted by name."""
        raise self._no_extras()

    def timers(self, run_key: str | None) -> list[Timer]:
        """The timers of ``run_key`` (None: of every run), by run key and name."""
        raise self._no_extras()

    # -- the webhook outbox (store/_webhooks.py) -------------------------------------------
    def webhook_add(self, record: WebhookRecord) -> bool:
        """Store ``record`` unless a delivery with its id exists; whether it was stored."""
        raise self._no_webhooks()

    def webhook_get(self, id: str) -> WebhookRecord | None:
        """The delivery ``id``, or None."""
        raise self._no_webhooks()

    def webhook_list(
        self, run_key: str | None, statuses: Collection[str] | None = None
    ) -> list[WebhookRecord]:
        """Deliveries of ``run_key`` (None: every run) whose status is in ``statuses``
        (None: any), by creation time and id."""
        raise self._no_webhooks()

    def webhook_update(self, record: WebhookRecord, expected_version: int) -> bool:
        """Replace the stored delivery ``record.id`` with ``record`` if its version is
        still ``expected_version`` (one transaction); whether it was replaced."""
        raise self._no_webhooks()

    def _no_webhooks(self) -> StoreError:
        return StoreError(
            f"store {self.describe()} ({type(self).__name__}) keeps no webhook outbox; use "
            "Store(), Store(db=...) or Store(url='postgresql://...')"
        )

    def changes(self) -> ChangeFeed:
        """The feed that wakes this process's waiters on this store's changes
        (``store/_changes.py``); this one only polls."""
        if self._polling_feed is None:
            self._polling_feed = ChangeFeed(poll=0.1)
        return self._polling_feed

    def notify_run(self, key: str) -> None:
        """Wake whoever waits on the records of the run under ``key`` (a sleep, a receive,
        a stream reader, a ``get_event``): they look again now rather than at their next
        poll (an operator's cancel of a waiting run). This one wakes the waiters of this
        process; a store with notifications between processes wakes those too."""
        self.changes().publish(run_topic(key))

    def _no_extras(self) -> StoreError:
        return StoreError(
            f"store {self.describe()} ({type(self).__name__}) keeps no timers, messages, "
            "events or streams; use Store(), Store(db=...) or Store(url='postgresql://...')"
        )

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called: every read and write then refuses."""
        return bool(getattr(self, "_closed", False))

    def clock(self) -> float:
        """Unix time as the database sees it; run leases are set and judged by it, so hosts
        whose wall clocks disagree still agree on whether a lease ran out. Local backends
        use this machine's clock."""
        return time.time()

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Create or upgrade the schema (idempotent). Backends also do it on first use."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Idempotent."""

    def journal_faults(self, keys: Sequence[str]) -> dict[str, str]:
        """For each run of ``keys`` with a journal row that does not read (a byte changed
        beneath the store, found by the row's checksum), what is wrong with its first such
        row, by run key: for an operator's listing, which reads every row of the runs it
        lists. Backends whose rows carry no checksum return ``{}``."""
        return {}

    def headless_journal_keys(self) -> list[str]:
        """Keys that hold journal rows but no run head (a head lost to damage; a store
        never leaves them: a run and its rows are deleted together). For ``stepstone
        check``; a full scan of the journal."""
        return []

    def integrity(self, *, quick: bool = False) -> list[str] | None:
        """What is wrong with the storage's own pages (an empty list when nothing is), or
        None when the backend has none to check (memory; PostgreSQL checksums its own).
        ``quick`` trades completeness for speed where the backend can."""
        return None

    def checksums(self) -> str | None:
        """What finds a byte changed inside a stored value, for ``stepstone check``: one
        line, or None when nothing does (memory: no bytes on a disk). A full scan on
        SQLite."""
        return None

    def describe(self) -> str:
        """Short human description (``"sqlite:/path/db.sqlite"``)."""
        return type(self).__name__


#: How many times :func:`read_consistent` reads again when the run was claimed between
#: its reads.
_READ_ATTEMPTS = 20


def read_consistent(backend: Backend, key: str) -> tuple[RunHead, list[JournalRow]] | None:
    """The run under ``key``: its head and the journal rows that head describes, or None
    when there is no run.

    The pair is consistent: the head is read again after the journal, and when the owner
    committed in between, only the rows the first head counts (``seq < journal_len``; a
    commit only appends rows past them) are returned with it. When the run was claimed in
    between (a claim may reset the journal), everything is read again. The rows are
    returned as read: :func:`journal_problem` says whether they are the ones the head
    counts.

    Raises:
        StoreError: the run was claimed again on every one of many attempts.
    """
    for _ in range(_READ_ATTEMPTS):
        head = backend.run_get(key)
        if head is None:
            return None
        rows = backend.run_journal(key)
        after = backend.run_get(key)
        if after is None or after.run_uid != head.run_uid:
            continue  # deleted or claimed meanwhile: read the new run
        if after.version != head.version:
            rows = [row for row in rows if row.seq < head.journal_len]
        return head, rows
    raise _claimed_again(key)


@dataclasses.dataclass(frozen=True, slots=True)
class Salvaged:
    """A run read as far as it reads (:func:`read_salvaged`).

    Attributes:
        head: Its head.
        rows: The journal rows that read, in order (the head counts ``journal_len``).
        damaged: For each row that does not read (a changed byte, a value that is not
            text), by its sequence number: what is wrong with it.
    """

    head: RunHead
    rows: list[JournalRow]
    damaged: dict[int, str]


def read_salvaged(backend: Backend, key: str) -> Salvaged | None:
    """The run under ``key`` with every journal row that still reads, and what is wrong
    with each one that does not; None when there is no run. For operators looking at a
    damaged run (what is left, which steps a rewind can keep), never for resuming one.

    A run whose rows all read is read as :func:`read_consistent` reads it. Otherwise its
    rows are read one by one (``Backend.run_journal_row``), up to the ``journal_len`` of
    the head read before them: rows a commit appends meanwhile lie past it.

    Raises:
        CheckpointCorruptError: the head itself does not read (nothing is left to show).
        StoreError: the run was claimed again on every one of many attempts.
    """
    try:
        found = read_consistent(backend, key)
    except CheckpointCorruptError:
        pass  # a row (or the head: read again below) does not read
    else:
        return None if found is None else Salvaged(found[0], found[1], {})
    for _ in range(_READ_ATTEMPTS):
        head = backend.run_get(key)
        if head is None:
            return None
        rows: list[JournalRow] = []
        damaged: dict[int, str] = {}
        for seq in range(head.journal_len):
            try:
                row = backend.run_journal_row(key, seq)
            except CheckpointCorruptError as exc:
                damaged[seq] = exc.fault or str(exc)
                continue
            if row is not None:
                rows.append(row)
        after = backend.run_get(key)
        if after is not None and after.run_uid == head.run_uid:
            return Salvaged(head, rows, damaged)
    raise _claimed_again(key)


def _claimed_again(key: str) -> StoreError:
    return StoreError(
        f"run {key!r} was claimed again while being read, {_READ_ATTEMPTS} times in a row; "
        "nothing was changed. Read it again once the processes claiming it have settled"
    )


def journal_problem(head: RunHead, rows: Sequence[JournalRow]) -> str | None:
    """What is wrong with ``rows`` as the journal ``head`` describes, or None when they
    are its rows ``0 .. journal_len - 1``, each once (``rows`` read consistently with
    ``head``: :func:`read_consistent`). A lost row, or a count a flipped byte changed,
    would otherwise drop a step from a resumed run, or make its next commit collide
    with a row already there after the step had run."""
    count = head.journal_len
    if len(rows) == count and all(row.seq == i for i, row in enumerate(rows)):
        return None
    seqs = {row.seq for row in rows}
    missing = list(itertools.islice((i for i in range(max(count, 0)) if i not in seqs), 10))
    extra = sorted(s for s in seqs if not 0 <= s < count)[:10]
    parts = [f"its head counts {count} journal row{'' if count == 1 else 's'}"]
    if missing:
        parts.append(f"rows {missing} are missing")
    if extra:
        parts.append(f"it has rows {extra} past them")
    if not missing and not extra:
        parts.append("some are there twice")
    return ", but ".join(parts[:2]) + (f", and {parts[2]}" if len(parts) > 2 else "")


def commit_each(
    backend: Backend,
    items: Sequence[tuple[RunHead, int, Sequence[JournalRow], Sequence[tuple[str, str]]]],
) -> list[bool | Exception]:
    """``backend.run_commit`` of each item on its own (a batch that could not be written as
    one transaction): per item, its result or the exception it raised."""
    out: list[bool | Exception] = []
    for item in items:
        try:
            out.append(backend.run_commit(*item))
        except Exception as exc:  # noqa: BLE001 - handed to the run that sent it
            out.append(exc)
    return out


def prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """``lo <= key < hi`` selects exactly the keys starting with ``prefix`` (C collation).

    ``hi`` is the prefix with its last code point incremented (dropping trailing
    U+10FFFF first); None when every key at or above ``prefix`` matches. No LIKE: ``_``
    and ``%`` in keys are plain characters, and the match is case-sensitive.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code <= 0x10FFFF:
            if 0xD800 <= code <= 0xDFFF:  # surrogates are not valid in UTF-8 text
                code = 0xE000
            chars[-1] = chr(code)
            return prefix, "".join(chars)
        chars.pop()
    return prefix, None
