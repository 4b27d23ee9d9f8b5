"""Per-step cost of a durable Plan on SQLite, as ratios to a raw SQLite commit.

Everything is measured in this one run, so machine noise cancels in the ratios:

* raw commit: one ``BEGIN IMMEDIATE; INSERT ~1 KB row; COMMIT`` on a WAL database, with
  ``synchronous=FULL`` and ``NORMAL``; for the FULL ratios, measured on new files just
  before and just after each durable run (at least 50 commits each), so that a run and
  its raw commit see the same machine (the fsync cost of this VM drifts by 30% within a
  minute);
* a durable Plan of N trivial steps (each returns a ~1 KB payload stored with ``writes=``),
  for N = 10, 100, 1000: wall time per step (everything: the step call, the engine and the
  atomic commit of head + journal row + writes value), on a new database file and on a
  long-lived open store that already holds runs;
* the same 10- and 100-step runs without ``writes=`` (each output journaled only);
* the ratio of per-step cost at 1000 and at 10 steps (does a step get dearer as the run
  grows?);
* database bytes per step after a WAL checkpoint (minus the empty schema), as a multiple
  of the payload size;
* database pages per step commit, counted in the WAL (its frames, one per page a commit
  wrote), for 100 B, 1 KB and 10 KB outputs, beside the raw commit's.

Targets: per-step <= 1.5x raw FULL commit; cost ratio 1000/10 <= 1.2; bytes <= 3x payload.

    python bench/plan_overhead.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from stepstone import Agent, Envelope, Plan, RunContext, Step, Store
from stepstone.core._sync import _PRIVATE_TASKS, _Call

PAYLOAD = "x" * 1000


def raw_commit_ms(path: Path, synchronous: str, n: int = 500, warm: bool = False) -> float:
    """Milliseconds per single-row (~1 KB) committed transaction (on a new file, whose
    WAL grows with every commit, or ``warm``: on a WAL already grown past its end)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    if warm:
        conn.execute("PRAGMA synchronous=OFF")
        for i in range(n * 2):
            conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"w{i}", PAYLOAD))
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        conn.execute(f"PRAGMA synchronous={synchronous}")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", PAYLOAD))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed * 1000 / n


def wal_commits(path: Path) -> list[int]:
    """Pages written by each transaction in ``path``'s WAL since it last restarted (frames
    with the WAL's current salt; a page number 0, preallocated space, ends the log)."""
    wal = Path(f"{path}-wal").read_bytes()
    page_size = struct.unpack(">I", wal[8:12])[0]
    counts: list[int] = []
    pages, offset = 0, 32
    while offset + 24 + page_size <= len(wal):
        page, db_size = struct.unpack(">II", wal[offset : offset + 8])
        if page == 0 or wal[offset + 8 : offset + 16] != wal[16:24]:
            break
        pages += 1
        if db_size:  # a transaction's last frame
            counts.append(pages)
            pages = 0
        offset += 24 + page_size
    return counts


def pages_per_step_commit(tmp: Path, size: int, n_steps: int = 60) -> float:
    """Mean WAL pages per step commit of a ``n_steps``-step run with ``size``-character
    outputs (each also stored with ``writes=``), on a store that already holds a run."""
    path = tmp / f"pages-{size}.sqlite"
    output = "x" * size
    with Store(db=path) as store:
        for key in ("history", "probe"):
            steps = [
                Step(lambda _p: output, name=f"s{i}", writes=f"{key}:w{i}") for i in range(n_steps)
            ]
            agent = Agent(engine=Plan(*steps, store=store, checkpoint_key=key))
            if key == "probe":
                with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as probe:
                    probe.execute("PRAGMA wal_checkpoint(RESTART)")  # the next run: from 0
            assert agent("go").ok
        commits = wal_commits(path)[1:]  # without the claim
    return sum(commits) / len(commits)


def raw_pages_per_commit(tmp: Path) -> float:
    path = tmp / "raw-pages.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    for i in range(100):
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"h{i}", PAYLOAD))
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    for i in range(60):
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", PAYLOAD))
    commits = wal_commits(path)
    conn.close()
    return sum(commits) / len(commits)


def trivial(payload: Any) -> str:
    return PAYLOAD


def timed_run(store: Store, n_steps: int, key: str, writes: bool = True) -> float:
    """ms per step of one durable run of ``n_steps`` trivial steps on ``store``, each
    output also stored under a ``writes=`` key (or, ``writes=False``, only journaled)."""
    steps = [
        Step(trivial, name=f"s{i}", writes=f"{key}:w{i}" if writes else None)
        for i in range(n_steps)
    ]
    agent = Agent(engine=Plan(*steps, store=store, checkpoint_key=key, max_iterations=n_steps + 1))
    t0 = time.perf_counter()
    env = agent("go")
    elapsed = time.perf_counter() - t0
    assert env.ok, env.error
    return elapsed * 1000 / n_steps


OPEN_MS: list[float] = []


