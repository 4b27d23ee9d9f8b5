"""Fan-out from threads on PostgreSQL: should the commits of many threads share one
transaction there too, as they do on SQLite (``bench/sqlite_threads.py``)?

Starts its own throwaway server (``tests/pgserver.py``, loopback, ``fsync`` on), then
measures in each of ``--rounds`` rounds, each on a new database:

* sequential: 200 runs of a 10-step durable Plan (trivial sync steps) with
  ``on_concurrent="fork"``, the Agent called once per run, one call after another;
* threads, each run's commits its own (what stepstone does on PostgreSQL): the same 200
  calls from a ``ThreadPoolExecutor(8)``, each thread's commits on a pooled connection of
  its own, so the server shares one WAL flush among the commits that arrive together;
* threads, commits shared: the same, with the kernel told that the backend groups
  (``durable._kernel.can_group``), so the commits the threads make at the same moment go
  through the backend's turns and are written as one transaction (claims stay each
  run's own);
* every run's result is checked, and every run's record is ``done``;
* CPU ms per run: this process's CPU time over the runs.

Also the raw commit: one autocommit upsert of a ~100-byte row, in ms.

    python bench/pg_threads.py [--runs 200] [--steps 10] [--threads 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.pgserver when run as a script
    sys.path.insert(0, str(ROOT))


def add_one(x: int) -> int:
    return x + 1


def raw_commit_ms(url: str, n: int = 500) -> float:
    """Milliseconds per single-row autocommit upsert, one client."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        sql = "INSERT INTO bench_raw VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
        for i in range(50):
            conn.execute(sql, (f"w{i}", "x" * 100))
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute(sql, (f"k{i}", "x" * 100))
        return (time.perf_counter() - t0) * 1000 / n


def fan_out(url: str, how: str, runs: int, steps: int, threads: int) -> tuple[float, float]:
    """Runs/s and CPU ms per run; ``how``: ``sequential``, ``threads`` or ``shared``."""
    from stepstone import Agent, Envelope, Plan, Step, Store
    from stepstone.durable import _kernel
    from stepstone.store import PostgresBackend

    grouping = _kernel.can_group
    if how == "shared":
        _kernel.can_group = lambda backend: True
    try:
        with Store(backend=PostgresBackend(url, max_size=threads + 2)) as store:
            plan = Plan(
                *[Step(add_one, name=f"s{i}") for i in range(steps)],
                store=store,
                checkpoint_key=how,
                on_concurrent="fork",
            )
            agent = Agent(engine=plan)
            tasks = [Envelope(task="t", payload=i) for i in range(runs)]
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(agent, tasks[:threads]))  # warm: the pool's connections
                t0, c0 = time.perf_counter(), time.process_time()
                if how == "sequential":
                    envs = [agent(task) for task in tasks]
                else:
                    envs = list(pool.map(agent, tasks))
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            assert [e.payload for e in envs] == [i + steps for i in range(runs)], envs[:3]
            heads = [h for h in store.backend.run_list(f"{how}:") if h.status == "done"]
            assert len(heads) == runs + threads, len(heads)
    finally:
        _kernel.can_group = grouping
    return runs / wall, cpu * 1000 / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import psycopg
    from tests.pgserver import PgServer

    from stepstone import Store

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows: list[tuple[float, dict[str, tuple[float, float]]]] = []
    with PgServer(fsync=True) as server:
        for r in range(args.rounds):
            url = server.create_database(f"bench{r}")
            with Store(url=url) as store:
                store.backend.setup()  # type: ignore[attr-defined]
            with psycopg.connect(url) as conn:
                version = conn.execute("SHOW server_version").fetchone()
            got: dict[str, Any] = {}
            order = ["sequential", "threads", "shared"]
            if r % 2:
                order = [order[0], *reversed(order[1:])]
            for how in order:
                got[how] = fan_out(url, how, args.runs, args.steps, args.threads)
            rows.append((raw_commit_ms(url), got))
    print(
        f"python {sys.version.split()[0]}, PostgreSQL {version[0] if version else '?'}, "
        f"{os.cpu_count()} cpus, load average {load:.1f}, fsync on"
    )
    print(
        f"{args.runs} runs x {args.steps} steps, Plan(on_concurrent='fork'), the Agent called "
        f"one after another and from ThreadPoolExecutor({args.threads}); every result checked"
    )
    head = f"{'round':>5} {'raw commit':>10} {'sequential':>16} {'threads, own commits':>27}"
    print(f"{head} {'threads, commits shared':>27}")
    for r, (raw, got) in enumerate(rows):
        seq, own, shared = got["sequential"], got["threads"], got["shared"]
        print(
            f"{r:>5} {raw:>7.3f} ms {seq[0]:>6.1f} r/s {seq[1]:>4.2f} cpu "
            f"{own[0]:>6.1f} r/s {own[0] / seq[0]:>5.2f}x {own[1]:>4.2f} cpu "
            f"{shared[0]:>6.1f} r/s {shared[0] / seq[0]:>5.2f}x {shared[1]:>4.2f} cpu"
        )
    own_ratio = statistics.median(g["threads"][0] / g["sequential"][0] for _, g in rows)
    shared_ratio = statistics.median(g["shared"][0] / g["sequential"][0] for _, g in rows)
    shared_own = statistics.median(g["shared"][0] / g["threads"][0] for _, g in rows)
    print(f"median ratio threads (own commits) / sequential: {own_ratio:.2f}x")
    print(f"median ratio threads (commits shared) / sequential: {shared_ratio:.2f}x")
    print(f"median ratio commits shared / own commits: {shared_own:.2f}x")
    print("(cpu: CPU ms per run in this process; the server's CPU is not in it)")


if __name__ == "__main__":
    main()
