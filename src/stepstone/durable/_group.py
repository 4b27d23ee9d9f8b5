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
back (tens of microseconds each, in latency and CPU) would only delay every run. The
group's only run has its commits written at once, except after its claim and once a
millisecond, when it lets the loop's other ready tasks run first (they may be runs about
to join). A run
belongs to its loop's group from its first claim or commit through it until its release
(:func:`leave`). Only SQLite groups them (see :func:`can_group` for why PostgreSQL does
not); the others commit each run on its own.

Every batch, and every commit and claim of a run driven by a sync call (each thread's
private loop, where a run has nothing to do while it waits), goes through its backend's
:class:`_Turns`: process-wide, one writer at a time. A thread that finds no one writing
writes its own items at once (a lone run pays no more than a lock); those that arrive
while one writes queue up, and the next of them writes everything queued, as one
transaction and one fsync. So runs on many threads (a ``ThreadPoolExecutor`` calling an
Agent) and on many loops share commits too, and writers of one file in this process wait
on a Python lock, never in SQLite's busy handler (which sleeps a millisecond or more
between tries).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stepstone.store._base import Backend, Claim, Decide, JournalRow, RunHead, commit_each

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
    "shared_claim",
    "shared_commit",
    "turns",
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
    from stepstone.store._sqlite_batch import commit_batch

    if isinstance(backend, SQLiteBackend):
        return commit_batch(backend, items)
    pg = sys.modules.get("stepstone.store._postgres")
    if len(items) > 1 and pg is not None and isinstance(backend, pg.PostgresBackend):
        from stepstone.store import _postgres_batch

        return list(_postgres_batch.commit_many(backend, items))  # type: ignore[arg-type]
    return list(commit_each(backend, items))  # type: ignore[arg-type]


class _Recorded:
    """A queued claim's ``decide``, remembering the claim it decided last: a writer that
    takes over items from a writer cut short (:meth:`_Turns.write`) tells by it whether
    the claim landed."""

    __slots__ = ("claim", "decide")

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.claim: Claim | None = None

    def __call__(self, head: RunHead | None, kv_text: str | None) -> Claim | None:
        self.claim = None
        claim = self.decide(head, kv_text)
        self.claim = claim
        return claim


def _recorded(items: Sequence[Item]) -> list[Item]:
    return [(item[0], _Recorded(item[1])) if len(item) == 2 else item for item in items]


class _Waiter:
    """One thread's items queued in a backend's :class:`_Turns`: the thread waits on
    ``gate`` until a writer hands it its ``outcomes``, or makes it the next writer
    (``lead``). ``again``: a writer took these items and was cut short (an exception from
    a signal handler) before it could tell whether they landed."""

    __slots__ = ("again", "gate", "items", "lead", "outcomes")

    def __init__(self, items: list[Item]) -> None:
        self.items = items
        self.gate = threading.Lock()
        self.gate.acquire()
        self.outcomes: list[Outcome] | None = None
        self.lead = False
        self.again = False


def _open(gate: threading.Lock) -> None:
    try:
        gate.release()
    except RuntimeError:
        pass  # opened already (a hand-over done again after an interruption)


