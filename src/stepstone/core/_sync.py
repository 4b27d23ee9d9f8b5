"""The sync bridge: every sync API is a thin layer over its async twin.

A sync call (``agent("task")``, ``plan.run_many(...)``, ``graph.invoke(...)``, the Runner's
``run_sync``) runs its coroutine on a private event loop of the calling thread. Each thread
keeps that loop, and its default executor, for all its sync calls: ``asyncio.run`` would
build a loop and its self-pipe per call and join the executor's threads at the end, which
was about a quarter of a short durable run. Apart from that reuse, a call behaves as under
``asyncio.run``:

* it is refused inside a running loop (blocking it would deadlock);
* the coroutine runs in a copy of the caller's context;
* when the coroutine ends, the tasks it left pending are cancelled and awaited, its
  async generators closed and its executor jobs waited for, so the next call starts on an
  empty loop (an interrupted clean-up is finished at the start of the thread's next call);
* SIGINT on the main thread cancels the call and raises ``KeyboardInterrupt``;
* the loop comes from the event-loop policy in force (checked per call) and is the
  thread's current loop during the call only.

Only what :func:`keep_open` registers outlives a call: an SDK client and its open
connections, so that a thread's sync calls to one model share them as awaited calls in one
loop do. It is closed, on its loop, when the loop is closed, or at the end of the next call
after its owner was garbage-collected.

A thread's loop and executor are closed when the thread ends, the main thread's at
interpreter exit. A forked child never uses (or closes) a loop inherited from its parent,
nor the connections opened on it: the epoll instance, the self-pipe and the sockets are
shared with the parent, so even closing them the usual way would unregister the parent's
self-pipe (leaving its loop deaf to wake-ups from other threads) or shut its connections
down.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import os
import signal
import sys
import threading
import time
import weakref
from asyncio import selector_events
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = [
    "LoopResource",
    "call_inline",
    "cancel_point",
    "defer_cancellation",
    "keep_open",
    "may_block_loop",
    "run_sync",
    "with_idle_loop",
]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T], *, sync_name: str, async_name: str) -> T:
    """Run ``coro`` to completion on this thread's private event loop.

    A sync call made by sync code that a sync call runs inline on its private loop (a
    plain-function step calling an agent, see :func:`call_inline`) runs on a thread of its
    own, as it would had that code been sent to a worker thread.

    Raises:
        RuntimeError: when called from a thread whose event loop is running (blocking it
            would deadlock); the message names the async twin to await instead.
    """
    if _INLINE.get():  # (the loop it runs inline on may have been hidden from it)
        return _on_own_thread(coro, sync_name=sync_name, async_name=async_name)
    if asyncio._get_running_loop() is not None:
        coro.close()
        raise RuntimeError(
            f"{sync_name} was called from inside a running event loop, where it would block "
            f"the loop; use `await {async_name}` instead"
        )
    try:
        bridge = _thread_bridge()
    except BaseException:
        coro.close()
        raise
    return bridge.run(coro, sync_name)


#: True while sync code runs inline on a sync call's private loop (:func:`call_inline`).
_INLINE: ContextVar[bool] = ContextVar("stepstone_inline_sync", default=False)


def call_inline(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call the sync ``fn`` right on the running loop's thread, for callers that checked
    it starves nothing (:func:`may_block_loop`, or a function proven quick), as a worker
    thread would run it:

    * the running loop is hidden from ``fn`` while it runs, so ``asyncio.run(...)`` works
      in it and ``asyncio.get_running_loop()`` raises, as in a worker thread;
    * a sync call ``fn`` makes (a plain-function step calling an agent) runs on a thread of
      its own instead of being refused as a call from inside a running loop.
    """
    token = _INLINE.set(True)
    loop = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        return with_idle_loop(fn, *args, **kwargs)
    finally:
        asyncio._set_running_loop(loop)
        _INLINE.reset(token)


