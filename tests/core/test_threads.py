"""``core._threads.to_thread``: the cheaper hop to a worker thread behaves as
``asyncio.to_thread`` does (same executor, context, outcome and cancellation)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from stepstone.core._threads import to_thread

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


async def test_a_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    loop = asyncio.get_running_loop()
    single = ThreadPoolExecutor(1)
    loop.set_default_executor(single)
    gate = threading.Event()
    ran: list[str] = []
    try:
        busy = asyncio.ensure_future(to_thread(gate.wait, 30))  # occupies the only thread
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(to_thread(ran.append, "queued"))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.set()
        assert await busy is True
        await to_thread(time.sleep, 0)  # the queue is drained past the cancelled call
        assert ran == []
    finally:
        gate.set()
        single.shutdown(wait=True)