class _Turns:
    """Who writes to one backend now, in this process (module docstring).

    ``writer`` is whoever holds the turn (None: no one); the turn passes to the oldest
    queued thread, which writes everything queued by then. Each item's outcome goes back
    to the thread that queued it; each run's compare-and-swap is checked on its own
    (:func:`commit_many`), so one run's failure never loses or lands another's rows.

    An exception raised in the writing thread by a signal handler (a second Ctrl-C's
    ``KeyboardInterrupt`` on the main thread) never leaves the others waiting: the writer
    first hands them their outcomes, or, when it was cut short before it knew them, puts
    their items back at the front of the queue for the next writer, which writes only
    those that did not land (a commit landed when the stored head is its new head; a claim
    when the stored head is the one its ``decide`` wrote).
    """

    __slots__ = ("__weakref__", "lock", "queue", "ref", "writer")

    def __init__(self, ref: weakref.ref[Backend]) -> None:
        self.ref = ref  # weak: the registry keeps no backend alive
        self.lock = threading.Lock()
        self.writer: object | None = None
        self.queue: list[_Waiter] = []

    @property
    def backend(self) -> Backend:
        backend = self.ref()
        assert backend is not None  # whoever writes through it holds it
        return backend

    def write(self, items: Sequence[Item]) -> list[Outcome]:
        """Write ``items`` (with whatever else is queued) and return their outcomes, as
        :func:`commit_many` does; blocks until they are written."""
        me = object()
        waiter: _Waiter | None = None
        with self.lock:
            if self.writer is None:
                self.writer = me
            else:
                waiter = _Waiter(_recorded(items))
                self.queue.append(waiter)
        if waiter is None:
            return self._lead(me, items, False, [])
        return self._wait(waiter)

    def one(self, item: Item) -> Any:
        """:meth:`write` of one item: what its ``run_commit``/``run_claim`` returns (or
        raises). Alone, the item is written as the backend writes it, with no list built."""
        me = object()
        waiter: _Waiter | None = None
        with self.lock:
            if self.writer is None:
                self.writer = me
            else:
                waiter = _Waiter(_recorded((item,)))
                self.queue.append(waiter)
        if waiter is not None:
            return _one(self._wait(waiter)[0])
        try:
            if len(item) == 2:
                return self.backend.run_claim(*item)
            return self.backend.run_commit(*item)
        finally:
            try:
                with self.lock:  # the usual case, inline: no one queued meanwhile
                    if self.writer is me and not self.queue:
                        self.writer = None
            finally:
                if self.writer is me:  # (only we change it while it is us)
                    self._pass_on(me)

    def _wait(self, waiter: _Waiter) -> list[Outcome]:
        interrupted: BaseException | None = None
        # The writer sets ``outcomes`` or ``lead`` before it opens the gate.
        while waiter.outcomes is None and not waiter.lead:
            try:
                waiter.gate.acquire()
            except BaseException as exc:  # noqa: BLE001 - raised once our part is done
                interrupted = exc
        if waiter.outcomes is None:  # our turn to write
            with self.lock:
                self.writer = waiter
                others, self.queue = [w for w in self.queue if w is not waiter], []
            try:
                outcomes = self._lead(waiter, waiter.items, waiter.again, others)
            except BaseException:
                if interrupted is not None:
                    raise interrupted from None
                raise
        else:
            outcomes = waiter.outcomes
        if interrupted is not None:
            raise interrupted
        return outcomes

    def _pass_on(self, me: object) -> None:
        """:meth:`_hand_on`, finished even when a signal's exception interrupts it."""
        interrupted: BaseException | None = None
        while True:
            try:
                self._hand_on(me)
                break
            except BaseException as exc:  # noqa: BLE001 - raised once handed on
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def _lead(
        self, me: object, own: Sequence[Item], again: bool, others: list[_Waiter]
    ) -> list[Outcome]:
        outcomes: list[Outcome] | None = None
        interrupted: BaseException | None = None
        try:
            outcomes = self._commit(own, again, others)
        except BaseException as exc:  # noqa: BLE001 - raised once the others are served
            interrupted = exc
        while True:  # done again if interrupted: each part may be repeated
            try:
                if outcomes is None:
                    self._put_back(others)
                else:
                    self._deliver(others, outcomes, len(own))
                self._hand_on(me)
                break
            except BaseException as exc:  # noqa: BLE001 - as above
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
        assert outcomes is not None
        return outcomes[: len(own)] if others else outcomes

    def _commit(self, own: Sequence[Item], again: bool, others: list[_Waiter]) -> list[Outcome]:
        if not others and not again:
            return commit_many(self.backend, own)
        items = list(own)
        redo = [again] * len(own)
        for w in others:
            items.extend(w.items)
            redo.extend([w.again] * len(w.items))
        if not any(redo):
            return commit_many(self.backend, items)
        # Some items were taken by a writer cut short: write those that did not land.
        out: list[Outcome] = [None] * len(items)
        todo = []
        for i, (item, check) in enumerate(zip(items, redo, strict=True)):
            landed = _landed(self.backend, item) if check else None
            if landed is None:
                todo.append(i)
            else:
                out[i] = landed
        for i, outcome in zip(
            todo, commit_many(self.backend, [items[i] for i in todo]), strict=True
        ):
            out[i] = outcome
        return out

    def _deliver(self, others: list[_Waiter], outcomes: list[Outcome], start: int) -> None:
        for w in others:
            end = start + len(w.items)
            if w.outcomes is None:
                w.outcomes = outcomes[start:end]
            _open(w.gate)
            start = end

    def _put_back(self, others: list[_Waiter]) -> None:
        with self.lock:
            back = [w for w in others if w not in self.queue]
            for w in back:
                w.again = True
            self.queue[:0] = back

    def _hand_on(self, me: object) -> None:
        with self.lock:
            if self.writer is not me:  # handed on already
                return
            if self.queue:
                nxt = self.queue[0]
                nxt.lead = True
                _open(nxt.gate)
                self.writer = nxt
            else:
                self.writer = None