def plan_run(
    path: Path, n_steps: int, durability: str = "full", writes: bool = True
) -> tuple[float, int]:
    """(ms per step, database bytes) of one run on a new database file."""
    t0 = time.perf_counter()
    store = Store(db=path, durability=durability)  # type: ignore[arg-type]
    if durability == "full" and writes:
        OPEN_MS.append((time.perf_counter() - t0) * 1000)
    ms = timed_run(store, n_steps, "bench", writes)
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return ms, path.stat().st_size


def paired_ratio(tmp: Path, n_steps: int, run: Any) -> tuple[float, float]:
    """(ms per step, ratio to the raw FULL commit) of ``run()``, whose raw commit is
    measured on new files right before and right after it."""
    raw_n = max(n_steps, 50)
    tag = len(list(tmp.glob("paired-*")))
    before = raw_commit_ms(tmp / f"paired-{tag}-a.sqlite", "FULL", n=raw_n)
    ms = run()
    after = raw_commit_ms(tmp / f"paired-{tag}-b.sqlite", "FULL", n=raw_n)
    return ms, ms / ((before + after) / 2)


def memory_run_ms(n_steps: int) -> float:
    """ms per step of the same plan without a store (engine + step call only)."""
    steps = [Step(trivial, name=f"s{i}", writes=f"w{i}") for i in range(n_steps)]
    agent = Agent(engine=Plan(*steps, max_iterations=n_steps + 1))
    t0 = time.perf_counter()
    agent("go")
    return (time.perf_counter() - t0) * 1000 / n_steps


class Echo:
    """An engine that does nothing: what is left is the sync call itself."""

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        return env


async def on_new_loop(coro: Coroutine[Any, Any, Envelope[Any]]) -> Envelope[Any]:
    """A sync call's coroutine as it ran before sync calls reused their thread's loop:
    under ``asyncio.run`` (a new loop per call), marked as a sync call's private loop so
    that sync steps still run inline."""
    call = _Call()
    asyncio.get_running_loop().set_task_factory(call.factory)
    call.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
    _PRIVATE_TASKS.set(call)
    return await coro


