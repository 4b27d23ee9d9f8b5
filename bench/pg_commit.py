"""Per-step cost of a durable Plan on PostgreSQL, as a ratio to a raw 1 KB upsert.

Starts its own throwaway server (``tests/pgserver.py``, loopback, fsync on) and measures in
this one run:

* raw commit: one autocommit ``INSERT ... ON CONFLICT DO UPDATE`` of a 1 KB row, one client,
  psycopg with a prepared statement: the floor any durable step pays on this server;
* a durable Plan of N trivial steps, each returning a 1 KB payload stored with ``writes=``
  (N = 10 and 100), run the way a script runs it (``Agent(engine=plan)(task)``): wall time
  per step, everything included (step call, engine, commit), on a warm store;
* the same with ``PostgresBackend(prepare=False)`` (as behind PgBouncer in transaction mode:
  each step commit one call of the server function ``stepstone_step_commit``);
* the same awaited on an event loop (``await agent.run(task)``, as async code and workers
  run it), whose step commits go on async connections awaited on the loop;
* the same steps without ``writes=``: each step's 1 KB output is journaled only (one
  1 KB row per step, as the raw upsert writes, instead of two);
* the same steps writing the same ``writes=`` keys in every run (as a plan that keeps its
  latest outputs under fixed keys does), where the runs above write new keys: a commit
  that rewrites a value locks its row instead of taking the key's lock;
* the calling thread's CPU per step and per raw upsert (``time.thread_time``): the
  client's own work, which a single run pays in series with the server, and which the
  server's fsync latency does not move;
* WAL flushes per 10-step run, counted by the server (``pg_stat_wal``): a figure the
  machine's load does not move;
* for reference, the parts: one step commit through the kernel alone (``OwnedRun.commit_sync``
  of a 1 KB journal row and a 1 KB ``writes=`` value, no engine), and the claim of a new
  run (median of 11: one round trip; it commits without waiting for its WAL flush, which the
  run's first step commit does for it).

Targets: 100-step runs <= 1.5x the raw upsert per step, 10-step runs <= 2x.

    python bench/pg_commit.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.pgserver when run as a script
    sys.path.insert(0, str(ROOT))

PAYLOAD = "x" * 1000


_RAW_SQL = "INSERT INTO bench_raw VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"


def raw_connection(url: str) -> Any:
    """One warm autocommit connection for the raw upserts, kept for the whole benchmark (a
    connection opened per measurement would have its server process start and exit right
    next to the runs measured)."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    for i in range(10):  # warm up (and let psycopg prepare the statement)
        conn.execute(_RAW_SQL, (f"w{i}", PAYLOAD))
    return conn


#: Microseconds of the calling thread's CPU per operation, by what was measured: a figure
#: the server's fsync latency does not move, so changes to the client's work show in it.
CPU_US: dict[str, list[float]] = {}


