"""Server-Sent Events of a run's changes: one watcher of the store per run, however many
pages follow it.

A :class:`WatchHub` follows :func:`~stepstone.durable._watch.watch_run` for one run and
keeps its latest state; every client gets that state at once, then each new one. The
inspector's run page reloads the run's view on each event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from stepstone.durable._watch import watch_run
from stepstone.store import Store

__all__ = ["WatchHub", "WatchHubs"]


class WatchHub:
    """One run watched for every client of this process."""

    def __init__(self, store: Store, key: str, every: float) -> None:
        self.store = store
        self.key = key
        self.every = every
        self.state: dict[str, Any] | None = None
        self.version = 0
        self.over = False
        self.failed: BaseException | None = None
        self.clients = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        try:
            async for state in watch_run(self.store, self.key, every=self.every):
                self.state = state
                self.version += 1
                async with self._changed:
                    self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - handed to every client as the end
            self.failed = exc
        self.over = True
        async with self._changed:
            self._changed.notify_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """The run's state now, then each time it changes, until the key holds nothing."""
        seen = 0
        while True:
            if self.version > seen and self.state is not None:
                seen = self.version
                yield self.state
                continue
            if self.failed is not None:
                raise self.failed
            if self.over:
                return
            async with self._changed:
                if self.version == seen and not self.over:
                    await self._changed.wait()


class WatchHubs:
    """The hubs of this process, one per run, dropped with their last client."""

    def __init__(self, store: Store, every: float) -> None:
        self.store = store
        self.every = every
        self._hubs: dict[str, WatchHub] = {}

    async def follow(self, key: str) -> AsyncIterator[dict[str, Any]]:
        hub = self._hubs.get(key)
        if hub is None or hub.over:
            hub = WatchHub(self.store, key, self.every)
            self._hubs[key] = hub
            hub.start()
        hub.clients += 1
        try:
            async for state in hub.follow():
                yield state
        finally:
            hub.clients -= 1
            if hub.clients == 0 and self._hubs.get(key) is hub:
                del self._hubs[key]
                await hub.stop()

    async def close(self) -> None:
        hubs = list(self._hubs.values())
        self._hubs.clear()
        for hub in hubs:
            await hub.stop()
