"""Group commit: step commits (and, on SQLite, claims) of many runs that are ready at the
same moment share one transaction (and one fsync).

Used when several runs share one event loop (``arun_many``, a worker's runs): each commit
joins the batch being gathered; a batch is written from a writer thread as one
transaction, each run's compare-and-swap checked on its own, so a run whose commit fails
(lost ownership, a key conflict) writes nothing and the others land. While one batch is
being written (the fsync releases the GIL), the loop keeps running the other runs' steps,
and the commits that arrive meanwhile form the next batch, written as soon as the current
one is done. A batch that every run of the group is waiting for (none has a step to run
meanwhile) is written by the loop's thread itself: the switches to the writer thread and
back (tens of microseconds each, in latency and CPU) would only delay every run. A run
belongs to its loop's group from its first claim or commit through it until its release
(:func:`leave`). Only SQLite groups them (see :func:`can_group` for why PostgreSQL does
not); the others commit each run on its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stepstone.store._base import Backend, Decide, JournalRow, RunHead, commit_each

__all__ = [
    "CommitItem",
    "can_group",
    "can_group_claims",
    "commit_many",
    "drain",
    "group_commit",
    "group_transact",
    "groups",
    "leave",
]

CommitItem = tuple[RunHead, int, Sequence[JournalRow], Sequence[tuple[str, str]]]
ClaimItem = tuple[str, Decide]
Item = CommitItem | ClaimItem
Outcome = Any  # bool | RunHead | None | BaseException, per item


def can_group(backend: Backend) -> bool:
    """Whether the async step commits of runs sharing a loop join a batch (SQLite).

    Not on PostgreSQL: the server already shares one WAL flush among the commits that
    arrive together on separate connections, so runs committing at once gain nothing from
    a batch, while a batch costs its own round trips (``BEGIN``, the locks, one statement
    per run, ``COMMIT``) and makes every commit that arrives meanwhile wait for it. Measured
    with 200 queued 10-step runs on a worker at concurrency 4: 31 runs/s grouped against
    50 runs/s with each commit sent on its own, and less CPU per run in the worker and the
    server. :func:`commit_many` still writes a PostgreSQL batch as one transaction.
    """
    from stepstone.store._sqlite import SQLiteBackend

    return isinstance(backend, SQLiteBackend)


def can_group_claims(backend: Backend) -> bool:
    """Whether claims (``run_transact``) join the batches too (SQLite)."""
    from stepstone.store._sqlite import SQLiteBackend

    return isinstance(backend, SQLiteBackend) and not backend.read_only


def commit_many(backend: Backend, items: Sequence[Item]) -> list[Outcome]:
    """Apply ``items`` (step commits; claims on SQLite) as one transaction; per item, what
    ``run_commit`` (True/False) or ``run_transact`` returned, or the exception it raised
    (its rows not written). A failure of the transaction itself never loses or lands a
    run's rows: the items are then applied one by one."""
    from stepstone.store._sqlite import SQLiteBackend

    if isinstance(backend, SQLiteBackend):
        from stepstone.store._sqlite_batch import commit_batch

        return commit_batch(backend, items)
    pg = sys.modules.get("stepstone.store._postgres")
    if len(items) > 1 and pg is not None and isinstance(backend, pg.PostgresBackend):
        from stepstone.store import _postgres_batch

        return list(_postgres_batch.commit_many(backend, items))  # type: ignore[arg-type]
    return list(commit_each(backend, items))  # type: ignore[arg-type]


