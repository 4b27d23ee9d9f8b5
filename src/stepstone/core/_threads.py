"""Calling a blocking function from async code: in a worker thread, as cheaply as
possible, or right on the loop's thread when that starves nothing (:func:`call_sync`)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from stepstone.core._envelope import Envelope
from stepstone.core._sync import call_inline, defer_cancellation, may_block_loop, with_idle_loop

__all__ = ["QUICK_CALL", "STALL", "call_sync", "is_awaitable", "to_thread"]

R = TypeVar("R")

#: Result types a sync function returns most, which are never awaitable.
_PLAIN = frozenset({str, dict, list, int, float, bool, type(None), Envelope})


def is_awaitable(value: Any) -> bool:
    """``inspect.isawaitable(value)``, answered at once for the usual results of a sync
    step, node or tool function: the ABC check it ends with cost a Plan step several
    microseconds, measured."""
    return type(value) not in _PLAIN and inspect.isawaitable(value)


async def to_thread(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``await asyncio.to_thread(fn, *args, **kwargs)``, with a cheaper way back.

    The same thing runs in the same place: ``fn`` in the running loop's default executor
    (the one ``asyncio.to_thread`` uses, so a loop's own executor and its shutdown are
    respected), inside a copy of the caller's context variables; its result or exception
    comes back to the caller, and a call cancelled before a thread picked it up never
    runs. Only the way back differs: the thread hands the outcome straight to an asyncio
    future with one ``call_soon_threadsafe``, instead of completing a
    ``concurrent.futures.Future`` that ``asyncio.wrap_future`` chains to one (two futures,
    their locks and callbacks: that chain cost about as much as the thread switch itself,
    on every sync step of a concurrent run). Loops without a default executor of their own
    yet (or not asyncio's own loops) go through ``asyncio.to_thread``.
    """
    return await _in_thread(fn, args, kwargs, to_the_end=False)


async def _in_thread(fn: Callable[..., R], args: Any, kwargs: Any, *, to_the_end: bool) -> R:
    """:func:`to_thread`; with ``to_the_end``, a cancellation that arrives once a thread
    runs ``fn`` waits for ``fn`` to return and hands back its outcome all the same (the
    thread cannot be stopped, and dropping what it did would make a resume do it again):
    the task's next :func:`cancel_point` raises the cancellation. A second cancellation
    while it waits stops the waiting."""
    loop = asyncio.get_running_loop()
    executor: Executor | None = getattr(loop, "_default_executor", None)
    if executor is None or getattr(loop, "_executor_shutdown_called", True):
        if not to_the_end:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await _to_the_end(asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs)))
    fut: asyncio.Future[R] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)

    def work() -> None:
        try:
            result = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, as to_thread does
            _hand_back(loop, fut, False, exc)
        else:
            _hand_back(loop, fut, True, result)

    job = executor.submit(work)
    if to_the_end:
        return await _to_the_end(fut, job)
    try:
        return await fut
    except asyncio.CancelledError:
        job.cancel()  # not started yet: it never runs (a running call runs to its end)
        raise


async def _to_the_end(fut: asyncio.Future[R], job: Future[None] | None = None) -> R:
    """``await fut``, which a thread settles; a cancellation meanwhile drops the call if no
    thread has started ``job`` yet, else waits for its outcome (see :func:`_in_thread`)."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if job is not None and job.cancel():
            fut.cancel()  # never started: it never runs
            raise
        defer_cancellation()
        return await fut


def _hand_back(
    loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], ok: bool, value: Any
) -> None:
    try:
        loop.call_soon_threadsafe(_settle, fut, ok, value)
    except RuntimeError:
        pass  # the loop was closed meanwhile: nobody is waiting any more


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


#: A sync function whose calls return within this many seconds costs less than the hop to
#: a worker thread and back (70-120 us of CPU, about as much in latency).
QUICK_CALL = 100e-6
#: Quick calls in a row, in worker threads, before a function runs on the loop's thread.
_STREAK = 3
#: A call on the loop's thread that took longer than this held up every other task of the
#: loop: that function never runs there again (in this process).
STALL = 2e-3


class _Pace:
    """What is known of one sync function's calls (updated without a lock: a lost update
    only delays or repeats a decision)."""

    __slots__ = ("quick", "stalled")

    def __init__(self) -> None:
        self.quick = 0  # calls in a row that returned within QUICK_CALL
        self.stalled = False

    def note(self, seconds: float) -> None:
        self.quick = self.quick + 1 if seconds <= QUICK_CALL else 0


_paces: weakref.WeakKeyDictionary[Any, _Pace] = weakref.WeakKeyDictionary()


def _pace(fn: Any) -> _Pace | None:
    """``fn``'s record, or None for a callable that cannot be weakly referenced (an instance
    of a class with ``__slots__`` and no ``__weakref__``: it always goes to a worker
    thread)."""
    try:
        pace = _paces.get(fn)
        if pace is None:
            pace = _paces[fn] = _Pace()
    except TypeError:
        return None
    return pace


def _timed(pace: _Pace, fn: Callable[..., R], args: Any, kwargs: Any) -> R:
    start = time.perf_counter()
    try:
        return with_idle_loop(fn, *args, **kwargs)
    finally:
        pace.note(time.perf_counter() - start)


async def call_sync(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Call the sync function ``fn`` from async code (a Plan step's or a graph node's).

    * When nothing else can run on the loop meanwhile (:func:`may_block_loop`: a sync
      call's private loop with one task), on the loop's thread, as is.
    * Otherwise in a worker thread (:func:`to_thread`), so other tasks run on, until ``fn``
      has returned within :data:`QUICK_CALL` on each of its last three calls: then on the
      loop's thread, in a copy of the caller's context (as in a worker thread), because
      handing it to a thread would cost more than it does. A call there that takes longer
      sends the next ones back to worker threads (until it proves quick again); one that
      takes longer than :data:`STALL` keeps ``fn`` in worker threads for good.

    A cancellation of the calling task while ``fn`` runs in a worker thread waits for
    ``fn`` to return and returns its result (or raises its exception), so the engine
    commits the step; the engine's next :func:`~stepstone.core._sync.cancel_point` raises
    the cancellation. A call that no thread had started yet is dropped at once.

    On the loop's thread, :func:`call_inline` runs ``fn`` as a worker thread would: with no
    running loop in sight (``asyncio.run`` works in it), and a sync call it makes itself (a
    step calling ``agent(task)``) runs.
    """
    if may_block_loop():
        return call_inline(fn, *args, **kwargs)
    pace = _pace(fn)
    if pace is None:
        return await _in_thread(with_idle_loop, (fn, *args), kwargs, to_the_end=True)
    if pace.quick < _STREAK or pace.stalled:
        return await _in_thread(_timed, (pace, fn, args, kwargs), {}, to_the_end=True)
    start = time.perf_counter()
    try:
        return contextvars.copy_context().run(call_inline, fn, *args, **kwargs)
    finally:
        took = time.perf_counter() - start
        pace.note(took)
        if took > STALL:
            pace.stalled = True
