"""Many durable runs at once on one SQLite file: group commit.

The same 5-step Plan runs 100 times, first one run after another, then through
``plan.run_many(..., concurrency=8)`` with ``on_concurrent="fork"``. One after another,
every step commit pays its own fsync; concurrently, the commits (and claims) of runs that
are ready at the same moment share one transaction and one fsync, written by a writer
thread while the event loop runs the other runs' steps. Every run's result is checked, and
the store's WAL file shows the space allocated ahead of the commits when the store was
opened (so they do not grow it one commit at a time). The rates printed depend on the
disk: the dearer its fsync, the more sharing it pays.

Usage: python examples/group_commit.py [DB]   (default: a temporary directory)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from stepstone import Agent, Envelope, Plan, Step, Store

RUNS = 100


def add_one(x: int) -> int:
    return x + 1


STEPS = [Step(add_one, name=f"add{i}") for i in range(5)]


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        run(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        run(Path(tmp) / "group.sqlite")


def run(path: Path) -> None:
    with Store(db=path) as store:
        wal = Path(f"{path}-wal").stat().st_size
        print(f"WAL preallocated: {wal / 1e6:.1f} MB")

        t0 = time.perf_counter()
        for i in range(RUNS):
            plan = Plan(*STEPS, store=store, checkpoint_key=f"one-by-one:{i}")
            env = Agent(engine=plan)(Envelope(task="add", payload=i))
            assert env.ok and env.payload == i + 5
        sequential = RUNS / (time.perf_counter() - t0)

        plan = Plan(*STEPS, store=store, checkpoint_key="together", on_concurrent="fork")
        plan.prune_forks()  # forget an earlier run's finished forks (same DB given twice)
        tasks: list[str | Envelope[object]] = [Envelope(task="add", payload=i) for i in range(RUNS)]
        t0 = time.perf_counter()
        results = plan.run_many(tasks, concurrency=8)
        concurrent = RUNS / (time.perf_counter() - t0)
        assert [env.payload for env in results] == [i + 5 for i in range(RUNS)]
        finished = [s for _, s in store.items(prefix="together:", kind="checkpoint")]
        done = all(state["status"] == "done" for state in finished)
        print(f"{len(finished)} concurrent runs, all done: {done}")
        print(f"one after another: {sequential:.0f} runs/s; 8 at a time: {concurrent:.0f} runs/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
