"""Graph observers: callbacks told of node starts and ends, saves and the run's end.

Events are delivered in order, one at a time, by a task of the invocation's event loop, so
an observer never slows a node down and never changes a run's outcome: what it raises is
logged (logger ``"stepstone"``) and dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeAlias

from stepstone.core._threads import call_sync, is_awaitable
from stepstone.core._tool import is_async_callable

__all__ = ["EventKind", "GraphEvent", "Observer", "Observers", "Pending", "check_observers"]

log = logging.getLogger("stepstone")

EventKind: TypeAlias = Literal["node_start", "node_end", "checkpoint_saved", "run_end"]

#: ``fn(event)``, sync or async; what it returns is ignored.
Observer: TypeAlias = Callable[["GraphEvent"], Awaitable[None] | None]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GraphEvent:
    """What an observer is told.

    Attributes:
        kind: ``"node_start"`` (a node is about to run), ``"node_end"`` (it ran: ``state``
            is the state after its update, or ``error`` says why it failed),
            ``"checkpoint_saved"`` (its completion is committed), ``"run_end"`` (the invoke
            returns or raises).
        invocation_id: The invoke's id (each invoke, resumes included, has its own).
        correlation_id: The job's join key, shared by every attempt.
        node_name: The node (None for ``run_end``).
        namespace: The subgraph path of the node (``()`` for the outermost graph).
        step: The node's visit number in its namespace (None for ``run_end``).
        attempt_index: Which invoke of the chain this is (0 for the first).
        state: ``node_start``: the state the node gets; ``node_end`` and
            ``checkpoint_saved``: the state after its update; ``run_end``: the final state
            (None when the run failed).
        error: The exception of a failed node (``node_end``) or run (``run_end``).
        status: For ``run_end``: ``"done"`` or ``"failed"``.
        branch: For the events of a fan-out branch: the item's index in the list.
        at: Unix time the event happened.
    """

    kind: EventKind
    invocation_id: str
    correlation_id: str
    node_name: str | None = None
    namespace: tuple[str, ...] = ()
    step: int | None = None
    attempt_index: int = 0
    state: Any = None
    error: BaseException | None = None
    status: str | None = None
    branch: int | None = None
    at: float = dataclasses.field(default_factory=time.time)


def check_observers(observers: Any, where: str) -> tuple[Observer, ...]:
    """``observers`` as a tuple of callables, or a ``ConfigurationTypeError`` naming the
    value that is not one."""
    from stepstone.exceptions import ConfigurationTypeError

    if observers is None:
        return ()
    if callable(observers) or isinstance(observers, (str, bytes)):
        raise ConfigurationTypeError(
            f"{where} takes a list of observers, got {observers!r}; pass [{observers!r}]"
            if callable(observers)
            else f"{where} takes a list of functions event -> None, got {observers!r}"
        )
    out = tuple(observers)
    for fn in out:
        if not callable(fn):
            raise ConfigurationTypeError(
                f"{where}: an observer is a function event -> None (sync or async), got {fn!r}"
            )
    return out


class Pending:
    """A graph's delivery tasks that have not finished (its invocations may run on several
    threads and loops at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, task: asyncio.Task[None]) -> None:
        with self._lock:
            self._tasks.add(task)

    def discard(self, task: asyncio.Task[None]) -> None:
        with self._lock:
            self._tasks.discard(task)

    def on(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[None]]:
        """The unfinished tasks of ``loop``."""
        with self._lock:
            return [t for t in self._tasks if t.get_loop() is loop and not t.done()]


class Observers:
    """One invocation's deliveries: a queue and the task that empties it, in order."""

    def __init__(self, observers: Sequence[Observer], pending: Pending) -> None:
        self.observers = tuple(observers)
        self._pending = pending  # the graph's set, for drain_observers()
        self._queue: asyncio.Queue[tuple[GraphEvent, tuple[Observer, ...]] | None] | None = None
        self._task: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self.observers)

    def emit(self, event: GraphEvent, extra: Sequence[Observer] = ()) -> None:
        """Queue ``event`` for the invocation's observers (and ``extra`` ones: a
        subgraph's own); returns at once."""
        targets = (*self.observers, *extra)
        if not targets:
            return
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._deliver(self._queue))
            self._pending.add(self._task)
            self._task.add_done_callback(self._pending.discard)
        self._queue.put_nowait((event, targets))

    def close(self) -> asyncio.Task[None] | None:
        """No more events; the delivery task (to await, or None)."""
        if self._queue is not None:
            self._queue.put_nowait(None)
        return self._task

    async def _deliver(
        self, queue: asyncio.Queue[tuple[GraphEvent, tuple[Observer, ...]] | None]
    ) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            event, targets = item
            for fn in targets:
                await _call(fn, event)


async def _call(fn: Observer, event: GraphEvent) -> None:
    try:
        if is_async_callable(fn):
            result: Any = fn(event)
        else:
            result = await call_sync(fn, event)
        if is_awaitable(result):
            await result
    except Exception:
        log.warning(
            "stepstone: graph observer %r raised on %s of %r (invocation %s); the run goes on",
            fn,
            event.kind,
            event.node_name,
            event.invocation_id,
            exc_info=True,
        )


async def drain(pending: Pending, timeout: float | None) -> bool:
    """Wait for the deliveries in ``pending`` that run on this loop; False on timeout."""
    mine = pending.on(asyncio.get_running_loop())
    if not mine:
        return True
    _, still = await asyncio.wait(mine, timeout=timeout)
    return not still
