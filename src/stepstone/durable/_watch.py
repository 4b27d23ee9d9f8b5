"""Watching one run from outside: its state each time something about it changes (a
commit, its queue entry, a message, an event, a stream value, a timer). The inspector's
run page follows this to refresh itself while the run goes on. Only reads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from stepstone.core._threads import to_thread
from stepstone.durable._queue import existing_queue
from stepstone.store._changes import run_topic
from stepstone.store._store import Store

__all__ = ["record_key", "run_state", "watch_run"]


def record_key(store: Store, key: str) -> str:
    """The key of the run's record: ``key``, or the record of a queued agent run named
    by its run id, or the latest invocation of a queued graph run (the worker notes its
    invocations under the entry's key: ``{"graph_invocations": [ids]}``)."""
    backend = store.backend
    if backend.run_get(key) is not None:
        return key
    agent = f"agent:{key}:checkpoint:latest"
    if backend.run_get(agent) is not None:
        return agent
    try:
        noted = json.loads(backend.kv_get(key) or "null")
    except ValueError:
        return key
    ids = noted.get("graph_invocations") if isinstance(noted, dict) else None
    if not isinstance(ids, list) or not ids:
        return key
    last = str(ids[-1])
    if backend.run_get(f"graph:{last}") is not None:  # the default prefix
        return f"graph:{last}"
    for head in backend.run_list(None):  # a graph with a prefix of its own
        if head.kind == "graph" and head.key.endswith(last):
            return head.key
    return key


def run_state(store: Store, key: str) -> dict[str, Any] | None:
    """What changes when anything about the run under ``key`` changes, JSON-ready: its
    head's ``status``, ``version``, ``steps`` (journal rows) and ``updated_at``; its queue
    entry's ``entry_status`` and ``attempts``; how many ``messages`` it was sent (and
    ``consumed``), ``events`` it set, ``timers`` it holds and values each stream holds
    (``streams``). None when the key holds neither a run nor a queue entry."""
    backend = store.backend
    record = record_key(store, key)
    head = backend.run_get(record)
    queue = existing_queue(store)
    entry = queue.latest_entry(key) if queue is not None else None
    if head is None and entry is None:
        return None
    messages = backend.messages(record)
    events = backend.events(record)
    return {
        "key": key,
        "status": None if head is None else head.status,
        "version": None if head is None else head.version,
        "steps": None if head is None else head.journal_len,
        "updated_at": None if head is None else head.updated_at,
        "cancel_requested": None if head is None else bool(head.meta.get("cancel_requested")),
        "entry_status": None if entry is None else entry.status,
        "attempts": None if entry is None else entry.attempts,
        "messages": len(messages),
        "consumed": sum(1 for m in messages if m.consumed_at is not None),
        "events": sorted((e.name, e.updated_at) for e in events),
        "timers": len(backend.timers(record)),
        "streams": {name: n for name, n in backend.streams(record)},
    }


async def watch_run(store: Store, key: str, *, every: float) -> AsyncIterator[dict[str, Any]]:
    """:func:`run_state` of the run under ``key`` now, then each time it changes: looked
    at when the store's change feed says the run's records changed, and at least every
    ``every`` seconds (commits of other processes are not announced on SQLite). Ends when
    the key holds nothing (any more)."""
    loop = asyncio.get_running_loop()
    topics = [run_topic(key), run_topic(f"agent:{key}:checkpoint:latest")]
    with store.backend.changes().subscribe(topics) as sub:
        last: dict[str, Any] | None = None
        while True:
            state = await to_thread(run_state, store, key)
            if state is None:
                return
            if state != last:
                last = state
                yield state
            deadline = loop.time() + every
            while (left := deadline - loop.time()) > 0:
                if await sub.await_change(left):
                    break
