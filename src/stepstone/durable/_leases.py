"""Ownership liveness: the lease keeper thread and the "is this owner alive?" test."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING

from stepstone.core._ids import host_id, process_alive
from stepstone.store._base import RunHead

if TYPE_CHECKING:
    from stepstone.durable._kernel import OwnedRun

__all__ = ["LeaseKeeper", "keeper", "owner_alive"]

log = logging.getLogger("stepstone")

LIVE_STATUSES = ("claimed", "running")


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

    def add(self, run: OwnedRun) -> None:
        """Start renewing ``run``'s lease."""
        with self._lock:
            if self._pid != os.getpid():  # forked child: the parent's thread is not ours
                self._runs.clear()
                self._thread = None
                self._pid = os.getpid()
            self._runs[id(run)] = weakref.ref(run)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="stepstone-lease-keeper", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def remove(self, run: OwnedRun) -> None:
        """Stop renewing ``run``'s lease (it finished or was released)."""
        with self._lock:
            self._runs.pop(id(run), None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                runs = [r for ref in self._runs.values() if (r := ref()) is not None]
                interval = min((r.store.lease_seconds for r in runs), default=30.0) / 3
            now = time.time()
            for run in runs:
                if run.lease_due(now):
                    try:
                        run.renew()
                    except Exception:
                        log.warning(
                            "stepstone: renewing the lease of %r failed", run.key, exc_info=True
                        )
            with self._lock:
                self._wake.wait(timeout=max(0.05, interval / 2))


keeper = LeaseKeeper()


#: Runs this process claimed and then released whose lease could not be expired in the
#: database (the store was locked or unreachable at that moment). Only the owner adds to
#: it, and only once it has stopped using the run, so unlike a registry of live runs it
#: never lags: a run_uid in it is certainly not being executed here any more.
_released_here: set[str] = set()


def mark_released(run_uid: str) -> None:
    """Record that this process stopped executing ``run_uid`` (see :func:`owner_alive`)."""
    _released_here.add(run_uid)


def owner_alive(head: RunHead, *, now: float | None = None) -> bool:
    """Whether the run recorded in ``head`` is still being executed by a live owner.

    Decided from the record alone, never from this process's bookkeeping (which lags the
    database: a run is committed as claimed before its owner registers it anywhere). Dead
    when its status is terminal (paused, failed, done), its lease expired (a run released
    without reaching a terminal status has its lease expired in the database by
    ``OwnedRun.release``), or it ran on this host and its process is gone.
    """
    if head.status not in LIVE_STATUSES:
        return False
    if head.lease_until < (time.time() if now is None else now):
        return False
    if head.host == host_id():
        if head.pid == os.getpid() and head.run_uid in _released_here:
            return False
        return process_alive(head.pid, head.pid_start)
    return True
