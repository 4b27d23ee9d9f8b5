"""Cheap sync steps in many concurrent runs: they run on the event loop's thread.

A pipeline of small sync transforms (parse a record, normalize it, score it) fans out over
300 records, 8 durable runs at a time, on a SQLite store (in a temporary directory). A sync
step of runs that share a loop goes to a worker thread at first, so a slow one never holds
the other runs up; once a function has returned within 100 microseconds three calls in a
row, it runs on the loop's thread, because the hop to a thread and back would cost more
than the function itself. The lookup step sleeps for 2 ms (a stand-in for a call to a slow
service): it stays in worker threads. The example counts where each step ran.

Usage: python examples/quick_steps.py
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from stepstone import Envelope, Plan, Step, Store

where: Counter[tuple[str, str]] = Counter()
lock = threading.Lock()


def _ran(step: str) -> None:
    place = "loop" if threading.current_thread() is threading.main_thread() else "thread"
    with lock:
        where[(step, place)] += 1


def parse(line: str) -> dict[str, Any]:
    _ran("parse")
    name, amount = line.split(",")
    return {"name": name, "amount": float(amount)}


def normalize(record: dict[str, Any]) -> dict[str, Any]:
    _ran("normalize")
    return {**record, "name": record["name"].strip().title()}


def lookup(record: dict[str, Any]) -> dict[str, Any]:
    _ran("lookup")
    time.sleep(0.002)  # a slow service
    return {**record, "region": "EU" if len(record["name"]) % 2 else "US"}


def score(record: dict[str, Any]) -> str:
    _ran("score")
    return f"{record['name']} ({record['region']}): {record['amount'] * 1.2:.1f}"


def main() -> None:
    records = [f" customer {i} ,{i}.5" for i in range(300)]
    with (
        tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp,
        Store(db=Path(tmp) / "scores.sqlite") as store,
    ):
        plan = Plan(
            Step(parse),
            Step(normalize),
            Step(lookup),
            Step(score),
            store=store,
            checkpoint_key="score",
            on_concurrent="fork",  # one durable run per record
        )
        t0 = time.perf_counter()
        results = plan.run_many([Envelope(task="score", payload=r) for r in records], concurrency=8)
        took = time.perf_counter() - t0
        assert all(env.ok for env in results), [env.error for env in results if not env.ok]
        print(f"{len(results)} runs, first: {results[0].payload}")
        for step in ("parse", "normalize", "lookup", "score"):
            on_loop, in_thread = where[(step, "loop")], where[(step, "thread")]
            print(f"{step}: {on_loop} calls on the loop's thread, {in_thread} in worker threads")
        done = sum(head["status"] == "done" for _, head in store.items("score:", kind="checkpoint"))
        print(f"durable runs done: {done}")
        print(f"({len(results) / took:.0f} runs/s on this machine)")


if __name__ == "__main__":
    main()