def sync_call_us(calls: int) -> dict[str, tuple[float, float]]:
    """Median microseconds per sync call, (reused loop, new loop per call), of a 10-step
    durable Plan on an in-memory store and of an engine that does nothing; the two ways
    alternate call by call."""
    store = Store()
    times: dict[str, tuple[list[float], list[float]]] = {"plan": ([], []), "echo": ([], [])}
    echo = Agent(engine=Echo())
    for i in range(calls):
        for way in (0, 1):
            key = f"sync-{way}-{i}"
            steps = [Step(trivial, name=f"s{n}", writes=f"{key}:w{n}") for n in range(10)]
            plan = Agent(engine=Plan(*steps, store=store, checkpoint_key=key, max_iterations=11))
            for name, agent in (("plan", plan), ("echo", echo)):
                t0 = time.perf_counter()
                env = agent("go") if way == 0 else asyncio.run(on_new_loop(agent.run("go")))
                times[name][way].append((time.perf_counter() - t0) * 1e6)
                assert env.ok, env.error
    return {k: (statistics.median(r), statistics.median(n)) for k, (r, n) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement (median)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepstone-bench-") as tmp:
        measure(Path(tmp), args.repeat)


def measure(tmp: Path, repeat: int) -> None:
    """Every measurement, printed; files go under ``tmp``."""
    plan_run(tmp / "warm-up.sqlite", 10)  # the process's first-run costs (threads, caches)
    # A long-lived store that already holds runs, as a pipeline process keeps it: its WAL
    # has stopped growing (a fresh file's WAL grows on every commit, and each growth makes
    # the fsync write file metadata too; closing the last connection deletes the WAL).
    warm = Store(db=tmp / "warm.sqlite")
    timed_run(warm, 1000, "history")
    raw_full = statistics.median(
        raw_commit_ms(tmp / f"raw-full-{r}.sqlite", "FULL") for r in range(repeat)
    )
    raw_normal = statistics.median(
        raw_commit_ms(tmp / f"raw-normal-{r}.sqlite", "NORMAL") for r in range(repeat)
    )
    raw_warm = statistics.median(
        raw_commit_ms(tmp / f"raw-warm-{r}.sqlite", "FULL", warm=True) for r in range(repeat)
    )
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"raw SQLite commit of a ~1 KB row: FULL {raw_full:.3f} ms   NORMAL {raw_normal:.3f} ms")
    print(
        f"(the raw FULL commit on a new file, whose WAL grows with each commit; on a WAL that "
        f"no longer grows: {raw_warm:.3f} ms)"
    )
    empty = tmp / "empty.sqlite"
    Store(db=empty).close()  # the schema alone: pages every store has, whatever it holds
    with contextlib.closing(sqlite3.connect(empty)) as conn, conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    fixed_bytes = empty.stat().st_size
    print()
    print(
        f"{'steps':>6} {'FULL new':>11} {'x raw':>6} {'FULL open':>10} {'x raw':>6} "
        f"{'NORMAL':>7} {'x raw':>6} {'no store':>9} {'bytes/step':>11} {'x payload':>10}"
    )
    per_step: dict[int, float] = {}
    warm_step: dict[int, float] = {}
    ratio: dict[int, float] = {}
    warm_ratio: dict[int, float] = {}
    for n in (10, 100, 1000):
        sizes: list[int] = []

        def new_file(n: int = n, sizes: list[int] = sizes) -> float:
            ms, size = plan_run(tmp / f"plan-{n}-{len(sizes)}.sqlite", n)
            sizes.append(size)
            return ms

        full = [paired_ratio(tmp, n, new_file) for _ in range(repeat)]
        warm_runs = [
            paired_ratio(tmp, n, lambda n=n, r=r: timed_run(warm, n, f"warm-{n}-{r}"))
            for r in range(repeat)
        ]
        normal_runs = [plan_run(tmp / f"plan-n-{n}-{r}.sqlite", n, "normal") for r in range(repeat)]
        ms_full = statistics.median(ms for ms, _ in full)
        warm_full = statistics.median(ms for ms, _ in warm_runs)
        ms_normal = statistics.median(ms for ms, _ in normal_runs)
        mem = statistics.median(memory_run_ms(n) for _ in range(repeat))
        step_bytes = (sizes[0] - fixed_bytes) / n
        per_step[n], warm_step[n] = ms_full, warm_full
        ratio[n] = statistics.median(r for _, r in full)
        warm_ratio[n] = statistics.median(r for _, r in warm_runs)
        print(
            f"{n:>6} {ms_full:>11.3f} {ratio[n]:>6.2f} {warm_full:>10.3f} "
            f"{warm_ratio[n]:>6.2f} {ms_normal:>7.3f} {ms_normal / raw_normal:>6.2f} "
            f"{mem:>9.3f} {step_bytes:>11.0f} {step_bytes / len(PAYLOAD):>10.2f}"
        )
    print()
    # Each run also pays a fixed cost (the claim commit, loop start-up): split it out.
    marginal = (per_step[1000] * 1000 - per_step[10] * 10) / 990
    fixed = per_step[10] * 10 - marginal * 10
    print(f"schema pages of an empty store: {fixed_bytes} bytes (not counted above)")
    print(
        f"opening a new store (schema, 512 KB of WAL preallocated and synced; not counted "
        f"above): median {statistics.median(OPEN_MS):.2f} ms"
    )
    print(
        f"marginal cost of one more step (FULL): {marginal:.3f} ms = "
        f"{marginal / raw_full:.2f}x raw commit; fixed cost per run: {fixed:.2f} ms"
    )
    print(
        f"per-step cost ratio 1000 vs 10 steps: new file {per_step[1000] / per_step[10]:.2f}, "
        f"open store {warm_step[1000] / warm_step[10]:.2f}  (target <= 1.2)"
    )
    for n, ms in per_step.items():
        print(
            f"per-step cost at {n:>4} steps vs the raw FULL commit measured around each run "
            f"(median of {repeat}): new file {ratio[n]:.2f}x, open store {warm_ratio[n]:.2f}x "
            f"(target <= 1.5); vs the raw commit on a WAL that no longer grows: "
            f"{ms / raw_warm:.2f}x, {warm_step[n] / raw_warm:.2f}x"
        )
    # The same steps without writes=: each 1 KB output is journaled only (one 1 KB row
    # per step, as the raw commit writes, where writes= adds a second).
    plain = {
        n: statistics.median(
            r
            for _, r in (
                paired_ratio(
                    tmp,
                    n,
                    lambda n=n, r=r: plan_run(tmp / f"plain-{n}-{r}.sqlite", n, writes=False)[0],
                )
                for r in range(repeat)
            )
        )
        for n in (10, 100)
    }
    print(
        "without writes= (each output journaled only), FULL, new file, vs the raw commit "
        "measured around each run: "
        + ", ".join(f"{n} steps {v:.2f}x" for n, v in plain.items())
        + " (target <= 1.5)"
    )
    (plan, plan_new), (echo, echo_new) = sync_call_us(300 * repeat).values()
    print(
        f"sync call (agent(task)) on the thread's reused loop vs a new loop per call "
        f"(asyncio.run): 10-step in-memory Plan {plan:.0f} vs {plan_new:.0f} us "
        f"({plan / plan_new:.2f}x); engine doing nothing {echo:.0f} vs {echo_new:.0f} us "
        f"({echo / echo_new:.2f}x)"
    )
    pages = {size: pages_per_step_commit(tmp, size) for size in (100, 1000, 10_000)}
    print(
        "database pages (WAL frames) per step commit: "
        + ", ".join(f"{v:.2f} with {k} B outputs" for k, v in pages.items())
        + f"; the raw 1 KB commit: {raw_pages_per_commit(tmp):.2f}"
    )


if __name__ == "__main__":
    main()
