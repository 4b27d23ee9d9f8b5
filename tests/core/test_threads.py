"""``core._threads.to_thread``: the cheaper hop to a worker thread behaves as
``asyncio.to_thread`` does (same executor, context, outcome and cancellation).
``call_sync``: the loop's thread for functions proven quick; a cancellation while a
worker thread runs the function waits for its outcome (guarantee 347)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from stepstone import Envelope
from stepstone.core._sync import cancel_point
from stepstone.core._threads import STALL, call_sync, is_awaitable, to_thread

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_threads_var", default="unset")


def _where(x: int, *, y: int = 0) -> tuple[str, str, int]:
    return threading.current_thread().name, _var.get(), x + y


async def test_result_thread_and_context_are_those_of_asyncio_to_thread() -> None:
    _var.set("caller")
    loop_thread = threading.current_thread().name
    first = await to_thread(_where, 1, y=2)  # the loop has no default executor yet
    again = await to_thread(_where, 3)  # now it has one: the direct way back
    reference = await asyncio.to_thread(_where, 3)
    for name, value, _ in (first, again, reference):
        assert name != loop_thread
        assert value == "caller"
    assert first[2] == 3 and again[2] == 3 == reference[2]


async def test_the_loops_own_default_executor_runs_the_call() -> None:
    loop = asyncio.get_running_loop()
    mine = ThreadPoolExecutor(1, thread_name_prefix="my-default")
    loop.set_default_executor(mine)
    try:
        name, _, _ = await to_thread(_where, 0)
        assert name.startswith("my-default")
    finally:
        mine.shutdown(wait=True)


async def test_changes_to_context_variables_in_the_thread_stay_there() -> None:
    _var.set("caller")

    def change() -> str:
        _var.set("thread")
        return _var.get()

    await to_thread(_where, 0)  # the fast path
    assert await to_thread(change) == "thread"
    assert _var.get() == "caller"


async def test_exceptions_come_back_as_raised() -> None:
    def boom() -> None:
        raise KeyError("missing")

    await to_thread(_where, 0)
    with pytest.raises(KeyError, match="missing"):
        await to_thread(boom)


@pytest.mark.parametrize("hop", [to_thread, call_sync])
async def test_a_call_cancelled_before_a_thread_took_it_never_runs(hop: Any) -> None:
    """Also through call_sync, which otherwise waits for a cancelled call (guarantee 347):
    one no thread had started is dropped at once."""
    loop = asyncio.get_running_loop()
    single = ThreadPoolExecutor(1)
    loop.set_default_executor(single)
    gate = threading.Event()
    ran: list[str] = []
    try:
        busy = asyncio.ensure_future(to_thread(gate.wait, 30))  # occupies the only thread
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(hop(ran.append, "queued"))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, 1)  # at once, not after the busy thread
        gate.set()
        assert await busy is True
        await to_thread(time.sleep, 0)  # the queue is drained past the cancelled call
        assert ran == []
    finally:
        gate.set()
        single.shutdown(wait=True)


# -- call_sync: worker thread, or the loop's thread for functions proven quick -------------
def _until_on_loop_thread(fn: Any, calls: int = 200) -> list[bool]:
    """Call ``fn`` through call_sync from a loop shared with another task until a call runs
    on the loop's thread; per call, whether it did."""

    async def main() -> list[bool]:
        other = asyncio.ensure_future(asyncio.sleep(30))  # the loop is shared
        loop_thread = threading.get_ident()
        seen: list[bool] = []
        try:
            for _ in range(calls):
                seen.append(await call_sync(fn) == loop_thread)
                if seen[-1]:
                    break
        finally:
            other.cancel()
        return seen

    return asyncio.run(main())


def test_a_quick_sync_function_moves_to_the_loops_thread_after_three_quick_calls() -> None:
    """guarantee 341: on a loop shared with other tasks, a sync function runs in worker
    threads until its last three calls each returned within QUICK_CALL; then on the loop's
    thread. A callable that cannot be weakly referenced always runs in a worker thread."""

    def quick() -> int:
        return threading.get_ident()

    seen = _until_on_loop_thread(quick)
    assert seen[-1] and len(seen) >= 4 and not any(seen[:3])

    class Slotted:  # a callable no record can be kept of: always in a worker thread
        __slots__ = ()

        def __call__(self) -> int:
            return threading.get_ident()

    assert _until_on_loop_thread(Slotted(), calls=20) == [False] * 20


def test_a_slow_call_on_the_loops_thread_sends_the_next_calls_to_worker_threads() -> None:
    """guarantee 342: a call on the loop's thread that takes longer than QUICK_CALL sends
    the next call back to a worker thread; one longer than STALL keeps the function in
    worker threads for good, however quick its later calls."""
    slow = threading.Event()

    def sometimes_slow() -> int:
        if slow.is_set():
            time.sleep(STALL * 3)
        return threading.get_ident()

    assert _until_on_loop_thread(sometimes_slow)[-1]

    async def after_a_stall() -> list[bool]:
        other = asyncio.ensure_future(asyncio.sleep(30))
        loop_thread = threading.get_ident()
        try:
            slow.set()
            await call_sync(sometimes_slow)  # on the loop's thread: it stalls the loop
            slow.clear()
            return [await call_sync(sometimes_slow) == loop_thread for _ in range(30)]
        finally:
            other.cancel()

    assert asyncio.run(after_a_stall()) == [False] * 30