def _landed(backend: Backend, item: Item) -> Outcome:
    """The outcome of ``item`` if a writer cut short had written it (None otherwise)."""
    first = item[0]
    key = first.key if isinstance(first, RunHead) else first
    try:
        current = backend.run_get(key)
    except Exception:  # noqa: BLE001 - then written again, which reports the error
        return None
    if current is None:
        return None
    if isinstance(first, RunHead):
        return (
            True if (current.version, current.run_uid) == (first.version, first.run_uid) else None
        )
    decided = item[1]
    claim = decided.claim if isinstance(decided, _Recorded) else None
    if claim is not None and (current.version, current.run_uid) == (
        claim.head.version,
        claim.head.run_uid,
    ):
        return claim.head
    return None


class _Registry:
    """The :class:`_Turns` of each backend used in this process, by ``id`` of the backend
    (an entry goes when its backend does; a forked child starts with none: a parent's
    turn may have been held, by a thread the child does not have)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, _Turns] = {}

    def forget(self, key: int, ref: weakref.ref[Backend]) -> None:
        """A backend is gone (a weakref callback: no lock, it may run in any thread at
        any moment; dict operations are atomic)."""
        found = self.by_id.get(key)
        if found is not None and found.ref is ref:
            self.by_id.pop(key, None)


_registry = _Registry()


def _forked() -> None:
    global _registry
    _registry = _Registry()


os.register_at_fork(after_in_child=_forked)


def turns(backend: Backend) -> _Turns:
    """The :class:`_Turns` of ``backend`` in this process."""
    registry = _registry
    key = id(backend)
    found = registry.by_id.get(key)
    if found is None or found.ref() is not backend:
        with registry.lock:
            found = registry.by_id.get(key)
            if found is None or found.ref() is not backend:
                ref = weakref.ref(backend, functools.partial(registry.forget, key))
                found = registry.by_id[key] = _Turns(ref)
    return found


def _one(outcome: Outcome) -> Any:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def shared_commit(backend: Backend, item: CommitItem) -> bool:
    """``backend.run_commit(*item)``, sharing a transaction with the commits and claims
    other threads of this process make at the same moment (backends where
    :func:`can_group`); blocks until it is written."""
    ok: bool = turns(backend).one(item)
    return ok


def shared_claim(backend: Backend, key: str, decide: Decide) -> RunHead | None:
    """``backend.run_claim(key, decide)`` through the backend's turns, as
    :func:`shared_commit` (backends where :func:`can_group_claims`)."""
    head: RunHead | None = turns(backend).one((key, decide))
    return head


class _Writers:
    """The writer thread of each grouping backend in this process (a fork gets new ones),
    which writes the batches of its loops that do not wait for them, through the backend's
    :class:`_Turns`."""

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


#: How long the only run of a loop's group may go on committing at once, without letting
#: the loop's other tasks run (seconds).
LET_IN_EVERY = 1e-3


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
        self.let_in = -LET_IN_EVERY  # loop time the group's only run last let others in

    def add(self, item: Item) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.pending.append((item, fut))
        first = item[0]
        key = first.key if isinstance(first, RunHead) else first
        self.members.add(key)
        if len(self.members) == 1 and len(self.pending) == 1 and self.inflight is None:
            # The group's only run: no other run can join this batch, and the run waits
            # for it. Written now, on the loop's thread, without the two loop iterations
            # a batch waits for others (a durable agent turn commits twice); but, after a
            # claim and then once every LET_IN_EVERY, one loop iteration later: the run
            # waits for it, so the loop's other ready tasks (runs let in by a semaphore as
            # others ended) get their turn and join the group. Otherwise a run of quick
            # steps (run inline, core._threads.call_sync) never yields its loop.
            now = self.loop.time()
            if isinstance(first, RunHead) and now - self.let_in < LET_IN_EVERY:
                self.flush()
                return fut
            self.let_in = now
            self.scheduled = True
            self.loop.call_soon(self.flush)
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
            _deliver(batch, turns(self.backend).write(items))
            return
        self.inflight = _writers.get(self.backend).submit(_write, self.backend, items)
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
            _deliver(batch, turns(self.backend).write([item for item, _ in batch]))


def _write(backend: Backend, items: list[Item]) -> list[Outcome]:
    return turns(backend).write(items)


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
