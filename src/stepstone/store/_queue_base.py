"""The work queue's record and the primitives a queue backend implements.

A queue entry is one submitted run: which engine to run (an import path), on what task,
under which checkpoint key, in which queue, with what priority. Workers take entries with
:meth:`QueueBackend.claim`, which hands each entry to exactly one worker at a time and gives
it a lease the worker renews; an entry whose lease ran out is claimable again (its worker
died), until it has used up its attempts and is marked failed (a poison run).

Backends: :mod:`stepstone.store._queue_postgres` (any number of hosts; leases judged by the
database server's clock) and :mod:`stepstone.store._queue_sqlite` (processes of one machine
sharing one file).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

from stepstone.core._threads import to_thread
from stepstone.exceptions import CorruptRecordError, UserError
from stepstone.store._base import printable_key

__all__ = [
    "CANCELLED_RUNNING",
    "ENTRY_COLUMNS",
    "NEVER",
    "SCHEDULE_COLUMNS",
    "FINAL_STATUSES",
    "QueueBackend",
    "QueueEntry",
    "ScheduleRow",
    "TickEntry",
    "entry_from_row",
    "free_slots",
    "key_in_use",
    "rate_window",
    "readable",
    "schedule_from_row",
]

#: Statuses after which an entry never changes again.
FINAL_STATUSES = ("done", "failed", "cancelled")
#: The error of an entry cancelled after it started (by its worker, or by the claim that
#: finds its worker gone).
CANCELLED_RUNNING = "cancelled while running"
#: The ``not_before`` of an entry parked with no time limit (waiting for a message only):
#: the last second of the year 9999, a time that stays a plain number everywhere.
NEVER = 253402300799.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueEntry:
    """One submitted run, as stored.

    Attributes:
        id: The entry's id (what a :class:`~stepstone.RunHandle` refers to).
        queue: The queue's name.
        target: Import path of the engine (``"package.module:attribute"``).
        task: The start envelope, as JSON text.
        run_key: The checkpoint key the run commits its steps under.
        priority: Higher runs first; equal priorities run in submission order.
        not_before: Unix time (database clock) before which no worker takes it.
        dedupe_key: A second submit with the same dedupe key returns this entry.
        status: ``queued | running | done | failed | cancelled``.
        attempts: How many times a worker took it.
        max_attempts: After this many takes by workers that died, it is marked failed.
        worker: The id of the worker running it (None when queued).
        host: That worker's host id.
        pid: That worker's process id.
        pid_start: That process's start time (to detect recycled pids).
        lease_until: Until when (database clock) the worker's claim holds without renewal.
        started_at: When (database clock) a worker last took it; None before any did.
        cancel_requested: ``cancel()`` was called while it ran; the worker stops it.
        result: The final envelope as JSON text (done and failed runs).
        error: Why it failed or was cancelled.
        created_at: Submission time.
        updated_at: Last change.
    """

    id: str
    queue: str
    target: str
    task: str
    run_key: str
    priority: int
    not_before: float
    dedupe_key: str | None
    status: str
    attempts: int
    max_attempts: int
    worker: str | None
    host: str | None
    pid: int | None
    pid_start: int | None
    lease_until: float | None
    started_at: float | None
    cancel_requested: bool
    result: str | None
    error: str | None
    created_at: float
    updated_at: float


#: Column order of an entry in the SQL backends (the order of QueueEntry's fields).
ENTRY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueueEntry))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """One schedule, as stored: a run of ``target`` queued at every tick of ``cron``.

    Attributes:
        name: The schedule's name (unique in the store).
        target: Import path of what each tick runs.
        cron: The cron expression (5 fields, or 6 with a leading seconds field).
        timezone: The IANA time zone the expression is read in.
        queue: The queue each tick's run goes to.
        task: The start envelope of each tick's run, as JSON text.
        priority: Each run's priority.
        max_attempts: Each run's ``max_attempts``.
        catch_up: What ticks missed while no worker ran become: ``one`` run, ``all``, ``none``.
        grace: Seconds after its time within which a tick still counts as on time.
        paused: Paused schedules queue nothing.
        next_tick: The first tick not handled yet (unix time).
        last_tick: The last tick that queued a run (None: none yet).
        created_at: When it was first stored.
        updated_at: Its last change.
    """

    name: str
    target: str
    cron: str
    timezone: str
    queue: str
    task: str
    priority: int
    max_attempts: int
    catch_up: str
    grace: float
    paused: bool
    next_tick: float
    last_tick: float | None
    created_at: float
    updated_at: float


#: Column order of a schedule in the SQL backends (the order of ScheduleRow's fields).
SCHEDULE_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ScheduleRow))


def schedule_from_row(row: Sequence[Any]) -> ScheduleRow:
    """A ScheduleRow from a row selected in :data:`SCHEDULE_COLUMNS` order."""
    v: dict[str, Any] = dict(zip(SCHEDULE_COLUMNS, row, strict=True))
    for name in ("priority", "max_attempts"):
        v[name] = int(v[name])
    for name in ("grace", "next_tick", "created_at", "updated_at"):
        v[name] = float(v[name])
    v["last_tick"] = None if v["last_tick"] is None else float(v["last_tick"])
    flag = v["paused"]
    v["paused"] = flag == "t" if isinstance(flag, str) else bool(flag)
    return ScheduleRow(**v)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TickEntry:
    """A queue entry one tick of a schedule submits (its schedule gives the rest)."""

    id: str
    tick: float
    task: str
    run_key: str
    dedupe_key: str


def entry_from_row(row: Sequence[Any]) -> QueueEntry:
    """A QueueEntry from a row selected in :data:`ENTRY_COLUMNS` order.

    Raises:
        CorruptRecordError: a column holds what no entry does (a number that is not one,
            text that is not UTF-8), naming the entry; the queue marks it failed.
    """
    v: dict[str, Any] = dict(zip(ENTRY_COLUMNS, row, strict=True))
    try:
        for name in ("priority", "attempts", "max_attempts"):
            v[name] = int(v[name])
        for name in ("pid", "pid_start"):
            v[name] = None if v[name] is None else int(v[name])
        for name in ("not_before", "created_at", "updated_at"):
            v[name] = float(v[name])
        for name in ("lease_until", "started_at"):
            v[name] = None if v[name] is None else float(v[name])
        for value in v.values():
            if isinstance(value, str):
                value.encode("utf-8")  # a lone surrogate: bytes that were not UTF-8
    except (TypeError, ValueError) as exc:
        raise CorruptRecordError(
            f"queue entry {printable_key(v['id'])!r} is corrupt ({exc}); it cannot run"
        ) from None
    flag = v["cancel_requested"]  # a bool, 0/1 (SQLite) or PostgreSQL's text "t"/"f"
    v["cancel_requested"] = flag == "t" if isinstance(flag, str) else bool(flag)
    return QueueEntry(**v)


def readable(
    rows: Sequence[Sequence[Any]], decode: Callable[[Sequence[Any]], QueueEntry]
) -> list[QueueEntry]:
    """The entries of ``rows`` that ``decode`` can read, the corrupt ones left out: for a
    look that must not stop at one (ending the leases of dead workers); the claim that next
    takes a corrupt entry marks it failed."""
    out: list[QueueEntry] = []
    for row in rows:
        try:
            out.append(decode(row))
        except CorruptRecordError:
            continue
    return out


def rate_window(rate: float | None) -> float:
    """The window, in seconds, over which a queue's ``rate`` (starts per second) is
    counted: at most ``ceil(rate)`` starts in any window of ``ceil(rate) / rate`` seconds.
    A whole rate counts starts per second; a rate of 0.25 allows one start in any 4
    seconds, 2.5 three in any 1.2 seconds: ``rate`` per second on average, whatever it
    is. None (no rate limit): 0."""
    return 0.0 if rate is None else math.ceil(rate) / rate


def free_slots(
    limit: int, concurrency: int | None, running: int, rate: float | None, started: int
) -> int:
    """How many entries a claim of up to ``limit`` may take under a queue's limits:
    ``running`` of at most ``concurrency`` entries run now, and ``started`` entries
    started within the last :func:`rate_window` of at most ``rate`` per second (None: no
    such limit)."""
    free = limit
    if concurrency is not None:
        free = min(free, int(concurrency) - running)
    if rate is not None:
        free = min(free, math.ceil(rate) - started)
    return free


def key_in_use(run_key: str, entry_id: str) -> UserError:
    """The error of a submit under ``run_key`` while entry ``entry_id``, under that key
    too, is still queued or running."""
    return UserError(
        f"key {printable_key(run_key)!r} belongs to queued run {entry_id}, which has not "
        "finished: two runs under one key would be one checkpoint. Pass another key (or "
        f"none, for one of its own), or use that run's handle: RunHandle(store, "
        f"{entry_id!r}), or a dedupe_key= shared by both submits"
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """Who claims: a worker's id and its process."""

    worker: str
    host: str
    pid: int
    pid_start: int | None


