"""Workers: processes that take queued runs from a store's work queue and run them.

Start any number of them, on any number of hosts (PostgreSQL) or in several processes of
one machine (SQLite)::

    stepstone worker --url postgresql://app@db/app --queue etl --concurrency 8

or in Python, ``Worker(store, queues=["etl"]).run()``. Each run is executed under the
kernel's ownership and leases like any durable run, so every step is committed before the
next one starts. A worker holds a lease on each queue entry it runs and renews it from a
thread; when a worker dies, its entries' leases run out (at once, for a worker on the same
host whose process is gone) and another worker takes them over, resuming each run at its
first uncommitted step. ``SIGTERM`` (or ``SIGINT``) stops a worker gracefully: it takes no
more runs, lets the running ones finish for up to ``shutdown_timeout`` seconds, then stops
the rest at their current step and hands them back to the queue. The runs execute on an event
loop of the worker's own, in a thread of its own, watched from the caller's: a shutdown
whose store stopped answering (a database outage, a file another process keeps locked) gives
up on the runs it still holds after a few seconds, saying which, instead of waiting out the
store's retries; their leases run out and other workers take them over.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from stepstone.core import Envelope
from stepstone.core._ids import host_id, new_uid, process_alive, process_start_time
from stepstone.core._threads import to_thread
from stepstone.durable._leases import LeasePolicy
from stepstone.durable._queue import (
    check_int,
    check_name,
    check_number,
    queue_backend,
    resolve_target,
)
from stepstone.durable._records import run_head
from stepstone.durable._schedules import fire_due
from stepstone.durable._waiting import Parking, parked_by, watch_queues
from stepstone.exceptions import (
    ConcurrentRunError,
    ConfigurationError,
    ConfigurationTypeError,
    CorruptRecordError,
    RunParked,
    StoreDamagedError,
    StoreError,
    UserError,
)
from stepstone.store import Store
from stepstone.store._changes import Subscription
from stepstone.store._queue_base import CANCELLED_RUNNING, NEVER, Owner, QueueEntry

__all__ = ["Worker"]

log = logging.getLogger("stepstone")
T = TypeVar("T")


class Worker:
    """Takes runs from the work queue in ``store`` and runs them, ``concurrency`` at a time.

    Args:
        store: The store the runs were submitted to (a ``Store``, or its URL).
        queues: The queues to serve, taken from in turn.
        concurrency: Most runs this worker runs at once.
        lease_seconds: How long a taken run stays this worker's without renewal (judged by
            the database's clock; a finite number > 0). A worker renews every third of it
            (the kernel's ``LeasePolicy``); a run whose worker stopped renewing this long is
            taken over by another worker.
        poll_interval: Seconds between looks at an empty queue (a finite number > 0).
        registry: Engines by name, looked up before importing a target.
        shutdown_timeout: On SIGTERM/SIGINT or :meth:`stop`, how long running runs may
            finish before they are stopped at their current step and handed back (a
            finite number >= 0).
        name: This worker's id in the queue (default: a fresh one).
        park_after: A run that waits (a durable sleep, a receive) longer than this many
            seconds gives its slot back: its queue entry comes back at its wake time, or
            when a message it waits for arrives (a finite number >= 0). A receive waits this
            long in the worker first; a cancel reaches a waiting run at once.

    Attributes:
        completed: How many runs this worker finished.
        parked: How many times a waiting run gave this worker's slot back.
        abandoned: None, unless a shutdown gave up on a store that stopped answering: then
            the ids of the queued runs it could not hand back (perhaps none, when all it
            left was a store call of its own). Their leases run out and other workers take
            them over.

    Raises:
        UserError: an argument it cannot work with, naming it (a ``ConfigurationError``
            for a value of the wrong kind or range), or a store it cannot write to.

    Example::

        worker = Worker(Store(url="postgresql://app@db/app"), queues=["etl"], concurrency=8)
        worker.run()   # until SIGTERM
    """

    def __init__(
        self,
        store: Store | str,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        poll_interval: float = 0.5,
        registry: dict[str, Any] | None = None,
        shutdown_timeout: float = 30.0,
        name: str | None = None,
        park_after: float = 5.0,
    ) -> None:
        if isinstance(queues, str):
            queues = [queues]
        if not isinstance(queues, Collection) or not queues:
            raise ConfigurationError(
                f"queues must be a list of queue names, e.g. queues=['orders'], got {queues!r}"
            )
        names = [check_name("a name in queues", q) for q in queues]
        check_int("concurrency", concurrency, 1)
        lease = LeasePolicy(lease_seconds)
        poll = check_number("poll_interval", poll_interval, 0, above=True)
        shutdown = check_number("shutdown_timeout", shutdown_timeout, 0)
        self.park_after = check_number("park_after", park_after, 0)
        if registry is not None and not isinstance(registry, Mapping):
            raise ConfigurationTypeError(
                f"registry must map targets to engines, e.g. registry={{'orders:plan': plan}}, "
                f"got {registry!r:.80}"
            )
        if name is not None:
            check_name("name", name)
        self.store = store if isinstance(store, Store) else Store(url=store)
        if self.store.read_only or self.store.closed:
            why = "opened read_only=True" if self.store.read_only else "closed"
            raise UserError(
                f"a worker records its runs in its store, and {self.store!r} is {why}: pass "
                "an open, writable Store"
            )
        self.queues = names
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll
        self.registry = dict(registry or {})
        self.shutdown_timeout = shutdown
        self.id = name or f"worker-{new_uid()[:12]}"
        self.owner = Owner(
            worker=self.id,
            host=host_id(),
            pid=os.getpid(),
            pid_start=process_start_time(os.getpid()),
        )
        self.completed = 0
        self.parked = 0
        self.abandoned: list[str] | None = None
        self._ended = 0
        self._queue = queue_backend(self.store)
        self._stopping = threading.Event()
        self._stop_at: float | None = None  # time.monotonic() of the first stop request
        self._renewing = threading.Event()  # set: the lease thread stops
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # entry id -> run key, of the runs this worker holds (for the lease thread, and for
        # a shutdown that has to say which runs it leaves behind)
        self._held: dict[str, str] = {}
        self._held_lock = threading.Lock()
        # a claim sent before a stop that had not answered yet (what it took is handed back)
        self._late_claim: asyncio.Future[list[QueueEntry]] | None = None
        self._cancel_reason: dict[str, str] = {}
        # entry id -> how many times in a row the store failed under that run (backoff)
        self._store_failures: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # where the runs execute
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None  # on self._loop, set by stop()
        # the caller's loop (run()/arun()) and its event set by stop()
        self._watch: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    @property
    def lease_seconds(self) -> float:
        """How long a taken run stays this worker's without renewal."""
        return self.lease.seconds

    def __repr__(self) -> str:
        return f"Worker({self.id!r}, queues={self.queues!r}, store={self.store!r})"

    # -- control -------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop gracefully (thread- and signal-safe): take no more runs, let the running
        ones finish for up to ``shutdown_timeout`` seconds, hand back the rest."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stopping.set()
        watch = self._watch or (None, None)
        for loop, event in ((self._loop, self._wake), (self._loop, self._stopped), watch):
            if loop is not None and event is not None:
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(event.set)

    def run(self, *, max_runs: int | None = None, until_idle: bool = False) -> int:
        """Serve the queues until stopped (SIGTERM/SIGINT, :meth:`stop`), ``max_runs``
        runs were taken, or (``until_idle``) nothing is left to take. Returns how many
        runs this worker finished.

        A claim the store cannot serve (the database away, a damaged file) is retried, less
        often each time (up to every 30 s), logging each failure; with ``until_idle``, a
        damaged file the worker can take nothing from ends the run with its
        StoreDamagedError once no run of its own is left (waiting will not mend it). A
        database not up yet when the worker starts is waited for the same way, except with
        ``until_idle``, where its error ends the run at once.

        A stop does not wait for the store: once the runs had ``shutdown_timeout`` seconds,
        a store that has not answered for :data:`STORE_PATIENCE` seconds is given up on.
        The runs not handed back are logged and listed in :attr:`abandoned`; store calls
        still waiting in the worker's threads end when the store gives up on them."""
        return asyncio.run(self.arun(max_runs=max_runs, until_idle=until_idle))

    async def arun(self, *, max_runs: int | None = None, until_idle: bool = False) -> int:
        """Async :meth:`run`; installs SIGTERM/SIGINT handlers when on the main thread.

        The runs execute on an event loop of the worker's own, in a thread of its own: a
        store call that blocks that loop (a commit waiting for another process's lock)
        holds up neither the caller's loop nor the shutdown. Cancelling ``arun`` stops the
        worker as :meth:`stop` does, waits for that, and re-raises the cancellation."""
        if max_runs is not None:
            check_int("max_runs", max_runs, 1)
        caller = asyncio.get_running_loop()
        stopped = asyncio.Event()
        if self._stopping.is_set():
            stopped.set()
        self._watch = (caller, stopped)
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    caller.add_signal_handler(sig, self.stop)
                    installed.append(sig)
        served: asyncio.Future[int] = caller.create_future()
        served.add_done_callback(_retrieve)  # (its error is raised below, unless cancelled)
        serving = threading.Thread(
            target=self._serve_in_thread,
            args=(caller, served, contextvars.copy_context(), max_runs, until_idle),
            name=f"{self.id}-runs",
            daemon=True,  # one a shutdown gave up on must not hold up the interpreter's exit
        )
        serving.start()
        try:
            return await self._watch_over(served, stopped)
        finally:
            self._watch = None
            for sig in installed:
                caller.remove_signal_handler(sig)

    async def _watch_over(self, served: asyncio.Future[int], stopped: asyncio.Event) -> int:
        """What the serving thread returns (or raises), once it ended; on a stop, bounded
        by :meth:`_shut_down`."""
        told: asyncio.Future[Any] = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait([served, told], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.stop()
            await self._shut_down(served)
            raise
        finally:
            told.cancel()
        if not served.done() and not await self._shut_down(served):
            return self.completed
        return served.result()

    async def _shut_down(self, served: asyncio.Future[int]) -> bool:
        """Wait for the serving thread to end after a stop: for ``shutdown_timeout``
        seconds in any case (the runs' grace), then as long as the store answers (a sync
        step still running in a thread is waited for and committed, guarantee 347). Once it
        has not answered for :data:`STORE_PATIENCE` seconds, give up on the runs still
        held (:meth:`_abandon`) and return False: waiting out the store's own retries
        (``reconnect_timeout``, ``busy_timeout``) would only delay their takeover."""
        assert self._stop_at is not None
        grace = self._stop_at + self.shutdown_timeout - time.monotonic()
        await asyncio.wait({served}, timeout=max(grace, 0.0))
        answered, why = time.monotonic(), "no answer"
        probe: asyncio.Future[str | None] | None = None
        while not served.done():
            left = answered + STORE_PATIENCE - time.monotonic()
            if left <= 0:
                self._abandon(why)
                return False
            if probe is None:
                probe = _in_daemon_thread(self._probe)
            both: list[asyncio.Future[Any]] = [served, probe]
            await asyncio.wait(both, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if probe.done():
                found, probe = probe.result(), None
                if found is None:
                    answered = time.monotonic()
                else:
                    why = found
                await asyncio.wait({served}, timeout=_PROBE_EVERY)
        return True

    def _probe(self) -> str | None:
        """One look at whether the store answers (no retries): None, or why not."""
        try:
            return self._queue.probe(_PROBE_EVERY * 2)
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
            return f"{type(exc).__name__}: {exc}"

    def _abandon(self, why: str) -> None:
        """Give up on the runs still held: say which, stop renewing their leases (so they
        run out and other workers take the runs over) and leave them to the serving
        thread, which hands them back if the store answers again before this process
        ends."""
        self._renewing.set()
        with self._held_lock:
            held = dict(self._held)
        self.abandoned = sorted(held)
        runs = ", ".join(f"{entry_id} (key {key!r})" for entry_id, key in sorted(held.items()))
        said = [
            f"stepstone: {self.id} stopped "
            + (
                f"without handing back queued runs {runs}"
                if held
                else "with a store call unfinished"
            )
            + f": its store {self.store.describe()} has not answered for {STORE_PATIENCE:g} s "
            f"({' '.join(why.split())})."
        ]
        if held:
            said.append(
                "What they committed is kept: other workers take them over when their leases "
                f"run out (lease_seconds={self.lease.seconds:g}, judged by the database's clock) "
                "and resume each at its first uncommitted step."
            )
        if self._late_claim is not None and not self._late_claim.done():
            said.append(
                "A claim it had sent got no answer: runs it took, if any, are taken over the "
                "same way."
            )
        log.error("%s", " ".join(said))

    def _serve_in_thread(
        self,
        caller: asyncio.AbstractEventLoop,
        served: asyncio.Future[int],
        context: contextvars.Context,
        max_runs: int | None,
        until_idle: bool,
    ) -> None:
        """The serving thread: :meth:`_serve` on a loop of its own, then that loop's
        clean-up (as ``asyncio.run`` does it: the tasks left are cancelled and awaited, the
        executor's threads joined); its outcome goes to ``served`` once all that is done."""
        outcome: tuple[bool, Any]
        try:
            with asyncio.Runner() as runner:
                try:
                    outcome = (True, runner.run(self._serve(max_runs, until_idle), context=context))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    outcome = (False, exc)
        except BaseException as exc:  # noqa: BLE001 - the loop's clean-up failed
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone
            caller.call_soon_threadsafe(_settle, served, outcome)

    async def _serve(self, max_runs: int | None, until_idle: bool) -> int:
        """Take and run queued runs until stopped, ``max_runs`` taken, or idle."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        if self._stopping.is_set():
            self._stopped.set()
        self._renewing.clear()
        renewer = threading.Thread(target=self._renew_loop, name=f"{self.id}-leases", daemon=True)
        renewer.start()
        # A parked run made runnable by a message wakes the worker at once (PostgreSQL's
        # NOTIFY, or a send in this process), not at its next poll.
        told = watch_queues(self.store, self.queues)
        relay = asyncio.create_task(self._relay(told))
        try:
            await self._first_sweep(until_idle)
            await self._serve_loop(max_runs, until_idle)
            await self._drain()
        finally:
            relay.cancel()
            told.close()
            self._stopping.set()
            self._renewing.set()
            renewer.join(timeout=5)
        return self.completed

    async def _first_sweep(self, until_idle: bool) -> None:
        """Expire dead workers' leases before the first claim; a store that does not
        answer yet is retried by the loop (a batch run, or a damaged store, raises)."""
        try:
            await self._store_call(self._expire_dead)
        except StoreError as exc:  # the database not up yet: the loop retries it
            if isinstance(exc, StoreDamagedError) or until_idle:
                raise  # (a batch run reports it: it would end at once anyway)
            log.warning("stepstone: %s cannot reach its store yet: %s", self.id, exc)

    async def _serve_loop(self, max_runs: int | None, until_idle: bool) -> None:
        """Claim runs into the free slots, or wait, until stopped, ``max_runs`` taken and
        finished, or (``until_idle``) nothing left to take."""
        now = asyncio.get_running_loop().time()
        pace = _Pace(taken=0, backoff=self.poll_interval, sweep_at=now + 1.0, schedules_at=now)
        while not self._stopping.is_set():
            await self._housekeeping(pace)
            if max_runs is not None and pace.taken >= max_runs:
                if not self._tasks:
                    break
                await self._idle_wait()
                continue
            if not await self._take_or_wait(pace, max_runs, until_idle):
                break

    async def _housekeeping(self, pace: _Pace) -> None:
        """Expire dead workers' leases every second; fire the schedules that are due."""
        loop = asyncio.get_running_loop()
        if loop.time() >= pace.sweep_at:
            with contextlib.suppress(StoreError):  # an outage: the next sweep retries
                await self._store_call(self._expire_dead)
            pace.sweep_at = loop.time() + 1.0
        if loop.time() >= pace.schedules_at:
            with contextlib.suppress(StoreError):  # an outage: the next look retries
                await self._store_call(self._fire_schedules)
            pace.schedules_at = loop.time() + SCHEDULES_EVERY

    async def _take_or_wait(self, pace: _Pace, max_runs: int | None, until_idle: bool) -> bool:
        """One pass of the loop: claim runs for the free slots and start them, or wait
        for a slot, a wake-up or the next poll. False when serving is over."""
        ended = self._ended
        free = self.concurrency - len(self._tasks)
        if max_runs is not None:
            free = min(free, max_runs - pace.taken)
        if free > 0:
            try:
                entries = await self._claim_unless_stopped(free)
            except StoreError as exc:
                if self._claim_error_ends_batch(exc, until_idle):
                    raise
                # The database stayed away longer than the store's reconnect timeout (or a
                # damaged file refused the claim): keep the worker (and its running runs)
                # alive and retry, less often each time.
                log.warning("stepstone: %s could not take a run: %s", self.id, exc)
                await self._idle_wait(pace.backoff)
                pace.backoff = min(pace.backoff * 2, _MAX_BACKOFF)
                return True
            if entries is None:
                return False
            pace.backoff = self.poll_interval
            if entries:
                pace.taken += len(entries)
                self._start_runs(entries)
                return True
        if until_idle and not self._tasks and ended == self._ended:
            return False  # nothing to take, and no run ended meanwhile (freeing a slot)
        await self._idle_wait()
        return True

    async def _claim_unless_stopped(self, free: int) -> list[QueueEntry] | None:
        """Up to ``free`` claimed entries; None when the worker was told to stop while the
        claim was out (``_drain`` hands back what it takes)."""
        claim = asyncio.ensure_future(self._claim_next(free))
        if not await self._before_stop(claim):
            self._late_claim = claim  # _drain hands back what it takes
            return None
        return claim.result()

    def _claim_error_ends_batch(self, exc: StoreError, until_idle: bool) -> bool:
        """A damaged store ends a batch run (``until_idle``) that has nothing running."""
        return isinstance(exc, StoreDamagedError) and until_idle and not self._tasks

    def _start_runs(self, entries: list[QueueEntry]) -> None:
        with self._held_lock:
            self._held.update((e.id, e.run_key) for e in entries)
        for entry in entries:
            self._tasks[entry.id] = asyncio.create_task(self._execute(entry))

    async def _relay(self, told: Subscription) -> None:
        """Wake the serving loop when one of its queues has a run made runnable."""
        while True:
            if await told.await_change(3600.0) and self._wake is not None:
                self._wake.set()

    async def _store_call(self, fn: Callable[[], None]) -> None:
        """``fn()``, a call on the queue, in a thread; not waited for once the worker is
        told to stop (it goes on in its thread; its error, if any, is dropped)."""
        call = asyncio.ensure_future(to_thread(fn))
        if await self._before_stop(call):
            call.result()
        else:
            call.add_done_callback(_retrieve)

    async def _before_stop(self, call: asyncio.Future[Any]) -> bool:
        """Wait for ``call`` unless the worker is told to stop first; whether it ended. A
        stopping worker does not wait for its store (a call may retry through an outage)."""
        assert self._stopped is not None
        if not call.done() and not self._stopping.is_set():
            told = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait({call, told}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                told.cancel()
        return call.done()

    async def _idle_wait(self, seconds: float | None = None) -> None:
        """Wait ``seconds`` (the poll interval by default), or until woken."""
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds or self.poll_interval)

    async def _drain(self) -> None:
        """Let running runs finish until ``shutdown_timeout`` seconds after the stop, then
        stop the rest at their current step (their checkpoints record where) and hand them
        back; hand back what a claim still out at the stop takes, untouched."""
        waits: list[asyncio.Future[Any]] = list(self._tasks.values())
        if self._late_claim is not None:
            waits.append(asyncio.ensure_future(self._hand_back_claimed(self._late_claim)))
        if not waits:
            return
        since = time.monotonic() if self._stop_at is None else self._stop_at
        grace = max(0.0, since + self.shutdown_timeout - time.monotonic())
        _, pending = await asyncio.wait(waits, timeout=grace)
        for entry_id, task in list(self._tasks.items()):
            if task in pending:
                self._cancel_reason[entry_id] = "shutdown"
                task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _hand_back_claimed(self, claim: asyncio.Future[list[QueueEntry]]) -> None:
        """A claim sent before the stop, answered after it: hand back what it took."""
        try:
            entries = await claim
        except StoreError:
            return  # it took nothing (a claim whose answer was lost looked itself up)
        with self._held_lock:
            self._held.update((e.id, e.run_key) for e in entries)
        for entry in entries:
            if await self._hand_back(entry.id, 0.0):
                with self._held_lock:
                    self._held.pop(entry.id, None)
        self._late_claim = None

    async def _hand_back(self, entry_id: str, delay: float) -> bool:
        """Put a run this worker holds back in its queue, runnable after ``delay``
        seconds; False (logged) when the store failed: its lease runs out instead."""
        try:
            await to_thread(self._queue.hand_back, entry_id, self.id, delay)
        except StoreError as exc:
            log.warning(
                "stepstone: could not hand queued run %s back (%s); it is taken over when "
                "its lease runs out",
                entry_id,
                exc,
            )
            return False
        return True

    async def _claim_next(self, limit: int) -> list[QueueEntry]:
        """Up to ``limit`` runs in one transaction, from the first queue (in turn) that
        has any."""
        with self._held_lock:
            held = frozenset(self._held)
        for _ in range(len(self.queues)):
            queue = self.queues[0]
            self.queues.append(self.queues.pop(0))  # serve the queues in turn
            entries = await self._queue.aclaim(queue, self.owner, self.lease.seconds, limit, held)
            if entries:
                return entries
        return []

    def _fire_schedules(self) -> None:
        """Queue the runs of the due ticks of the schedules of this worker's queues (any
        number of workers may do it at once: each tick queues one run)."""
        queued = fire_due(self._queue, self.queues)
        if queued:
            log.info("stepstone: %s queued %d scheduled run(s)", self.id, queued)

    def _expire_dead(self) -> None:
        """End the leases of entries held by dead worker processes on this host, so they
        are taken over now rather than when their leases run out."""
        for entry in self._queue.running_on(self.owner.host):
            if entry.worker == self.id or entry.pid is None:
                continue
            dead = entry.worker is not None and not process_alive(entry.pid, entry.pid_start)
            if dead and entry.worker is not None and self._queue.expire(entry.id, entry.worker):
                log.warning(
                    "stepstone: worker %s (pid %s) died holding queued run %s; taking it over",
                    entry.worker,
                    entry.pid,
                    entry.id,
                )

    # -- leases --------------------------------------------------------------------------
    def _renew_loop(self) -> None:
        # A thread, not a loop task: a step that blocks the event loop must not let the
        # leases of this worker's runs run out. It renews for as long as the worker serves,
        # through a shutdown's grace too (the runs finishing then keep their leases), until
        # a shutdown gives up on its store (the leases are then left to run out).
        while not self._renewing.wait(self.lease.renew_every):
            self._renew_once()

    def _renew_once(self) -> None:
        with self._held_lock:
            ids = sorted(self._held)
        if not ids:
            return
        try:
            held = self._queue.renew(ids, self.id, self.lease.seconds)
        except Exception:  # a database outage: the next round retries
            log.warning("stepstone: renewing queue leases failed", exc_info=True)
            return
        for entry_id in ids:
            if entry_id not in held:
                self._cancel_from_thread(entry_id, "lost")
            elif held[entry_id]:
                self._cancel_from_thread(entry_id, "cancel")

    def _cancel_from_thread(self, entry_id: str, reason: str) -> None:
        loop = self._loop
        if loop is None:
            return

        def cancel() -> None:
            task = self._tasks.get(entry_id)
            if task is not None and not task.done() and entry_id not in self._cancel_reason:
                self._cancel_reason[entry_id] = reason
                task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(cancel)

    # -- one run -------------------------------------------------------------------------
    async def _execute(self, entry: QueueEntry) -> None:
        try:
            await self._execute_inner(entry)
        finally:
            self._tasks.pop(entry.id, None)
            self._ended += 1
            with self._held_lock:
                self._held.pop(entry.id, None)
            self._cancel_reason.pop(entry.id, None)
            if self._wake is not None:
                self._wake.set()

    async def _execute_inner(self, entry: QueueEntry) -> None:
        run: Callable[[Envelope[Any]], Awaitable[Envelope[Any]]] | None = None
        parked_by(Parking(self.park_after, functools.partial(self._check_cancel, entry.id)))
        try:
            run = await self._engine(entry)
            env = Envelope.from_dict(json.loads(entry.task))
            out = await run(env)
        except RunParked as parked:
            await self._park(entry, parked)
            return
        except asyncio.CancelledError:
            reason = self._cancel_reason.get(entry.id, "shutdown")
            if reason == "cancel":
                # A cancel that reached the run inside its last step lets that step commit,
                # which ends the run done: its entry says so, with the stored result (a
                # resume of a done run runs nothing and gives it).
                # (run is None: cancelled while its module was imported, before it started)
                head = await to_thread(run_head, self.store, entry.run_key)
                if run is None or head is None or head.status != "done":
                    await self._finish(entry, "cancelled", None, CANCELLED_RUNNING)
                    return
                out = await run(env)
            elif reason == "shutdown":  # or cancelled, if its cancel was requested meanwhile
                await self._hand_back(entry.id, 0.0)
                return
            else:
                return  # "lost": another worker holds it now; nothing of ours to record
        except ConcurrentRunError as exc:
            # The run's previous owner still holds the checkpoint (its lease, judged on the
            # host that wrote it, has not run out yet): try again a bit later.
            log.info("stepstone: queued run %s is still owned elsewhere (%s)", entry.id, exc)
            await self._hand_back(entry.id, LeasePolicy.of(self.store).retry_after)
            return
        except Exception as exc:  # noqa: BLE001 - recorded on the entry, the worker lives on
            if _store_failed(exc):
                await self._hand_back_later(entry, exc)
                return
            self._store_failures.pop(entry.id, None)
            log.warning("stepstone: queued run %s failed: %s", entry.id, exc)
            await self._finish(entry, "failed", None, f"{type(exc).__name__}: {exc}")
            return
        try:
            text = json.dumps(out.to_dict(where=f"result of queued run {entry.id}"))
        except Exception as exc:  # noqa: BLE001 - the run finished; its envelope cannot be kept
            error = f"the final envelope cannot be stored ({type(exc).__name__}: {exc})"
            await self._finish(entry, "failed", None, error)
            return
        self._store_failures.pop(entry.id, None)
        await self._finish(entry, "done" if out.ok else "failed", text, _error_text(out))
        self.completed += 1

    async def _park(self, entry: QueueEntry, parked: RunParked) -> None:
        """The run waits longer than :attr:`park_after`: put its entry back, runnable at
        its wake time or when a message on its topics comes (a cancel requested meanwhile
        ends it cancelled); False from the store (logged): its lease runs out instead."""
        wake = NEVER if parked.wake_at is None else parked.wake_at
        try:
            held = await to_thread(
                self._queue.park, entry.id, self.id, entry.run_key, wake, parked.topics
            )
        except StoreError as exc:
            log.warning(
                "stepstone: could not park queued run %s (%s); it is taken over when its "
                "lease runs out, and waits again",
                entry.id,
                exc,
            )
            return
        if held:
            self.parked += 1
            log.debug("stepstone: %s parked queued run %s: %s", self.id, entry.id, parked)

    def _check_cancel(self, entry_id: str) -> None:
        """A waiting run's look at its cancel (from a thread): stop the run now when one
        was requested, as a lease renewal that finds it would."""
        found = self._queue.get(entry_id)
        if found is not None and found.cancel_requested:
            self._cancel_from_thread(entry_id, "cancel")

    async def _hand_back_later(self, entry: QueueEntry, exc: Exception) -> None:
        """The store failed under the run (``_store_failed``). What it committed is kept:
        hand it back, to resume once the store works again (a full disk freed, a database
        back after its restart). Each try runs the uncommitted step again, so the tries
        back off, up to ``_STORE_BACKOFF_MAX`` apart."""
        failures = self._store_failures.get(entry.id, 0)
        self._store_failures[entry.id] = failures + 1
        delay = min(_STORE_BACKOFF_MAX, LeasePolicy.of(self.store).retry_after * 2**failures)
        log.warning(
            "stepstone: queued run %s stopped because the store failed (%s); handed back, "
            "to be resumed in %.0f s",
            entry.id,
            exc,
            delay,
        )
        await self._hand_back(entry.id, delay)

    async def _finish(
        self, entry: QueueEntry, status: str, result: str | None, error: str | None
    ) -> None:
        try:
            held = await self._queue.afinish(entry.id, self.id, status, result, error)
        except StoreError as exc:
            log.warning(
                "stepstone: could not record that queued run %s ended %s (%s); it is taken "
                "over when its lease runs out, and its checkpoint tells the next worker "
                "where it stopped",
                entry.id,
                status,
                exc,
            )
            return
        if not held:
            log.warning(
                "stepstone: queued run %s was no longer held by worker %s when it ended %s "
                "(its lease ran out and another worker took it over)",
                entry.id,
                self.id,
                status,
            )

    async def _engine(
        self, entry: QueueEntry
    ) -> Callable[[Envelope[Any]], Awaitable[Envelope[Any]]]:
        """How to run the entry's target durably under the entry's checkpoint key,
        resuming where an earlier attempt stopped."""
        from stepstone._worker_targets import queued_run  # imports the graph engine

        return queued_run(await self._resolve(entry.target), self.store, entry)

    async def _resolve(self, target: str) -> Any:
        """The object ``target`` names, imported on the thread that called :meth:`run`
        (for ``stepstone worker``, the main thread), not on the runs' own thread: a module
        may install signal handlers when imported, which only the main thread can do."""
        caller = self._watch[0] if self._watch is not None else None
        imported = target.partition(":")[0] in sys.modules  # nothing left to import
        if caller is None or imported or target in self.registry:
            return resolve_target(target, self.registry)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def resolve() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(resolve_target(target, self.registry))
                except BaseException as exc:  # noqa: BLE001 - raised on the runs' loop
                    done.set_exception(exc)

        try:
            caller.call_soon_threadsafe(resolve)
        except RuntimeError:  # the caller's loop is gone (a shutdown gave up on us)
            return resolve_target(target, self.registry)
        return await asyncio.wrap_future(done)


#: Seconds between a worker's looks at the schedules of its queues.
SCHEDULES_EVERY = 1.0
#: The longest wait before a run the store failed under is tried again (seconds).
_STORE_BACKOFF_MAX = 60.0
#: The longest wait between two claims the store could not serve (seconds).
_MAX_BACKOFF = 30.0
#: After a stop and the runs' ``shutdown_timeout``, how long a worker waits for a store
#: that does not answer before it gives up on the runs it still holds (seconds).
STORE_PATIENCE = 5.0
#: Seconds between two looks at whether the store answers, during a shutdown.
_PROBE_EVERY = 0.5


@dataclasses.dataclass
class _Pace:
    """The serving loop's counters: runs taken, the wait after a failed claim, and when
    the next lease sweep and schedule look are due (event loop time)."""

    taken: int
    backoff: float
    sweep_at: float
    schedules_at: float


def _in_daemon_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """``fn()`` in a daemon thread of its own (a look at a store that may hang must not
    hold up the interpreter's exit), as a future of the running loop."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        outcome: tuple[bool, Any]
        try:
            outcome = (True, fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting loop
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(_settle, fut, outcome)

    threading.Thread(target=work, name="stepstone-store-probe", daemon=True).start()
    return fut


def _settle(fut: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if fut.done():
        return
    ok, value = outcome
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Take the outcome of a call nobody waits for any more, so asyncio does not report
    its error as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def _store_failed(exc: BaseException) -> bool:
    """Whether a run stopped because the store failed under it (a full disk, a database
    unreachable for longer than the store retries) rather than because of its records: a
    damaged file or a record that cannot be decoded will not get better by waiting."""
    return isinstance(exc, StoreError) and not isinstance(
        exc, (CorruptRecordError, StoreDamagedError)
    )


def _error_text(env: Envelope[Any]) -> str | None:
    if env.error is None:
        return None
    return f"{env.error.type}: {env.error.message}"
