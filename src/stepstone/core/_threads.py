"""Calling a blocking function from async code in a worker thread, as cheaply as possible."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["to_thread"]

R = TypeVar("R")


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
    loop = asyncio.get_running_loop()
    executor: Executor | None = getattr(loop, "_default_executor", None)
    if executor is None or getattr(loop, "_executor_shutdown_called", True):
        return await asyncio.to_thread(fn, *args, **kwargs)
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
    try:
        return await fut
    except asyncio.CancelledError:
        job.cancel()  # not started yet: it never runs (a running call runs to its end)
        raise


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
