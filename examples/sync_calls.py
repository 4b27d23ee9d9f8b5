"""A sync script that calls its pipeline again and again, from one thread and from several.

Sync calls (``plan.run_many(...)``, ``agent("task")``) run on one event loop per thread,
reused by every call of the thread. So an asyncio object made once, here a rate limiter
(``asyncio.Semaphore``) that caps the requests to a slow service, works in every later
call of the same thread (a new loop per call, as ``asyncio.run`` gives, made the second
batch fail with "is bound to a different event loop"). Threads each have their own loop,
so each thread gets its own limiter (a ``threading.local``). Every batch is a durable run
per ticker in a SQLite store (in a temporary directory).

Usage: python examples/sync_calls.py
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path

from stepstone import Plan, Step, Store

PER_THREAD_LIMIT = 2
local = threading.local()
peaks: dict[str, int] = {}
lock = threading.Lock()


def limiter() -> asyncio.Semaphore:
    """This thread's limiter, made on first use and reused by its later sync calls."""
    if not hasattr(local, "limit"):
        local.limit, local.busy = asyncio.Semaphore(PER_THREAD_LIMIT), 0
    limit: asyncio.Semaphore = local.limit
    return limit


async def fetch(ticker: str) -> str:
    """A call to the slow service, at most two at a time per thread."""
    async with limiter():
        local.busy += 1
        with lock:
            name = threading.current_thread().name
            peaks[name] = max(peaks.get(name, 0), local.busy)
        await asyncio.sleep(0.01)
        local.busy -= 1
    return f"{ticker}: quoted"


def batches(plan: Plan, prefix: str) -> list[str]:
    """Three batches of three tickers, one sync call each; the quotes in order."""
    quotes = []
    for n in range(3):
        tickers = [f"{prefix}{n}{letter}" for letter in "ABC"]
        quotes += [env.payload for env in plan.run_many(tickers, concurrency=8)]
    return quotes


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp,
        Store(db=Path(tmp) / "quotes.sqlite") as store,
    ):
        plan = Plan(
            Step(fetch, writes="quote"),
            store=store,
            checkpoint_key="quotes",
            on_concurrent="fork",  # every ticker its own durable run
        )
        quotes = batches(plan, "M")
        print(f"main thread: {len(quotes)} quotes in 3 sync calls, e.g. {quotes[0]}")

        results: dict[str, list[str]] = {}

        def worker(name: str) -> None:
            results[name] = batches(plan, name)

        threads = [threading.Thread(target=worker, args=(f"T{i}",), name=f"T{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        quoted = [q.endswith("quoted") for r in results.values() for q in r]
        print(f"4 threads: {len(quoted)} quotes, all quoted: {all(quoted)}")
        print(f"at most {max(peaks.values())} requests at once per thread")
        runs = store.items(prefix="quotes:", kind="checkpoint")
        done = all(run["status"] == "done" for _, run in runs)
        print(f"durable runs recorded: {len(runs)}, all done: {done}")


if __name__ == "__main__":
    main()
