"""The sync bridge: every sync API is a thin layer over its async twin."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["may_block_loop", "run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T], *, sync_name: str, async_name: str) -> T:
    """Run ``coro`` to completion on a fresh event loop.

    Raises:
        RuntimeError: when called from a thread whose event loop is running (blocking it
            would deadlock); the message names the async twin to await instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_on_private_loop(coro))
    coro.close()
    raise RuntimeError(
        f"{sync_name} was called from inside a running event loop, where it would block "
        f"the loop; use `await {async_name}` instead"
    )


class _TaskCount:
    """Counts the live tasks of a private loop (its task factory), so that
    ``may_block_loop`` answers in O(1): ``asyncio.all_tasks()`` walks every task of the
    process and cost more than a whole step once ``run_many`` had hundreds of them."""

    def __init__(self) -> None:
        self.live = 1  # the task running the sync call's coroutine

    def factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        self.live += 1
        task.add_done_callback(self._done)
        return task

    def _done(self, _task: asyncio.Task[Any]) -> None:
        self.live -= 1


_PRIVATE_TASKS: ContextVar[_TaskCount | None] = ContextVar("stepstone_private_tasks", default=None)


async def _on_private_loop(coro: Coroutine[Any, Any, T]) -> T:
    count = _TaskCount()
    asyncio.get_running_loop().set_task_factory(count.factory)
    _PRIVATE_TASKS.set(count)
    return await coro


def may_block_loop() -> bool:
    """Whether a blocking call on the running loop would starve nothing.

    True only on the private loop of a sync call (``agent("task")``) while the current task
    is its only task: then running a sync step function inline saves a thread round trip
    (~40 us) per step. Bands, ``run_many`` and any loop of the user's own (a web server...)
    have other tasks or are not private, so sync functions go to a worker thread there.
    """
    count = _PRIVATE_TASKS.get()
    return count is not None and count.live <= 1
