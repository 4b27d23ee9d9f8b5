"""Group commit on SQLite: concurrent runs in one process share transactions and fsyncs.

Measured in this one run, ``synchronous=FULL``:

* sequential: 200 runs of a 10-step durable Plan (trivial sync steps), one after another
  (``Agent(engine=plan)(task)`` each: every step commit pays its own fsync);
* concurrent: the same 200 runs through ``plan.run_many(..., concurrency=8)`` with
  ``on_concurrent="fork"``: step commits of runs that are ready at the same moment share
  one transaction (group commit);
* every run's result is checked.

Target: concurrent >= 3x the sequential runs/s.

    python bench/sqlite_group.py [--runs 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from stepstone import Agent, Envelope, Plan, Step, Store


def add_one(x: int) -> int:
    return x + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    steps = [Step(add_one, name=f"s{i}") for i in range(args.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(db=Path(tmp) / "seq.sqlite")
        t0 = time.perf_counter()
        for i in range(args.runs):
            plan = Plan(*steps, store=store, checkpoint_key=f"seq-{i}")
            env = Agent(engine=plan)(Envelope(task="t", payload=i))
            assert env.ok and env.payload == i + args.steps, env
        seq = args.runs / (time.perf_counter() - t0)
        store.close()

        store = Store(db=Path(tmp) / "conc.sqlite")
        plan = Plan(*steps, store=store, checkpoint_key="conc", on_concurrent="fork")
        tasks: list[str | Envelope[object]] = [
            Envelope(task="t", payload=i) for i in range(args.runs)
        ]
        t0 = time.perf_counter()
        envs = plan.run_many(tasks, concurrency=args.concurrency)
        conc = args.runs / (time.perf_counter() - t0)
        assert [e.payload for e in envs] == [i + args.steps for i in range(args.runs)]
        heads = store.backend.run_list("conc:")
        assert len(heads) == args.runs and {h.status for h in heads} == {"done"}
        store.close()
    print(f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, synchronous=FULL")
    print(f"{args.runs} runs x {args.steps} steps, every result checked")
    print(f"sequential:              {seq:8.1f} runs/s")
    print(f"concurrent ({args.concurrency}, grouped): {conc:8.1f} runs/s  ({conc / seq:.2f}x)")


if __name__ == "__main__":
    main()
