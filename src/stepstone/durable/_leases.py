"""Lease policy, in one place: how long an owner's claim holds, when it is renewed, when an
owner counts as dead, and which head fields a claim writes; plus the lease keeper thread.

The store only stores (``Store(lease_seconds=...)`` carries the number, queue backends take
it as an argument for their SQL); everything decided about leases is decided here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from stepstone.core._checks import positive_seconds
from stepstone.core._ids import host_id, process_alive, process_start_time
from stepstone.store._base import RunHead

if TYPE_CHECKING:
    from stepstone.durable._kernel import OwnedRun
    from stepstone.store._store import Store

__all__ = ["LeaseKeeper", "LeasePolicy", "database_now", "keeper", "owner_alive"]

log = logging.getLogger("stepstone")

LIVE_STATUSES = ("claimed", "running")

#: ``LeasePolicy()``'s lease; ``Store()`` and ``Worker()`` default to the same number (a test
#: checks they agree: the store layer cannot import this module).
DEFAULT_LEASE_SECONDS = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a lease holds and when it is renewed: the kernel's one rule for run leases
    (``Store(lease_seconds=...)``) and a worker's queue leases (``Worker(lease_seconds=...)``).

    Every ``now`` passed in is the database's clock (``Backend.clock()``), never this
    host's: hosts whose wall clocks disagree still agree on whether a lease ran out.

    Attributes:
        seconds: How long a lease holds without renewal; a finite number > 0.

    Raises:
        ConfigurationError: ``seconds`` is zero, negative, NaN or infinite
            (``ConfigurationTypeError`` when it is not a number).
    """

    seconds: float = DEFAULT_LEASE_SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", positive_seconds("lease_seconds", self.seconds))

    @classmethod
    def of(cls, store: Store) -> LeasePolicy:
        """The policy of the runs kept in ``store`` (set by ``Store(lease_seconds=...)``)."""
        return cls(store.lease_seconds)

    @property
    def renew_every(self) -> float:
        """Seconds between renewals: a third of the lease, so an owner can miss two
        renewals (a locked database, a busy host) before its lease runs out."""
        return self.seconds / 3

    @property
    def retry_after(self) -> float:
        """How long to wait before trying again to take a run another owner still holds:
        one renewal period, at most 5 seconds."""
        return min(5.0, self.renew_every)

    def until(self, now: float) -> float:
        """When a lease set or renewed at ``now`` runs out."""
        return now + self.seconds

    def due(self, lease_until: float, now: float) -> bool:
        """Whether a lease running to ``lease_until`` should be renewed at ``now``: one
        renewal period has passed since it was last set."""
        return lease_until - now < self.seconds - self.renew_every

    @staticmethod
    def expired(lease_until: float, now: float) -> bool:
        """Whether a lease running to ``lease_until`` has run out at ``now``."""
        return lease_until < now

    def claim(self, now: float, run_uid: str) -> dict[str, Any]:
        """The head fields that make this process the owner of a run from ``now``: a
        fresh ``run_uid``, this host and process (with its start time, so a recycled pid
        is not mistaken for it) and a lease until :meth:`until`."""
        host, pid, pid_start = _this_process()
        return {
            "run_uid": run_uid,
            "status": "claimed",
            "host": host,
            "pid": pid,
            "pid_start": pid_start,
            "lease_until": self.until(now),
            "updated_at": now,
        }


_me: tuple[str, int, int | None] | None = None


def _this_process() -> tuple[str, int, int | None]:
    """This host's id, pid and process start time, read once per process (a claim runs
    inside a write transaction: asking the OS for the start time there would hold the
    database lock longer). A forked child reads its own."""
    global _me
    pid = os.getpid()
    if _me is None or _me[1] != pid:
        _me = (host_id(), pid, process_start_time(pid))
    return _me