class _Writers:
    """The writer thread of each grouping backend in this process (a fork gets new ones):
    one per backend, so its batches go through the same SQLite connection and never
    overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.by_backend: weakref.WeakKeyDictionary[Backend, ThreadPoolExecutor] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, backend: Backend) -> ThreadPoolExecutor:
        with self.lock:
            if self.pid != os.getpid():
                self.pid, self.by_backend = os.getpid(), weakref.WeakKeyDictionary()
            pool = self.by_backend.get(backend)
            if pool is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix="stepstone-group-commit")
                self.by_backend[backend] = pool
            return pool


_writers = _Writers()


class _Group:
    """The pending commits of one backend on one event loop: at most one batch is being
    written at a time; what arrives meanwhile is the next batch."""

    def __init__(self, backend: Backend, loop: asyncio.AbstractEventLoop) -> None:
        self.backend = backend
        self.loop = loop
        self.pending: list[tuple[Item, asyncio.Future[Any]]] = []
        self.scheduled = False
        self.inflight: Future[list[Outcome]] | None = None
        self.members: set[str] = set()  # keys of the runs committing through this group

    def add(self, item: Item) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.pending.append((item, fut))
        first = item[0]
        key = first.key if isinstance(first, RunHead) else first
        self.members.add(key)
        if len(self.members) == 1 and len(self.pending) == 1 and self.inflight is None:
            # The group's only run: no other run can join this batch, and the run waits
            # for it. Written now, on the loop's thread, without the two loop iterations
            # a batch waits for others (a durable agent turn commits twice).
            self.flush()
            return fut
        if not self.scheduled and self.inflight is None:
            self.scheduled = True
            # two iterations on: runs woken in this one and the next (steps that just
            # finished, their worker threads' results) join in
            self.loop.call_soon(self.loop.call_soon, self.flush)
        return fut

    def flush(self) -> None:
        # (a commit whose waiter was cancelled is written all the same: its step ran)
        batch, self.pending, self.scheduled = self.pending, [], False
        if not batch:
            return
        items = [item for item, _ in batch]
        if len(batch) >= len(self.members):
            # Every run of the group waits for this batch: none has a step to run
            # meanwhile, so the loop thread writes it itself and saves the two thread
            # switches (to the writer and back).
            _deliver(batch, commit_many(self.backend, items))
            return
        self.inflight = _writers.get(self.backend).submit(commit_many, self.backend, items)
        done = asyncio.wrap_future(self.inflight, loop=self.loop)
        done.add_done_callback(lambda f: self._written(batch, f))

    def _written(
        self, batch: list[tuple[Item, asyncio.Future[Any]]], done: asyncio.Future[list[Outcome]]
    ) -> None:
        self.inflight = None
        _deliver(batch, _outcomes(done, len(batch)))
        if self.pending and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def drain(self) -> None:
        """Write every pending commit now, blocking the loop: the batch being written
        first, then the pending ones (their waiters get their outcomes at once)."""
        if self.inflight is not None:
            concurrent.futures.wait([self.inflight])
        batch, self.pending = self.pending, []
        if batch:
            items = [item for item, _ in batch]
            done = _writers.get(self.backend).submit(commit_many, self.backend, items)
            _deliver(batch, _outcomes(done, len(batch)))


def _outcomes(done: asyncio.Future[list[Outcome]] | Future[list[Outcome]], n: int) -> list[Outcome]:
    if done.cancelled():
        return [asyncio.CancelledError()] * n
    exc = done.exception()
    return [exc] * n if exc is not None else done.result()


def _deliver(batch: list[tuple[Item, asyncio.Future[Any]]], outcomes: list[Outcome]) -> None:
    for (_, fut), outcome in zip(batch, outcomes, strict=True):
        if fut.cancelled():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _Group]] = (
    weakref.WeakKeyDictionary()
)


def _group(backend: Backend) -> _Group:
    loop = asyncio.get_running_loop()
    per_loop = groups.setdefault(loop, {})
    group = per_loop.get(id(backend))
    if group is None or group.backend is not backend:
        group = per_loop[id(backend)] = _Group(backend, loop)
    return group


def _running_group(backend: Backend) -> _Group | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return groups.get(loop, {}).get(id(backend))


def drain(backend: Backend) -> None:
    """Write the running loop's pending commits for ``backend`` now (blocking): called
    before a write that bypasses the group (a run's release), so it lands after them."""
    group = _running_group(backend)
    if group is not None and (group.pending or group.inflight is not None):
        group.drain()


def leave(backend: Backend, key: str) -> None:
    """The run under ``key`` commits no more through the running loop's group (it was
    released, or its claim did not start a run)."""
    group = _running_group(backend)
    if group is not None:
        group.members.discard(key)


async def group_commit(backend: Backend, item: CommitItem) -> bool:
    """Commit ``item`` in the batch being gathered on the running loop."""
    ok: bool = await _group(backend).add(item)
    return ok


async def group_transact(backend: Backend, key: str, decide: Decide) -> RunHead | None:
    """``backend.run_transact(key, decide)`` in the batch being gathered on the running
    loop (backends where :func:`can_group_claims`); ``decide`` runs on the writer thread."""
    head: RunHead | None = await _group(backend).add((key, decide))
    return head