def test_a_call_on_the_loops_thread_keeps_its_context_changes_and_may_call_sync() -> None:
    """guarantee 343: a sync function run on the loop's thread runs in a copy of the
    caller's context, as in a worker thread (its changes to context variables stay there),
    and a sync call it makes (an agent called synchronously) runs and returns."""
    from stepstone import Agent, Plan, Step

    nested = Agent(engine=Plan(Step(lambda p: f"nested {p}", name="inner")))
    call_agent = threading.Event()

    def step() -> tuple[int, str]:
        _var.set("changed")
        answer = nested("x").payload if call_agent.is_set() else ""
        return threading.get_ident(), answer

    async def main() -> tuple[bool, str, str]:
        other = asyncio.ensure_future(asyncio.sleep(30))
        _var.set("caller")
        loop_thread = threading.get_ident()
        try:
            for _ in range(200):
                ident, _ = await call_sync(step)
                if ident == loop_thread:
                    break
            else:
                pytest.fail("a quick function never ran on the loop's thread")
            assert _var.get() == "caller"
            call_agent.set()
            ident, answer = await call_sync(step)
            return ident == loop_thread, answer, _var.get()
        finally:
            other.cancel()

    on_loop, answer, value = asyncio.run(main())
    assert on_loop and answer == "nested x" and value == "caller"


def test_a_function_on_the_loops_thread_sees_no_running_loop() -> None:
    """guarantee 344: a quick function run on the loop's thread may call asyncio.run, as in
    a worker thread; the loop is running again once it returns."""
    use_asyncio_run = threading.Event()

    async def answer() -> str:
        await asyncio.sleep(0)
        return "answered"

    def step() -> tuple[int, str]:
        said = asyncio.run(answer()) if use_asyncio_run.is_set() else ""
        return threading.get_ident(), said

    async def main() -> tuple[bool, str, bool]:
        other = asyncio.ensure_future(asyncio.sleep(30))
        loop_thread = threading.get_ident()
        try:
            for _ in range(200):
                if (await call_sync(step))[0] == loop_thread:
                    break
            else:
                pytest.fail("a quick function never ran on the loop's thread")
            use_asyncio_run.set()
            ident, said = await call_sync(step)
            return ident == loop_thread, said, asyncio.get_running_loop() is not None
        finally:
            other.cancel()

    assert asyncio.run(main()) == (True, "answered", True)


# -- call_sync and cancellation: a running call's outcome is kept (guarantee 347) --------
def _slow(started: threading.Event, release: threading.Event, ran: list[str]) -> str:
    started.set()
    release.wait(30)
    ran.append("finished")
    return "result"


async def _cancelled_while_running(
    release_after: float, second_cancel: bool = False
) -> tuple[list[str], list[str]]:
    """Cancel a task while its call_sync runs in a worker thread; what the task saw
    (the call's result, then its cancel_point) and what the thread did."""
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []
    seen: list[str] = []

    async def step() -> None:
        seen.append(await call_sync(_slow, started, release, ran))
        try:
            await cancel_point()
        except asyncio.CancelledError:
            seen.append("cancelled at the cancel point")
            raise

    task = asyncio.ensure_future(step())
    while not started.is_set():  # polled: a hop to a thread would make a default executor
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done() or second_cancel  # still waiting for the thread
    if second_cancel:
        task.cancel()
        await asyncio.sleep(0.05)
    threading.Timer(release_after, release.set).start()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(release.wait, 30)
    await asyncio.sleep(0.05)  # the thread has appended by now
    return seen, ran


async def test_a_cancelled_call_sync_returns_what_its_running_thread_returned() -> None:
    seen, ran = await _cancelled_while_running(0.1)
    assert ran == ["finished"]
    assert seen == ["result", "cancelled at the cancel point"]


async def test_a_second_cancellation_stops_waiting_for_the_thread() -> None:
    seen, ran = await _cancelled_while_running(0.1, second_cancel=True)
    assert seen == []  # the task ended at the second cancellation
    assert ran == ["finished"]  # the thread ran to its end all the same


def test_a_cancelled_call_sync_waits_on_a_loop_without_a_default_executor() -> None:
    async def main() -> tuple[list[str], list[str]]:
        assert getattr(asyncio.get_running_loop(), "_default_executor", None) is None
        return await _cancelled_while_running(0.1)

    loop = asyncio.new_event_loop()  # its default executor is made by the first hop
    try:
        seen, ran = loop.run_until_complete(main())
    finally:
        loop.close()
    assert ran == ["finished"]
    assert seen == ["result", "cancelled at the cancel point"]


def test_is_awaitable_answers_as_inspect_does() -> None:
    # The engines' check of a sync function's result: at once for the usual types, the
    # same answer as inspect.isawaitable for every value.
    async def coro() -> None:
        pass

    class Awaits:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield

    started = coro()
    loop = asyncio.new_event_loop()
    try:
        values = [
            "x",
            {},
            [],
            1,
            1.5,
            True,
            None,
            Envelope(task="t"),
            (1,),
            b"b",
            started,
            Awaits(),
            loop.create_future(),
            object(),
        ]
        for value in values:
            assert is_awaitable(value) == inspect.isawaitable(value), value
        assert is_awaitable(started) and is_awaitable(Awaits())
    finally:
        started.close()
        loop.close()