def with_idle_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call the sync ``fn`` with this thread's idle event loop as the current loop.

    A library's sync wrapper (``asyncio.get_event_loop().run_until_complete(coro)``,
    pydantic-ai's ``Agent.run_sync``) then finds a loop it can run, on the loop's thread
    (where the current loop is the running one, hidden by :func:`call_inline`) as in a
    worker thread (which has none). The thread's current loop is put back afterwards. The
    idle loop is made on the thread's first such call and kept for the next ones; it is
    closed when the thread ends (the main thread's at interpreter exit), or replaced when
    ``fn`` closed it or the event-loop policy changed.
    """
    idle: _Idle | None = getattr(_idle_local, "idle", None)
    if idle is None or idle.loop.is_closed() or _policy() is not idle.policy:
        idle = _new_idle(idle)
    loop = idle.loop
    if loop.is_running():  # a step inside a step that runs it: nothing to lend
        return fn(*args, **kwargs)
    local = idle.local
    if local is None:  # a policy of another kind: its public calls
        previous = _current_loop(idle.policy)
        idle.policy.set_event_loop(loop)
        try:
            return fn(*args, **kwargs)
        finally:
            idle.policy.set_event_loop(previous)
    # asyncio's policies keep the current loop in a thread-local record: swapping it there
    # makes the whole call cost ~1.3 us more than fn alone instead of ~3 us with
    # set_event_loop twice, and leaves the record exactly as it was (set_event_loop(None)
    # would also mark it set).
    previous = getattr(local, "_loop", None)
    local._loop = loop
    try:
        return fn(*args, **kwargs)
    finally:
        local._loop = previous


class _Idle:
    """A thread's idle event loop (:func:`with_idle_loop`), closed with its holder."""

    __slots__ = ("__weakref__", "finalizer", "local", "loop", "policy")

    def __init__(self) -> None:
        self.policy = _policy()
        self.loop = self.policy.new_event_loop()
        #: the policy's thread-local record of the current loop (asyncio's policies)
        self.local: Any = getattr(self.policy, "_local", None)
        if self.local is not None and not hasattr(self.local, "_loop"):
            self.local = None
        self.finalizer = weakref.finalize(self, _close_idle, self.loop, os.getpid())
        self.finalizer.atexit = threading.current_thread() is threading.main_thread()


_idle_local = threading.local()


def _new_idle(old: _Idle | None) -> _Idle:
    if old is not None:
        old.finalizer()  # closed by fn, or made by an earlier policy
    idle = _idle_local.idle = _Idle()
    return idle


def _current_loop(policy: asyncio.AbstractEventLoopPolicy) -> asyncio.AbstractEventLoop | None:
    """The thread's current loop under a policy that is not one of asyncio's own."""
    try:
        return policy.get_event_loop()
    except RuntimeError:
        return None


def _close_idle(loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """Close a thread's idle loop as its thread ends; a forked child's copy only lets go of
    its descriptors (see :func:`_forget`)."""
    if os.getpid() != pid:
        _forget(loop, _Kept())
    elif not loop.is_running() and not loop.is_closed():
        loop.close()


def _on_own_thread(coro: Coroutine[Any, Any, T], *, sync_name: str, async_name: str) -> T:
    """``run_sync(coro)`` on a new thread (with its own private loop, closed when it
    ends), in a copy of the caller's context; blocks until it is done."""
    context = contextvars.copy_context()
    outcome: list[Any] = []

    def call() -> T:
        _INLINE.set(False)  # async code the nested call runs is not inline sync code
        return run_sync(coro, sync_name=sync_name, async_name=async_name)

    def target() -> None:
        try:
            outcome.append((True, context.run(call)))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name=f"stepstone-nested {sync_name}")
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    result: T = value
    return result


class _Call:
    """One sync call: its live tasks (through the loop's task factory) and the async
    generators it started (through the thread's asyncgen hook).

    Counting tasks here lets ``may_block_loop`` answer in O(1): ``asyncio.all_tasks()``
    walks every task of the process and cost more than a whole step once ``run_many`` had
    hundreds of them. Each call has its own ``_Call``, so the done callbacks of a previous
    call's tasks (run late, on this loop) never touch this call's count.
    """

    __slots__ = ("agens", "loop_firstiter", "tasks")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.agens: weakref.WeakSet[AsyncGenerator[Any, Any]] | None = None
        self.loop_firstiter: Callable[[AsyncGenerator[Any, Any]], object] | None = None

    def factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def track_asyncgens(self) -> None:
        """Note every async generator first iterated from here on (on the running loop,
        whose ``run_forever`` restores its own hooks when it stops)."""
        firstiter, finalizer = sys.get_asyncgen_hooks()
        self.loop_firstiter = firstiter
        sys.set_asyncgen_hooks(firstiter=self._firstiter, finalizer=finalizer)

    def _firstiter(self, agen: AsyncGenerator[Any, Any]) -> None:
        if self.agens is None:
            self.agens = weakref.WeakSet()
        self.agens.add(agen)
        if self.loop_firstiter is not None:
            self.loop_firstiter(agen)

    def unfinished(self, executor: _Executor) -> bool:
        """Whether anything of the call is still running or open."""
        return (
            any(not task.done() for task in self.tasks)
            or bool(self.agens)
            or bool(executor.running)
        )


_PRIVATE_TASKS: ContextVar[_Call | None] = ContextVar("stepstone_private_tasks", default=None)


#: Tasks cancelled while a sync function of theirs ran in a worker thread, which waited
#: for it to return instead (:func:`stepstone.core._threads.call_sync`): the cancellation
#: takes effect at their next :func:`cancel_point`, once the engine committed that result.
_DEFERRED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def defer_cancellation() -> None:
    """Note that the current task caught a cancellation to keep a step's result: its next
    :func:`cancel_point` raises it."""
    task = asyncio.current_task()
    if task is not None:
        _DEFERRED.add(task)


async def cancel_point() -> None:
    """Let a cancellation requested while the current task ran without suspending take
    effect here. Called by the engines between two steps: a sync call's steps and commits
    may run inline on the loop's thread without one await that suspends, so a Ctrl-C (which
    cancels the call's task) would otherwise be seen only when the whole run returned. A
    cancellation held back while a step's thread finished (:func:`defer_cancellation`) is
    raised here. A task with no cancellation pending goes straight on (no trip through the
    loop)."""
    task = asyncio.current_task()
    if task is None:
        return
    if task in _DEFERRED:
        _DEFERRED.discard(task)
        raise asyncio.CancelledError()
    if task.cancelling():
        await asyncio.sleep(0)


def may_block_loop() -> bool:
    """Whether a blocking call on the running loop would starve nothing.

    True only on the private loop of a sync call (``agent("task")``) while the current task
    is its only task: then running a sync step function inline saves a thread round trip
    (~40 us) per step. Bands, ``run_many`` and any loop of the user's own (a web server...)
    have other tasks or are not private, so sync functions go to a worker thread there.
    """
    call = _PRIVATE_TASKS.get()
    return call is not None and len(call.tasks) <= 1


class _Executor(ThreadPoolExecutor):
    """The private loop's default executor, which knows its unfinished jobs, so a call can
    wait for the ones it started (``asyncio.run`` joined the executor's threads), and its
    threads, so that closing it can wait for them without ``Thread.join`` (:meth:`close`)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        super().__init__(
            thread_name_prefix="asyncio", initializer=_started, initargs=(self.threads,)
        )
        self.running: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future = super().submit(fn, *args, **kwargs)
        self.running.add(future)
        future.add_done_callback(self.running.discard)
        return future

    def close(self) -> None:
        """``shutdown(wait=True)``: stop the threads and wait until none is alive.

        A bridge is closed on its own thread as that thread's state is torn down, after
        ``threading`` forgot the thread, or on a thread started with ``_thread``.
        ``Thread.join`` calls ``threading.current_thread()``, which on such a thread
        registers a ``_DummyThread`` that is never removed: a dead thread named
        ``Dummy-N`` stayed in ``threading.enumerate()`` (before 3.13), or its removal
        failed at interpreter exit with "Exception ignored in _DeleteDummyThreadOnDel"
        on stderr (3.13). ``is_alive()`` asks nothing of the calling thread."""
        self.shutdown(wait=False)  # wakes the idle threads, which then exit
        for thread in self.threads:
            pause = 0.0001
            while thread.is_alive():
                time.sleep(pause)
                pause = min(pause * 2, 0.01)


def _started(threads: list[threading.Thread]) -> None:
    """An executor thread's first act: it tells its executor which thread it is."""
    threads.append(threading.current_thread())


#: How long closing what a loop kept open (SDK clients) may take before it is given up.
_CLOSE_TIMEOUT = 10.0


class LoopResource:
    """Something :func:`keep_open` keeps open on a thread's private loop."""

    __slots__ = ("_kept", "_watch", "aclose")

    def __init__(self, kept: _Kept, owner: object, aclose: Callable[[], Awaitable[object]]) -> None:
        self.aclose = aclose
        self._kept = kept
        self._watch = weakref.finalize(owner, kept.orphaned.append, self)
        self._watch.atexit = False

    def release(self) -> None:
        """Stop keeping it (its owner closed it itself)."""
        self._watch.detach()
        self._kept.live.pop(self, None)


class _Kept:
    """What a thread's private loop keeps open across its sync calls."""

    __slots__ = ("live", "orphaned")

    def __init__(self) -> None:
        self.live: dict[LoopResource, None] = {}
        #: kept resources whose owner was collected (appended from any thread)
        self.orphaned: list[LoopResource] = []

    def keep(self, owner: object, aclose: Callable[[], Awaitable[object]]) -> LoopResource:
        resource = LoopResource(self, owner, aclose)
        self.live[resource] = None
        return resource

    def abandon(self) -> None:
        """Forget every resource without closing it."""
        for resource in list(self.live):
            resource.release()
        self.orphaned.clear()

    async def close(self, *, everything: bool) -> None:
        """Close the resources whose owner was collected, or every one (the loop is being
        closed); an error is reported to the loop's exception handler."""
        chosen = list(self.live)
        if not everything:
            orphans = []
            while self.orphaned:  # one pop at a time: other threads may append meanwhile
                orphans.append(self.orphaned.pop())
            chosen = [r for r in orphans if r in self.live]
        for resource in chosen:
            resource.release()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                results = await asyncio.gather(
                    *(r.aclose() for r in chosen), return_exceptions=True
                )
        except TimeoutError:
            results = [TimeoutError(f"not closed within {_CLOSE_TIMEOUT} s")] * len(chosen)
        for result, resource in zip(results, chosen, strict=True):
            if isinstance(result, BaseException):
                _report(
                    loop,
                    {
                        "message": f"error closing {resource.aclose!r}, kept open across "
                        "sync calls",
                        "exception": result,
                    },
                )


def _report(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """``loop.call_exception_handler(context)`` (which logs it), from a thread that
    ``threading`` knows.

    A bridge is closed on its own thread as that thread ends, when ``threading`` has
    already let go of it: a log record made there asks ``threading.current_thread()`` for
    its thread's name, which registers a dummy thread that stays in
    ``threading.enumerate()`` for good (and on Python 3.13 fails to clean up at exit). Such
    a thread hands the record to a short-lived thread of its own and waits for it."""
    ident = threading.get_ident()
    if any(t.ident == ident for t in threading.enumerate()):
        loop.call_exception_handler(context)
        return
    done = _thread.allocate_lock()
    done.acquire()

    def report() -> None:
        try:
            loop.call_exception_handler(context)
        finally:
            done.release()

    try:  # daemon given: Thread() would otherwise ask current_thread() for it
        threading.Thread(target=report, name="stepstone-close-report", daemon=True).start()
    except RuntimeError:  # interpreter shutdown: no new threads, report it here
        loop.call_exception_handler(context)
        return
    done.acquire()  # not join(): that asks current_thread() too


def keep_open(owner: object, aclose: Callable[[], Awaitable[object]]) -> LoopResource | None:
    """Keep a resource (an SDK client and its connections) open across this thread's sync
    calls, when the running loop is a sync call's private loop.

    ``aclose`` is awaited on that loop when the loop is closed (when the thread ends; the
    main thread's at interpreter exit), or at the end of the thread's next sync call once
    ``owner`` has been garbage-collected (so ``aclose`` must not refer to ``owner``).
    :meth:`LoopResource.release` forgets it (its owner closed it itself). On any other loop
    this keeps nothing and returns None: the caller ties the resource to that loop's own
    shutdown (``asyncio.run`` closes async generators).
    """
    bridge: _Bridge | None = getattr(_local, "bridge", None)
    if bridge is None or asyncio._get_running_loop() is not bridge.loop:
        return None
    return bridge.kept.keep(owner, aclose)


async def _main(coro: Coroutine[Any, Any, T], call: _Call) -> T:
    _PRIVATE_TASKS.set(call)
    call.track_asyncgens()
    return await coro


# Python 3.14 deprecates asyncio.get_event_loop_policy() and reads the policy with this.
_policy: Callable[[], asyncio.AbstractEventLoopPolicy] = getattr(
    asyncio.events, "_get_event_loop_policy", asyncio.get_event_loop_policy
)

# The C module under ``signal``: ``signal.signal`` and ``getsignal`` map every handler to
# an enum member, failing (and formatting the handler's repr) for a callable, which cost
# ~14 us per main-thread call, half of a trivial one.
_signals: Any = getattr(signal, "_signal", signal)
_SIGINT = int(signal.SIGINT)


class _Interrupt:
    """A main-thread call's SIGINT handler, as under ``asyncio.run``: the first Ctrl-C
    cancels the call (which then raises ``KeyboardInterrupt``), a second one raises
    ``KeyboardInterrupt`` wherever the thread is."""

    __slots__ = ("count", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop = loop
        self.task = task
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1 and not self.task.done():
            self.task.cancel()
            self.loop.call_soon_threadsafe(_wake_up)  # select() may wait long otherwise
            return
        raise KeyboardInterrupt()


def _wake_up() -> None:
    pass


class _Bridge:
    """One thread's private event loop and its default executor."""

    def __init__(self) -> None:
        self.policy = _policy()
        self.loop = self.policy.new_event_loop()
        self.executor = _Executor()
        self.loop.set_default_executor(self.executor)
        #: a call whose clean-up was interrupted (KeyboardInterrupt), finished first next time
        self.unfinished: _Call | None = None
        #: the clean-up tasks: one interrupted stays pending, and must not cancel the next
        self.cleaners: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.kept = _Kept()
        main = threading.current_thread() is threading.main_thread()
        self.finalizer = weakref.finalize(
            self,
            _close,
            self.loop,
            self.executor,
            self.kept,
            os.getpid(),
            threading.get_ident(),
        )
        self.finalizer.atexit = main

    def usable(self) -> bool:
        """False once the loop was closed or its executor shut down (by code that got hold
        of them), or the event-loop policy changed: the next call then takes a new loop."""
        loop = self.loop
        return (
            not loop.is_closed()
            and not getattr(loop, "_executor_shutdown_called", False)
            and _policy() is self.policy
        )

    def run(self, coro: Coroutine[Any, Any, T], sync_name: str) -> T:
        loop = self.loop
        if self.unfinished is not None:
            try:
                self._finish(self.unfinished, sync_name)
            except BaseException:
                coro.close()
                raise
        call = _Call()
        loop.set_task_factory(call.factory)
        asyncio.set_event_loop(loop)
        try:
            return self._run_main(_main(coro, call))
        finally:
            try:
                if call.unfinished(self.executor):
                    self.unfinished = call
                    self._finish(call, sync_name)
                if self.kept.orphaned:
                    loop.run_until_complete(self.kept.close(everything=False))
            finally:
                _drop_callbacks(loop)
                asyncio.set_event_loop(None)

    def _run_main(self, coro: Coroutine[Any, Any, T]) -> T:
        """``asyncio.Runner.run``: the coroutine in a copy of the caller's context, SIGINT
        turned into a cancellation on the main thread."""
        loop = self.loop
        task = loop.create_task(coro, context=contextvars.copy_context())
        interrupt: _Interrupt | None = None
        if (
            threading.current_thread() is threading.main_thread()
            and _signals.getsignal(_SIGINT) is signal.default_int_handler
        ):
            interrupt = _Interrupt(loop, task)
            try:
                _signals.signal(_SIGINT, interrupt)
            except ValueError:  # an embedded interpreter without signals
                interrupt = None
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupt is not None and interrupt.count > 0 and task.uncancel() == 0:
                raise KeyboardInterrupt() from None
            raise
        finally:
            if interrupt is not None and _signals.getsignal(_SIGINT) is interrupt:
                _signals.signal(_SIGINT, signal.default_int_handler)

    def _finish(self, call: _Call, sync_name: str) -> None:
        cleaner = self.loop.create_task(self._clean_up(call, sync_name))
        self.cleaners.add(cleaner)  # before any task runs: an older cleaner must spare it
        self.loop.run_until_complete(cleaner)
        self.unfinished = None

    async def _clean_up(self, call: _Call, sync_name: str) -> None:
        """What ``asyncio.run`` does after its coroutine: cancel and await the tasks left
        pending, close the async generators, wait for the executor's jobs."""
        loop = asyncio.get_running_loop()
        call.track_asyncgens()
        while tasks := [t for t in call.tasks if t not in self.cleaners and not t.done()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is not None:
                    loop.call_exception_handler(
                        {
                            "message": f"unhandled exception in a task left running by {sync_name}",
                            "exception": task.exception(),
                            "task": task,
                        }
                    )
        while call.agens:
            agens = list(call.agens)
            call.agens.clear()
            results = await asyncio.gather(*(a.aclose() for a in agens), return_exceptions=True)
            for result, agen in zip(results, agens, strict=True):
                if isinstance(result, Exception):
                    loop.call_exception_handler(
                        {
                            "message": "an error occurred during closing of asynchronous "
                            f"generator {agen!r}",
                            "exception": result,
                            "asyncgen": agen,
                        }
                    )
        while self.executor.running:
            await asyncio.wait([asyncio.wrap_future(f) for f in list(self.executor.running)])


def _drop_callbacks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the timers (``loop.call_later``) and remove the signal handlers
    (``loop.add_signal_handler``) a call left: closing the loop dropped them under
    ``asyncio.run``; kept, they would fire during a later call. (The standard loops list
    them in private attributes; loops of other kinds keep theirs.)"""
    timers: Any = getattr(loop, "_scheduled", None)
    if timers:
        for timer in timers:
            timer.cancel()
    signals: Any = getattr(loop, "_signal_handlers", None)
    if signals:
        for signum in list(signals):
            loop.remove_signal_handler(signum)


_local = threading.local()


def _thread_bridge() -> _Bridge:
    bridge: _Bridge | None = getattr(_local, "bridge", None)
    if bridge is not None and bridge.usable():
        return bridge
    if bridge is not None:  # the policy changed, or someone closed the loop
        _local.bridge = None
        bridge.finalizer()
    bridge = _local.bridge = _Bridge()
    return bridge


def _close(
    loop: asyncio.AbstractEventLoop, executor: _Executor, kept: _Kept, pid: int, ident: int
) -> None:
    """Close a bridge's loop, what it kept open, and its executor: when its thread ends
    (the thread-local holding it is dropped, on that thread as its state is torn down), at
    interpreter exit (the main thread's), or when it is replaced.

    Every call left the loop empty; only what it kept open needs the loop run. Collected on
    another thread (by the garbage collector, when a reference cycle held the bridge), which
    may be running a loop of its own, the closing runs on a new thread instead."""
    if os.getpid() != pid:
        _forget(loop, kept)
        return
    if loop.is_running():  # a daemon thread still inside a call at interpreter exit
        return
    if kept.live and (threading.get_ident() != ident or asyncio._get_running_loop() is not None):
        try:  # the low-level call: threading's locks may be held where the collector ran
            _thread.start_new_thread(_shut, (loop, executor, kept))
            return
        except RuntimeError:  # interpreter shutdown: the kept resources are dropped
            pass
    _shut(loop, executor, kept)


def _shut(loop: asyncio.AbstractEventLoop, executor: _Executor, kept: _Kept) -> None:
    """Close what the loop kept (when the loop can run here), its executor, the loop."""
    try:
        if kept.live and not loop.is_closed() and asyncio._get_running_loop() is None:
            loop.run_until_complete(kept.close(everything=True))
    finally:
        kept.abandon()
        executor.close()
        loop.close()


_inherited: list[tuple[asyncio.AbstractEventLoop, list[LoopResource]]] = []


def _forget(loop: asyncio.AbstractEventLoop, kept: _Kept) -> None:
    """Release a forked child's copy of its parent's loop, and of the connections kept open
    on it, without touching the parent's.

    The epoll instance, the self-pipe and the sockets are shared with the parent:
    ``loop.close()`` would unregister the self-pipe from that epoll instance, for the parent
    too, and closing an SDK client would shut its connections down. Closing this process's
    descriptors only leaves the parent's registrations and connections alone. A loop of
    another kind is kept referenced with what it kept, so that collecting them closes
    nothing.
    """
    if not loop.is_closed() and isinstance(loop, selector_events.BaseSelectorEventLoop):
        parts: Any = loop
        for transport in list(parts._transports.values()):
            sock = getattr(transport, "_sock", None)
            if sock is not None:  # this process's descriptor only: no shutdown, no FIN
                transport._sock = None
                os.close(sock.detach())
        parts._selector.close()  # the epoll descriptor: closing it unregisters nothing
        parts._ssock.close()
        parts._csock.close()
        parts._closed = True  # so that collecting the loop does not close it again
    elif not loop.is_closed():
        _inherited.append((loop, list(kept.live)))
    kept.abandon()


def _after_fork_in_child() -> None:
    bridge: _Bridge | None = getattr(_local, "bridge", None)
    if bridge is not None:
        _local.bridge = None
        bridge.finalizer()  # the pid differs: forgets the loop, never closes it
    idle: _Idle | None = getattr(_idle_local, "idle", None)
    if idle is not None:
        _idle_local.idle = None
        idle.finalizer()  # the same


os.register_at_fork(after_in_child=_after_fork_in_child)