def raw_upsert_ms(conn: Any, n: int = 2000) -> float:
    """Milliseconds per single-row 1 KB autocommit upsert on ``conn``, one client."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        conn.execute(_RAW_SQL, (f"k{i % 500}", PAYLOAD))
    CPU_US.setdefault("raw upsert", []).append((time.thread_time() - c0) * 1e6 / n)
    return (time.perf_counter() - t0) * 1000 / n


def trivial(payload: Any) -> str:
    return PAYLOAD


def plan_ms_per_step(
    store: Any,
    n_steps: int,
    key: str,
    loop: Any = None,
    writes: bool | str = True,
    cpu_label: str = "warm-up",
) -> float:
    """ms per step of one run: ``agent(task)``, or awaited on ``loop`` (an event loop kept
    for the whole benchmark) as async code runs it; each step's output also stored under a
    ``writes=`` key (new keys for each run; ``writes="same"``: the same keys in every run),
    or (``writes=False``) only journaled. The calling thread's CPU per
    step goes to :data:`CPU_US` under ``cpu_label``."""
    from stepstone import Agent, Plan, Step

    steps = [
        Step(
            trivial,
            name=f"s{i}",
            writes=(f"same:w{i}" if writes == "same" else f"{key}:w{i}") if writes else None,
        )
        for i in range(n_steps)
    ]
    plan = Plan(*steps, store=store, checkpoint_key=key, max_iterations=n_steps + 1)
    agent = Agent(engine=plan)
    t0, c0 = time.perf_counter(), time.thread_time()
    env = agent("go") if loop is None else loop.run_until_complete(agent.run("go"))
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
    if not env.ok:
        raise SystemExit(f"run {key} failed: {env.error}")
    CPU_US.setdefault(cpu_label, []).append(cpu * 1e6 / n_steps)
    return elapsed * 1000 / n_steps


def kernel_ms(store: Any, n: int, key: str) -> tuple[float, float]:
    """Milliseconds per claim of a new run (median of 11 new keys), and per step commit
    through the kernel alone."""
    from stepstone.durable import claim_run

    claims = []
    for i in range(11):
        t0 = time.perf_counter()
        other = claim_run(store, f"{key}-c{i}", kind="bench", resume=False, first_step="s0").run
        claims.append(time.perf_counter() - t0)
        assert other is not None
        other.commit_sync(status="done", next_step=None)
        other.release()
    claim = statistics.median(claims)
    run = claim_run(store, key, kind="bench", resume=False, first_step="s0").run
    assert run is not None
    data = {"payload": PAYLOAD}
    t0 = time.perf_counter()
    for i in range(n):
        run.commit_sync(
            status="running",
            next_step=f"s{i + 1}",
            rows=[("step", f"s{i}", data)],
            writes=[(f"{key}:w{i % 10}", PAYLOAD)],
        )
    commit = time.perf_counter() - t0
    run.commit_sync(status="done", next_step=None)
    run.release()
    return claim * 1000, commit * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    import psycopg
    from tests.pgserver import PgServer

    from stepstone import Store
    from stepstone.store import PostgresBackend

    with PgServer(fsync=True) as server:
        url = server.create_database("bench")
        version = psycopg.connect(url).execute("SHOW server_version").fetchone()
        print(
            f"python {sys.version.split()[0]}, PostgreSQL {version[0] if version else '?'}, "
            f"psycopg {psycopg.__version__}, {os.cpu_count()} cpus, fsync on"
        )
        stores = {
            "prepared": Store(backend=PostgresBackend(url)),
            "prepare=False": Store(backend=PostgresBackend(url, prepare=False)),
        }
        loop = asyncio.new_event_loop()
        # (label, store, how each is run: agent(task) or awaited on a loop, with writes=)
        modes = [
            ("prepared", "prepared", None, True),
            ("prepare=False", "prepare=False", None, True),
            ("prepared, awaited", "prepared", loop, True),
            ("prepared, no writes=", "prepared", None, False),
            ("prepared, same keys", "prepared", None, "same"),
        ]
        for label, name, mode, writes in modes:
            stores[name].setup()
            plan_ms_per_step(stores[name], 20, f"warm-{label}", mode, writes)
        raw = raw_connection(url)
        raws: list[float] = []
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        parts: dict[str, list[tuple[float, float]]] = {}
        for r in range(args.repeat):  # interleaved, each run paired with a raw measurement
            for label, name, mode, writes in modes:
                for n in (10, 100):
                    # the raw upsert measured just before and just after the run, as many
                    # times as the run has steps, so both see the same machine
                    before = raw_upsert_ms(raw, n)
                    ms = plan_ms_per_step(
                        stores[name], n, f"{label}-{n}-{r}", mode, writes, f"{label}, {n} steps"
                    )
                    raw_ms = (before + raw_upsert_ms(raw, n)) / 2
                    raws.append(raw_ms)
                    results.setdefault((label, n), []).append((ms, ms / raw_ms))
            before = raw_upsert_ms(raw, 100)
            claim, commit = kernel_ms(stores["prepared"], 100, f"kernel-{r}")
            raw_ms = (before + raw_upsert_ms(raw, 100)) / 2
            parts.setdefault("claim of a new run", []).append((claim, claim / raw_ms))
            parts.setdefault("kernel step commit", []).append((commit, commit / raw_ms))
        print(
            f"raw 1 KB upsert (autocommit, prepared, one client): {statistics.median(raws):.3f} ms"
        )
        print(
            "ratios: median over the repeats of (run / raw upsert measured around it, as many "
            "upserts as the run has steps)"
        )
        print()
        print(f"{'store':>23} {'steps':>6} {'ms/step':>8} {'x raw':>6} {'target':>7}")
        for (name, n), values in results.items():
            ms = statistics.median(v[0] for v in values)
            ratio = statistics.median(v[1] for v in values)
            target = 1.5 if n == 100 else 2.0
            print(f"{name:>23} {n:>6} {ms:>8.3f} {ratio:>6.2f} {target:>6.1f}x")
        print()
        for what, values in parts.items():
            ms = statistics.median(v[0] for v in values)
            ratio = statistics.median(v[1] for v in values)
            print(f"{what:>21}: {ms:.3f} ms ({ratio:.2f}x raw)")
        print()
        print("CPU of the calling thread (median us per step or upsert; the loop's, awaited):")
        for what, cpus in CPU_US.items():
            if what != "warm-up":
                print(f"{what:>34}: {statistics.median(cpus):6.1f} us")
        print()
        print_wal_flushes(url)
        for store in stores.values():
            store.close()
        loop.close()
        raw.close()


def print_wal_flushes(url: str) -> None:
    """A figure a loaded machine does not disturb: WAL flushes per 10-step run
    (``pg_stat_wal``; each step commit waits for one, a claim for none)."""
    import psycopg

    from stepstone import Store
    from stepstone.store import PostgresBackend

    with psycopg.connect(url, autocommit=True) as conn:

        def syncs() -> int:
            time.sleep(1.5)  # let the server's statistics settle
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
            return int(row[0]) if row else 0

        before = syncs()
        # a store of its own, closed before the count is read: a server process reports
        # its WAL statistics when it ends (pooled ones only now and then)
        counted = Store(backend=PostgresBackend(url))
        for i in range(10):
            plan_ms_per_step(counted, 10, f"flushes-{i}")
        counted.close()
        flushes = (syncs() - before) / 10
    print(f"WAL flushes per 10-step run: {flushes:.1f} (one per step commit)")


if __name__ == "__main__":
    main()
