"""What durability costs a ReplanEngine run on SQLite, per committed record.

Everything is measured in this one run, so machine noise cancels in the ratios:

* a durable run of R rounds of P parallel trivial tasks (each returns a ~1 KB payload),
  with ``synchronous=FULL`` and ``NORMAL``, and the same run without a store;
* per commit (one per planner answer and one per task outcome): the durable run's extra
  time over the in-memory run, divided by the number of commits;
* the cost per commit of a long run (R=200) against a short one (R=10): does a commit get
  dearer as the run grows (the journal is appended, never rewritten)?

A round's tasks commit one by one, as each finishes (that is what makes a crash in the
middle of a round cost only the tasks in flight), so a round of P tasks costs P + 1
commits.

    python bench/replan_overhead.py [--parallel 4]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from stepstone import Agent, PlanRound, ReplanEngine, Store, Task

PAYLOAD = "x" * 1000


def raw_commit_ms(path: Path, synchronous: str, n: int = 300) -> float:
    """Milliseconds per single-row (~1 KB) committed transaction on a WAL database."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data TEXT)")
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (data) VALUES (?)", (PAYLOAD,))
        conn.execute("COMMIT")
    elapsed = (time.perf_counter() - t0) * 1000 / n
    conn.close()
    return elapsed


def build(rounds: int, parallel: int, store: Store | None, key: str = "bench") -> Agent:
    """An agent whose function planner asks for ``parallel`` tasks per round."""

    def planner(round: int) -> PlanRound:
        if round > rounds:
            return PlanRound(reasoning="done", done=True, final_answer="ok")
        tasks = [Task(tool="work", kwargs={"i": i}) for i in range(parallel)]
        return PlanRound(reasoning=f"round {round}", tasks=tasks)

    async def work(i: int) -> str:
        """A trivial task with a ~1 KB result."""
        return PAYLOAD

    engine = (
        ReplanEngine(store=store, checkpoint_key=key, max_rounds=rounds + 1)
        if store is not None
        else ReplanEngine(max_rounds=rounds + 1)
    )
    return Agent(engine=engine, tools=[planner, work])


def run_ms(rounds: int, parallel: int, store: Store | None, key: str = "bench") -> float:
    agent = build(rounds, parallel, store, key)
    t0 = time.perf_counter()
    env = agent("go")
    elapsed = (time.perf_counter() - t0) * 1000
    assert env.ok, env.error
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    p = args.parallel
    results: dict[Any, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for durability in ("full", "normal"):
            raw = raw_commit_ms(Path(tmp) / f"raw-{durability}.sqlite", durability.upper())
            results[("raw", durability)] = raw
            print(f"raw commit of a ~1 KB row, synchronous={durability.upper()}: {raw:.3f} ms")
        for rounds in (10, 200):
            commits = rounds * (p + 1) + 1  # every task outcome, every planner answer
            base = min(run_ms(rounds, p, None) for _ in range(3))
            for durability in ("full", "normal"):
                store = Store(db=Path(tmp) / f"{durability}-{rounds}.sqlite", durability=durability)
                with store:
                    run_ms(rounds, p, store, "warm")  # warm the file (schema, WAL)
                    ms = min(run_ms(rounds, p, store, f"run-{i}") for i in range(3))
                results[(rounds, durability)] = (ms - base) / commits
                per = (ms - base) / commits
                print(
                    f"rounds={rounds:4d} parallel={p} {durability:6s}: run {ms:8.1f} ms, "
                    f"no store {base:7.1f} ms, extra per commit {per:.3f} ms "
                    f"({per / results[('raw', durability)]:.2f}x raw, {commits} commits)"
                )
    for durability in ("full", "normal"):
        ratio = results[(200, durability)] / results[(10, durability)]
        print(f"{durability}: cost per commit at 200 rounds / at 10 rounds = {ratio:.2f}")


if __name__ == "__main__":
    main()
