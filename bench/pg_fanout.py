"""Durable Plans fanned out over worker processes sharing one PostgreSQL server.

Starts its own throwaway server (as the tests do: ``tests/pgserver.py``, loopback only,
but with ``fsync`` on, PostgreSQL's default durability), then measures in this one run:

* raw commit: one autocommit ``INSERT ... ON CONFLICT DO UPDATE`` of a ~100-byte row
  from one client, in ms: the floor any durable step pays on this server;
* 200 runs of a 10-step durable Plan (trivial sync steps, each with ``writes=``), split
  over 1, 2 and 4 worker processes, each worker with its own ``Store(url=...)``: runs per
  second (wall clock, all workers) and the per-step cost a worker sees (its wall time per
  step, engine + commit), also as a multiple of the raw commit.

Machine noise cancels in the ratios; the absolute numbers depend on the disk's fsync.

    python bench/pg_fanout.py [--runs 200] [--steps 10] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.pgserver when run as a script
    sys.path.insert(0, str(ROOT))

PAYLOAD = "x" * 100


def raw_commit_ms(url: str, n: int = 1000) -> float:
    """Milliseconds per single-row autocommit upsert, one client."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        sql = "INSERT INTO bench_raw VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
        for i in range(50):  # warm up (and let psycopg prepare the statement)
            conn.execute(sql, (f"w{i}", PAYLOAD))
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute(sql, (f"k{i}", PAYLOAD))
        return (time.perf_counter() - t0) * 1000 / n


def _step(payload: Any) -> str:
    return PAYLOAD


def _run_plan(store: Any, key: str, n_steps: int) -> None:
    from stepstone import Agent, Plan, Step

    steps = [Step(_step, name=f"s{i}", writes=f"{key}/w{i}") for i in range(n_steps)]
    plan = Plan(*steps, store=store, checkpoint_key=key, max_iterations=n_steps + 1)
    env = Agent(engine=plan)("go")
    if not env.ok:
        raise SystemExit(f"run {key} failed: {env.error}")


def worker(url: str, first: int, count: int, n_steps: int, start_at: float) -> None:
    """One worker process: warm up, wait for the common start, run its share of runs."""
    from stepstone import Store

    with Store(url=url) as store:
        _run_plan(store, f"warm-{os.getpid()}", n_steps)
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.time()
        for i in range(first, first + count):
            _run_plan(store, f"run-{i:05d}", n_steps)
        t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "runs": count}), flush=True)


def fan_out(url: str, workers: int, runs: int, n_steps: int) -> dict[str, float]:
    """Run ``runs`` Plans over ``workers`` processes; runs/s and worker ms per step."""
    start_at = time.time() + 2.0 + 0.3 * workers  # after every worker's imports and warm-up
    share = [runs // workers + (1 if w < runs % workers else 0) for w in range(workers)]
    procs = []
    first = 0
    for count in share:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    url,
                    str(first),
                    str(count),
                    str(n_steps),
                    str(start_at),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
        first += count
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed with exit code {proc.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    late = [r["t0"] - start_at for r in reports]
    if max(late) > 0.5:
        print(f"  (warning: a worker started {max(late):.2f}s late; raise the start delay)")
    wall = max(r["t1"] for r in reports) - min(r["t0"] for r in reports)
    per_step = statistics.mean((r["t1"] - r["t0"]) * 1000 / (r["runs"] * n_steps) for r in reports)
    return {"wall": wall, "runs_per_s": runs / wall, "ms_per_step": per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    import psycopg
    from tests.pgserver import PgServer

    from stepstone import Store

    with PgServer(fsync=True) as server:
        url = server.create_database("bench")
        with Store(url=url) as store:
            store.backend.setup()  # type: ignore[attr-defined]
        raw = raw_commit_ms(url)
        version = psycopg.connect(url).execute("SHOW server_version").fetchone()
        print(
            f"python {sys.version.split()[0]}, PostgreSQL {version[0] if version else '?'}, "
            f"psycopg {psycopg.__version__}, {os.cpu_count()} cpus, fsync on"
        )
        print(f"raw single-row commit (autocommit upsert, one client): {raw:.3f} ms")
        print(f"{args.runs} runs x {args.steps} steps (trivial sync steps with writes=)")
        print()
        print(
            f"{'workers':>7} {'wall s':>8} {'runs/s':>8} {'steps/s':>8} "
            f"{'ms/step/worker':>15} {'x raw commit':>13}"
        )
        for workers in args.workers:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE stepstone_kv, stepstone_runs, stepstone_journal")
            r = fan_out(url, workers, args.runs, args.steps)
            print(
                f"{workers:>7} {r['wall']:>8.2f} {r['runs_per_s']:>8.1f} "
                f"{r['runs_per_s'] * args.steps:>8.0f} {r['ms_per_step']:>15.3f} "
                f"{r['ms_per_step'] / raw:>13.2f}"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, first, count, n_steps, start_at = sys.argv[2:7]
        worker(url, int(first), int(count), int(n_steps), float(start_at))
    else:
        main()
