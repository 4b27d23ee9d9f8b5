"""Two worker processes share one work queue; 100 durable runs are submitted to it.

    python examples/workers_fanout.py                        # SQLite file in a temp dir
    python examples/workers_fanout.py --url postgresql://... # or a PostgreSQL database
    python examples/workers_fanout.py --runs 10 --db /tmp/q.sqlite

Each run is a three-step Plan (fetch, score, report). The script starts two
``stepstone worker`` processes, submits the runs with ``plan.submit(...)``, waits for every
result through its handle, prints which worker process ran how many, and stops the
workers with SIGTERM (they finish what they hold, then exit).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepstone import Plan, Step, Store


def fetch(order_id: str) -> dict[str, Any]:
    return {"order": order_id, "amount": sum(map(ord, order_id)) * 37 % 1000}


def score(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "risk": "high" if order["amount"] > 700 else "low"}


def report(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "worker_pid": os.getpid()}


# Module level, so the workers can import it as "workers_fanout:plan".
plan = Plan(Step(fetch), Step(score), Step(report))


def start_worker(store_arg: list[str]) -> subprocess.Popen[str]:
    here = str(Path(__file__).resolve().parent)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            *store_arg,
            "--queue",
            "orders",
            "--concurrency",
            "8",
            "--import-path",
            here,
            "--poll-interval",
            "0.05",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="SQLite store file (default: a new temp file)")
    where.add_argument("--url", help="postgresql://... store URL")
    args = parser.parse_args()
    if args.url:
        run(Store(url=args.url), ["--url", args.url], args.runs)
    elif args.db:
        run(Store(db=args.db), ["--db", args.db], args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="stepstone-workers-") as tmp:
            db = str(Path(tmp) / "q.sqlite")
            run(Store(db=db), ["--db", db], args.runs)


def run(store: Store, store_arg: list[str], runs: int) -> None:
    store.setup()

    workers = [start_worker(store_arg) for _ in range(2)]
    for w in workers:  # each prints "worker-... serving orders ..." once it is up
        assert w.stderr is not None
        w.stderr.readline()
    try:
        t0 = time.monotonic()
        handles = [plan.submit(f"order-{i:03d}", store=store, queue="orders") for i in range(runs)]
        results = [h.result(timeout=300) for h in handles]
        elapsed = time.monotonic() - t0
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.communicate(timeout=60)
        store.close()

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    by_pid = collections.Counter(r.payload["worker_pid"] for r in results)
    risky = sum(r.payload["risk"] == "high" for r in results)
    print(f"{len(results)} runs done in {elapsed:.1f}s, {risky} high-risk orders")
    for n, (_, count) in enumerate(sorted(by_pid.items()), 1):
        print(f"worker {n}: {count} runs")
    print(f"workers exited: {[w.returncode for w in workers]}")


if __name__ == "__main__":
    main()
