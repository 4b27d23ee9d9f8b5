"""How a waiting run behaves on a worker: parked when its wait is long, stopped at once
when cancelled.

A worker runs each queued run with a :class:`Parking` in its context (:func:`parked_by`).
Code waiting inside that run (a durable sleep, a receive) asks :func:`parking`:

* with None (not on a worker: an inline run), it waits in its process;
* on a worker, a wait longer than ``Parking.after`` seconds raises
  :class:`~stepstone.exceptions.RunParked` instead: the worker puts the run's queue entry
  back, runnable at the wake time or when a message on the topic arrives
  (``QueueBackend.park``), and its slot serves other runs meanwhile. A receive waits up to
  ``after`` seconds in its process first (a reply often comes quickly); a sleep longer than
  ``after`` parks at once;
* while it waits in its process, it calls ``Parking.check()`` at each look: the worker
  stops the run at once when its cancel was requested (a parked run's entry is cancelled
  by the cancel itself).
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Sequence

from stepstone.store._changes import Subscription, queue_topic
from stepstone.store._store import Store

__all__ = ["Parking", "parked_by", "parking", "watch_queues"]


@dataclasses.dataclass(frozen=True, slots=True)
class Parking:
    """What the worker running this run does with its waits.

    Attributes:
        after: Waits longer than this many seconds give the worker's slot back.
        check: Called (blocking, from a thread) at each look of a wait in this process:
            the worker stops the run if its cancel was requested.
    """

    after: float
    check: Callable[[], None]


_parking: contextvars.ContextVar[Parking | None] = contextvars.ContextVar(
    "stepstone_parking", default=None
)


def parking() -> Parking | None:
    """The parking of the worker running the calling code, or None (not on a worker)."""
    return _parking.get()


def parked_by(policy: Parking | None) -> contextvars.Token[Parking | None]:
    """Make ``policy`` the parking of the calling task (and the tasks it starts)."""
    return _parking.set(policy)


def watch_queues(store: Store, queues: Sequence[str]) -> Subscription:
    """A subscription that is touched when a parked run of one of ``queues`` is made
    runnable by a message (PostgreSQL's ``NOTIFY``, or a send in this process); the worker
    takes it at once instead of at its next poll."""
    return store.backend.changes().subscribe([queue_topic(q) for q in queues])