class QueueBackend(abc.ABC):
    """Blocking queue primitives, each one transaction decided inside the database."""

    @abc.abstractmethod
    def now(self) -> float:
        """The clock leases are judged by (the database server's, where there is one)."""

    @abc.abstractmethod
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
        """Insert an entry; ``(id, True)``. With a ``dedupe_key`` already used, insert
        nothing and return ``(that entry's id, False)``. ``not_before`` None means now +
        ``delay`` on the backend's clock.

        Raises:
            UserError: another entry under ``run_key`` is still queued or running
                (:func:`key_in_use`).
        """

    @abc.abstractmethod
    def claim(
        self,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int = 1,
        held: Collection[str] = (),
    ) -> list[QueueEntry]:
        """Take up to ``limit`` runnable entries of ``queue`` for ``owner``, in one
        transaction (possibly none).

        ``held`` are the ids of the entries ``owner`` runs now: a backend whose answer
        can be lost (a network) finds what a claim took, if it committed unheard, as
        ``owner``'s running entries outside ``held``. One owner claims one batch at a time.

        Runnable: running with an expired lease (its worker died; taken first), or queued
        and due (highest priority first, then oldest). Expired entries whose cancel was
        requested are marked cancelled first, never taken, and expired entries that used
        up ``max_attempts`` failed. A queued entry whose cancel was requested (an older
        stepstone's hand-back left it so) is marked cancelled when the claim reaches it,
        and the claim takes the next one in its place. The queue's limits
        (:meth:`set_limits`) are respected.
        """

    async def aclaim(
        self,
        queue: str,
        owner: Owner,
        lease_seconds: float,
        limit: int = 1,
        held: Collection[str] = (),
    ) -> list[QueueEntry]:
        """:meth:`claim` awaited from async code (in a thread, unless the backend has an
        async way)."""
        return await to_thread(self.claim, queue, owner, lease_seconds, limit, held)

    @abc.abstractmethod
    def renew(self, ids: Sequence[str], worker: str, lease_seconds: float) -> dict[str, bool]:
        """Extend the leases of ``worker``'s running entries; returns ``{id:
        cancel_requested}`` for those it still holds."""

    @abc.abstractmethod
    def finish(
        self, id: str, worker: str, status: str, result: str | None, error: str | None
    ) -> bool:
        """Record the outcome of an entry ``worker`` holds; False if it no longer does."""

    async def afinish(
        self, id: str, worker: str, status: str, result: str | None, error: str | None
    ) -> bool:
        """:meth:`finish` awaited from async code (in a thread, unless the backend has an
        async way)."""
        return await to_thread(self.finish, id, worker, status, result, error)

    @abc.abstractmethod
    def hand_back(self, id: str, worker: str, delay: float) -> bool:
        """Put an entry ``worker`` holds back in the queue (not counted as an attempt),
        runnable again after ``delay`` seconds; one whose cancel was requested ends
        ``cancelled`` instead."""

    def park(
        self, id: str, worker: str, run_key: str, wake_at: float, topics: Sequence[str]
    ) -> bool:
        """Put an entry ``worker`` holds back in the queue while its run waits (not counted
        as an attempt): runnable at ``wake_at`` (the database's clock; :data:`NEVER` for a
        wait with no time limit), or at once when a message on one of ``topics`` is
        pending for its run (``run_key``), now or when one is sent later (the send makes
        it runnable: ``Backend.message_send``). One whose cancel was requested ends
        ``cancelled`` instead. False when ``worker`` no longer holds it."""
        raise NotImplementedError(f"{type(self).__name__} cannot park a run")

    # -- schedules -------------------------------------------------------------------------
    def _no_schedules(self) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} keeps no schedules")

    def schedule_put(self, row: ScheduleRow) -> None:
        """Store ``row``, replacing the schedule of the same name."""
        raise self._no_schedules()

    def schedule_get(self, name: str) -> ScheduleRow | None:
        """The schedule ``name``, or None."""
        raise self._no_schedules()

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule, by name."""
        raise self._no_schedules()

    def schedule_pause(self, name: str, paused: bool, next_tick: float | None) -> bool:
        """Pause or resume ``name`` (resuming from ``next_tick`` when given); False when
        there is no such schedule."""
        raise self._no_schedules()

    def schedule_delete(self, name: str) -> bool:
        """Delete ``name``; False when there was none."""
        raise self._no_schedules()

    def schedules_due(self, queues: Sequence[str]) -> list[ScheduleRow]:
        """The schedules of ``queues`` that are not paused and whose next tick has come
        (by :meth:`now`)."""
        raise self._no_schedules()

    def schedule_fire(
        self, name: str, expected_next: float, new_next: float, entries: Sequence[TickEntry]
    ) -> list[str] | None:
        """In one transaction: move ``name``'s next tick from ``expected_next`` to
        ``new_next`` and queue ``entries`` (with the schedule's target, queue, priority and
        max_attempts; an entry whose dedupe key is taken is skipped). None, queueing
        nothing, when the next tick is no longer ``expected_next`` (another worker handled
        it) or the schedule was paused or deleted; else the ids queued."""
        raise self._no_schedules()

    @abc.abstractmethod
    def requeue(self, run_key: str) -> str | None:
        """Put the latest finished entry (done, failed or cancelled) of the run under
        ``run_key`` back in its queue, runnable now, its attempts, result and error cleared
        (a run an operator rewound, for a worker to run again). Returns its id; None when no
        entry holds the run, or one is still queued or running."""

    @abc.abstractmethod
    def active_entry(self, run_key: str) -> str | None:
        """The id of the entry under ``run_key`` that is queued or running, or None."""

    def latest_entry(self, run_key: str) -> QueueEntry | None:
        """The entry submitted last under ``run_key`` (whatever its status), or None."""
        raise NotImplementedError(f"{type(self).__name__} cannot look entries up by key")

    @abc.abstractmethod
    def get(self, id: str) -> QueueEntry | None:
        """The entry, or None."""

    @abc.abstractmethod
    def cancel(self, id: str) -> str | None:
        """Cancel a queued entry, or ask the worker of a running one to stop it. Returns
        the status after the call (None for an unknown id)."""

    @abc.abstractmethod
    def running_on(self, host: str) -> list[QueueEntry]:
        """Running entries whose worker is on ``host`` (to find dead local workers)."""

    @abc.abstractmethod
    def expire(self, id: str, worker: str) -> bool:
        """End ``worker``'s lease on ``id`` now (its process is gone)."""

    @abc.abstractmethod
    def probe(self, timeout: float) -> str | None:
        """One look, without the store's retries, at whether the queue's database answers
        now (a worker shutting down asks before it gives up on it): None when it does,
        else why not. Takes about ``timeout`` seconds at most (PostgreSQL: its connect
        timeout, at least 2 s); never raises for an unreachable database."""

    @abc.abstractmethod
    def set_limits(self, queue: str, *, concurrency: int | None, rate: float | None) -> None:
        """Queue-wide limits every worker obeys: at most ``concurrency`` running entries,
        at most ``rate`` entries started per second. None lifts a limit."""

    @abc.abstractmethod
    def entries(self, queue: str | None, status: str | None) -> list[QueueEntry]:
        """Entries (optionally of one queue and status), in submission order."""

    @abc.abstractmethod
    def prune(self, older_than: float, queue: str | None) -> int:
        """Delete the finished entries (``done``, ``failed``, ``cancelled``; optionally of
        one queue) last updated more than ``older_than`` seconds ago on :meth:`now`'s
        clock, freeing their dedupe keys; returns how many were deleted."""
