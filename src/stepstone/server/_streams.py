"""Server-Sent Events of a run's stream: one reader of the store per stream, however many
clients follow it.

A :class:`StreamHub` follows the stream ``name`` of the run under ``key`` with the kernel's
:class:`~stepstone.durable.StreamReader` (woken by the store's change feed) from the lowest
offset a client asked for, keeps what it read, and wakes every client; a client that asks
for an offset below the hub's start reads that part from the store itself first. Each event
carries its offset as its id, so a client that reconnects with ``Last-Event-ID`` resumes
after it; the last event (``end``) says how the run ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from stepstone.core._threads import to_thread
from stepstone.durable._messages import RunOutcome, StreamItem, StreamReader, stream_items
from stepstone.store import Store

__all__ = ["StreamHub", "StreamHubs"]

_BATCH = 500


class StreamHub:
    """One stream followed for every client of this process."""

    def __init__(self, store: Store, key: str, name: str, start: int) -> None:
        self.store = store
        self.key = key
        self.name = name
        self.base = start
        self.items: list[StreamItem] = []
        self.outcome: RunOutcome | None = None
        self.failed: BaseException | None = None
        self.clients = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        reader = StreamReader(self.store, self.key, self.name, self.base)
        try:
            async for item in reader:
                self.items.append(item)
                async with self._changed:
                    self._changed.notify_all()
            self.outcome = reader.outcome
        except Exception as exc:  # noqa: BLE001 - handed to every client as the stream's end
            self.failed = exc
        async with self._changed:
            self._changed.notify_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def follow(self, start: int) -> AsyncIterator[StreamItem | RunOutcome]:
        """Every item from offset ``start`` on, then the run's outcome."""
        offset = start
        while offset < self.base:  # older than what the hub holds: from the store
            older = await to_thread(
                stream_items,
                self.store,
                self.key,
                self.name,
                offset,
                min(_BATCH, self.base - offset),
            )
            if not older:
                break
            for item in older:
                if item.offset >= self.base:
                    break
                yield item
                offset = item.offset + 1
        offset = max(offset, self.base)
        while True:
            index = offset - self.base
            while index < len(self.items):
                item = self.items[index]
                yield item
                offset = item.offset + 1
                index = offset - self.base
            if self.failed is not None:
                raise self.failed
            if self.outcome is not None:
                yield self.outcome
                return
            async with self._changed:
                caught_up = offset - self.base >= len(self.items)
                if caught_up and self.outcome is None and self.failed is None:
                    await self._changed.wait()


class StreamHubs:
    """The hubs of this process, one per (run, stream), dropped with their last client."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._hubs: dict[tuple[str, str], StreamHub] = {}

    async def follow(self, key: str, name: str, start: int) -> AsyncIterator[Any]:
        hub = self._hubs.get((key, name))
        if hub is None or (hub.outcome is not None and start < hub.base):
            hub = StreamHub(self.store, key, name, start)
            self._hubs[(key, name)] = hub
            hub.start()
        hub.clients += 1
        try:
            async for item in hub.follow(start):
                yield item
        finally:
            hub.clients -= 1
            if hub.clients == 0 and self._hubs.get((key, name)) is hub:
                del self._hubs[(key, name)]
                await hub.stop()

    async def close(self) -> None:
        hubs = list(self._hubs.values())
        self._hubs.clear()
        for hub in hubs:
            await hub.stop()


def item_data(item: StreamItem) -> str:
    """An item's value as the event's data (JSON)."""
    return json.dumps(item.value, default=str, ensure_ascii=False)


def outcome_data(outcome: RunOutcome) -> str:
    """The ``end`` event's data: how the run ended (``paused`` for a queued agent run that
    stopped for approvals: its entry ends failed with a ``RunPaused`` error, and an
    approval queues it again)."""
    status = outcome.status
    if status == "failed" and (outcome.error or "").startswith("RunPaused:"):
        status = "paused"
    return json.dumps({"status": status, "error": outcome.error}, ensure_ascii=False)