class LeaseKeeper:
    """Renews the leases of every run this process owns, from one daemon thread.

    A thread (rather than an event-loop task) keeps renewing while a synchronous step
    blocks its loop, so a long step never looks dead to other processes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, weakref.ref[OwnedRun]] = {}
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        #: How long the keeper thread is sleeping for, while it sleeps (None otherwise).
        self._sleeping: float | None = None

    def add(self, run: OwnedRun) -> None:
        """Start renewing ``run``'s lease."""
        with self._lock:
            if self._pid != os.getpid():  # forked child: the parent's thread is not ours
                self._runs.clear()
                self._thread = None
                self._sleeping = None
                self._pid = os.getpid()
            self._runs[id(run)] = weakref.ref(run)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="stepstone-lease-keeper", daemon=True
                )
                self._thread.start()
            elif self._sleeping is not None and _pause(run.lease.renew_every) < self._sleeping:
                # Wake the thread only when it would sleep past this run's first renewal:
                # waking it for every claim cost a thread switch per run. (A thread that
                # is not sleeping sees the run when it next computes its pause.)
                self._wake.notify()

    def remove(self, run: OwnedRun) -> None:
        """Stop renewing ``run``'s lease (it finished or was released)."""
        with self._lock:
            self._runs.pop(id(run), None)

    def _live(self) -> list[OwnedRun]:
        return [r for ref in self._runs.values() if (r := ref()) is not None]

    def _loop(self) -> None:
        while True:
            with self._lock:
                runs = self._live()
            for run in runs:
                if run.lease_due():
                    try:
                        run.renew()
                    except Exception:
                        log.warning(
                            "stepstone: renewing the lease of %r failed", run.key, exc_info=True
                        )
            with self._lock:
                # The pause is computed under the lock it sleeps on: a run added from now
                # on either counts here or finds ``_sleeping`` set and wakes the thread.
                interval = min(
                    (r.lease.renew_every for r in self._live()),
                    default=DEFAULT_LEASE_SECONDS / 3,
                )
                self._sleeping = _pause(interval)
                self._wake.wait(timeout=self._sleeping)
                self._sleeping = None


def _pause(renew_every: float) -> float:
    """How long the keeper sleeps between passes, given the shortest renewal period:
    half of it (a renewal is at most that late), at least 50 ms."""
    return max(0.05, renew_every / 2)


keeper = LeaseKeeper()


#: Runs this process claimed and then released whose lease could not be expired in the
#: database (the store was locked or unreachable at that moment). Only the owner adds to
#: it, and only once it has stopped using the run, so unlike a registry of live runs it
#: never lags: a run_uid in it is certainly not being executed here any more.
_released_here: set[str] = set()


def mark_released(run_uid: str) -> None:
    """Record that this process stopped executing ``run_uid`` (see :func:`owner_alive`)."""
    _released_here.add(run_uid)


def database_now(store: Store) -> float:
    """The database's clock (unix seconds), by which every lease is set and judged: the
    PostgreSQL server's time, this machine's for SQLite. Read models and engines that
    decide whether an owner is alive pass it to :func:`owner_alive` as ``now``."""
    return store.backend.clock()


def owner_alive(head: RunHead, *, now: float | None = None) -> bool:
    """Whether the run recorded in ``head`` is still being executed by a live owner
    (``now``: the database's clock, as ``store.backend.clock()`` reads it; default: this
    host's).

    Decided from the record alone, never from this process's bookkeeping (which lags the
    database: a run is committed as claimed before its owner registers it anywhere). Dead
    when its status is terminal (paused, failed, done), its lease expired (a run released
    without reaching a terminal status has its lease expired in the database by
    ``OwnedRun.release``), or it ran on this host and its process is gone.
    """
    if head.status not in LIVE_STATUSES:
        return False
    if LeasePolicy.expired(head.lease_until, time.time() if now is None else now):
        return False
    if head.host == host_id():
        if head.pid == os.getpid() and head.run_uid in _released_here:
            return False
        return process_alive(head.pid, head.pid_start)
    return True
