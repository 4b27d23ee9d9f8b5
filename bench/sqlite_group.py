"""Group commit on SQLite: concurrent runs in one process share transactions and fsyncs.

Measured in this one run, ``synchronous=FULL``, in ``--rounds`` rounds (each on new files;
medians reported, the machine's noise cancels in the ratios of one round):

* sequential: 200 runs of a 10-step durable Plan (trivial sync steps), one after another
  (``Agent(engine=plan)(task)`` each: every step commit pays its own fsync);
* concurrent: the same 200 runs through ``plan.run_many(..., concurrency=8)`` with
  ``on_concurrent="fork"``: commits and claims of runs that are ready at the same moment
  share one transaction and one fsync (group commit), written by a writer thread while the
  loop runs the other runs' steps (or by the loop's thread when every run waits for the
  batch); the trivial steps themselves run on the loop's thread once they have proven
  quicker than a thread hop;
* the ceiling: the same ``run_many`` on an in-memory store (no SQL, no fsync). Concurrent
  runs cannot beat it even if every fsync were hidden, so sequential / in-memory is the
  highest ratio the Python work allows on this machine;
* a raw commit (``BEGIN IMMEDIATE; INSERT ~1 KB; COMMIT``) on a warm WAL: the fsync cost;
* every run's result is checked;
* database pages written per step, sequential and concurrent (WAL frames of 12 runs: runs
  committed together share the pages they have in common, such as the run heads' leaf).

Target: concurrent >= 3x the sequential runs/s.

    python bench/sqlite_group.py [--runs 200] [--concurrency 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stepstone import Agent, Envelope, Plan, Step, Store


def add_one(x: int) -> int:
    return x + 1


def raw_commit_ms(path: Path, n: int = 300) -> float:
    """ms per ~1 KB single-row FULL commit on a WAL that no longer grows."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    for i in range(n):  # grow the WAL first, as a long-lived store's has
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", "x" * 1000))
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", "y" * 1000))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed * 1000 / n


def sequential(store: Store, steps: list[Step], runs: int, tag: str) -> float:
    t0 = time.perf_counter()
    for i in range(runs):
        plan = Plan(*steps, store=store, checkpoint_key=f"{tag}-{i}")
        env = Agent(engine=plan)(Envelope(task="t", payload=i))
        assert env.ok and env.payload == i + len(steps), env
    return runs / (time.perf_counter() - t0)


def concurrent(store: Store, steps: list[Step], runs: int, concurrency: int, tag: str) -> float:
    plan = Plan(*steps, store=store, checkpoint_key=tag, on_concurrent="fork")
    tasks: list[str | Envelope[object]] = [Envelope(task="t", payload=i) for i in range(runs)]
    t0 = time.perf_counter()
    envs = plan.run_many(tasks, concurrency=concurrency)
    rate = runs / (time.perf_counter() - t0)
    assert [e.payload for e in envs] == [i + len(steps) for i in range(runs)]
    heads = store.backend.run_list(f"{tag}:")
    assert len(heads) == runs and {h.status for h in heads} == {"done"}
    return rate


def pages_per_step(path: Path, steps: list[Step], concurrency: int) -> float:
    """WAL frames (pages written) per step of 12 runs, one after another (``concurrency``
    1) or through ``run_many``, on a store that already holds runs."""
    runs = 12
    with Store(db=path) as store:
        sequential(store, steps, 4, "history")
        probe = sqlite3.connect(path, isolation_level=None)
        try:
            probe.execute("PRAGMA wal_checkpoint(RESTART)")  # the next commit starts the log
            if concurrency == 1:
                sequential(store, steps, runs, "p")
            else:
                concurrent(store, steps, runs, concurrency, "p")
            frames = int(probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])
        finally:
            probe.close()
    return frames / (runs * len(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    steps = [Step(add_one, name=f"s{i}") for i in range(args.steps)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with Store(db=Path(tmp) / "warm-up.sqlite") as store:  # threads, caches, imports
            sequential(store, steps, 10, "w")
            concurrent(store, steps, 10, args.concurrency, "w")
        for r in range(args.rounds):
            raw = raw_commit_ms(Path(tmp) / f"raw-{r}.sqlite")
            with Store(db=Path(tmp) / f"seq-{r}.sqlite") as store:
                seq = sequential(store, steps, args.runs, "seq")
            with Store(db=Path(tmp) / f"conc-{r}.sqlite") as store:
                conc = concurrent(store, steps, args.runs, args.concurrency, "conc")
            with Store() as store:
                ceiling = concurrent(store, steps, args.runs, args.concurrency, "mem")
            rows.append((raw, seq, conc, ceiling))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, synchronous=FULL")
    print(
        f"{args.runs} runs x {args.steps} steps, concurrency {args.concurrency}, every result "
        f"checked; {os.cpu_count()} cpus, load average {load:.1f}"
    )
    print()
    print(
        f"{'round':>5} {'raw commit':>11} {'sequential':>11} {'concurrent':>11} {'ratio':>6} "
        f"{'in-memory':>10} {'ceiling':>8}"
    )
    for r, (raw, seq, conc, ceiling) in enumerate(rows):
        print(
            f"{r:>5} {raw:>8.3f} ms {seq:>7.1f} r/s {conc:>7.1f} r/s {conc / seq:>5.2f}x "
            f"{ceiling:>6.0f} r/s {ceiling / seq:>7.2f}x"
        )
    raw = statistics.median(row[0] for row in rows)
    seq = statistics.median(row[1] for row in rows)
    conc = statistics.median(row[2] for row in rows)
    with tempfile.TemporaryDirectory() as tmp:
        seq_pages = pages_per_step(Path(tmp) / "pages-seq.sqlite", steps, 1)
        conc_pages = pages_per_step(Path(tmp) / "pages-conc.sqlite", steps, args.concurrency)
    ratio = statistics.median(row[2] / row[1] for row in rows)
    ceiling = statistics.median(row[3] / row[1] for row in rows)
    n = args.steps
    print()
    print(f"median ratio concurrent / sequential: {ratio:.2f}x (target >= 3)")
    print(
        f"sequential: {1000 / seq / n:.3f} ms per step, of which about {raw:.3f} ms is the "
        f"fsync of its commit; concurrent: {1000 / conc / n:.3f} ms per step"
    )
    print(
        f"ceiling: the same run_many on an in-memory store is {ceiling:.2f}x the sequential "
        "rate; no amount of fsync sharing gets concurrent runs past it"
    )
    print(
        f"database pages (WAL frames) written per step: sequential {seq_pages:.2f}, "
        f"concurrent {conc_pages:.2f}"
    )


if __name__ == "__main__":
    main()
