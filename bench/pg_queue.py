"""Runs through the PostgreSQL work queue: fan-out over worker processes, and recovery.

Starts its own throwaway server (``tests/pgserver.py``, loopback, fsync on), then in this
one run:

* fan-out: 200 runs of a 10-step durable Plan (trivial steps) submitted to one queue, then
  served by 1, 2 and 4 ``stepstone worker`` processes (concurrency 4 each): runs per
  second from the first start to the last finish (the database's timestamps), and the
  ratio to one worker;
* recovery: a worker is SIGKILLed inside a 100-step run (20 ms steps) while a second
  worker stands by; the time from the kill until the run is done, and proof from the step
  log that no committed step ran again.

    python bench/pg_queue.py [--runs 200] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.pgserver when run as a script
    sys.path.insert(0, str(ROOT))

from stepstone import Plan, Step  # noqa: E402 - after the path set-up


def trivial(payload: Any) -> str:
    return "x" * 100


def _logged(i: int) -> Any:
    def step(payload: Any) -> Any:
        cfg = json.loads(payload) if isinstance(payload, str) else payload
        time.sleep(0.02)
        with open(cfg["log"], "a", encoding="utf-8") as fh:
            fh.write(f"{i} {os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        return cfg

    step.__name__ = f"s{i:03d}"
    return step


plan = Plan(*[Step(trivial, name=f"s{i}") for i in range(10)])
long_plan = Plan(*[Step(_logged(i)) for i in range(100)], max_iterations=101)


def spawn(url: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            "--url",
            url,
            "--import-path",
            str(Path(__file__).resolve().parent),
            "--poll-interval",
            "0.05",
            *args,
        ],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def fan_out(url: str, workers: int, runs: int) -> float:
    import psycopg

    from stepstone import Store, submit

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE stepstone_queue, stepstone_kv, stepstone_runs, stepstone_journal")
    with Store(url=url) as store:
        handles = [submit(store, "pg_queue:plan", "go", queue="bench") for _ in range(runs)]
        procs = [spawn(url, "--queue", "bench", "--concurrency", "4") for _ in range(workers)]
        try:
            for h in handles:
                if not h.result(timeout=600).ok:
                    raise SystemExit(f"run {h.id} failed")
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=60)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT max(updated_at) - min(started_at) FROM stepstone_queue"
        ).fetchone()
    assert row is not None
    return runs / float(row[0])


def recovery(url: str, log: Path) -> tuple[float, int, int]:
    from stepstone import Store, submit

    with Store(url=url) as store:
        h = submit(store, "pg_queue:long_plan", json.dumps({"log": str(log)}), queue="rec")
        first = spawn(url, "--queue", "rec", "--lease-seconds", "30")
        while not log.exists():  # the first worker holds the run
            time.sleep(0.01)
        standby = spawn(url, "--queue", "rec", "--lease-seconds", "30")
        while len(log.read_text().splitlines()) < 50:
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        env = h.result(timeout=600)
        took = time.monotonic() - killed_at
        standby.send_signal(signal.SIGTERM)
        standby.wait(timeout=60)
        if not env.ok:
            raise SystemExit(f"recovered run failed: {env.error}")
    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    reran = len(steps) - len(set(steps))
    assert sorted(set(steps)) == list(range(100)), "a step never ran"
    return took, reran, len(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import tempfile

    import psycopg
    from tests.pgserver import PgServer

    from stepstone import Store

    with PgServer(fsync=True) as server, tempfile.TemporaryDirectory() as tmp:
        url = server.create_database("bench")
        Store(url=url).setup()
        version = psycopg.connect(url).execute("SHOW server_version").fetchone()
        print(
            f"python {sys.version.split()[0]}, PostgreSQL {version[0] if version else '?'}, "
            f"{os.cpu_count()} cpus, fsync on"
        )
        print(f"{args.runs} runs x 10 steps through the queue, worker concurrency 4")
        rates: dict[int, list[float]] = {w: [] for w in args.workers}
        for _ in range(args.repeat):  # interleaved, so drift hits every size alike
            for workers in args.workers:
                rates[workers].append(fan_out(url, workers, args.runs))
        print(f"{'workers':>7} {'runs/s':>8} {'x 1 worker':>10}   (median of {args.repeat})")
        base = statistics.median(rates[args.workers[0]])
        for workers in args.workers:
            rate = statistics.median(rates[workers])
            print(f"{workers:>7} {rate:>8.1f} {rate / base:>10.2f}")
        took, reran, executed = recovery(url, Path(tmp) / "steps.log")
        print()
        print(
            f"recovery: worker SIGKILLed after 50 of 100 steps; a standby worker finished the "
            f"run {took:.2f}s after the kill; steps executed {executed}, re-run {reran} "
            "(only the step in flight may re-run)"
        )


if __name__ == "__main__":
    main()
