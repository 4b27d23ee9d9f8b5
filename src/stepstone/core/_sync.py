"""The sync bridge: every sync API is a thin layer over its async twin."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["may_block_loop", "run_sync"]

T = TypeVar("T")

_PRIVATE_LOOP: ContextVar[bool] = ContextVar("stepstone_private_loop", default=False)


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


async def _on_private_loop(coro: Coroutine[Any, Any, T]) -> T:
    _PRIVATE_LOOP.set(True)
    return await coro


def may_block_loop() -> bool:
    """Whether a blocking call on the running loop would starve nothing.

    True only on the private loop of a sync call (``agent("task")``) while the current task
    is its only task: then running a sync step function inline saves a thread round trip
    (~40 us) per step. Bands, ``run_many`` and any loop of the user's own (a web server...)
    have other tasks or are not private, so sync functions go to a worker thread there.
    """
    return _PRIVATE_LOOP.get() and len(asyncio.all_tasks()) <= 1
