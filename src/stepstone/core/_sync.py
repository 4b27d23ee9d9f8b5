"""The sync bridge: every sync API is a thin layer over its async twin."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync"]

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
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(
        f"{sync_name} was called from inside a running event loop, where it would block "
        f"the loop; use `await {async_name}` instead"
    )
