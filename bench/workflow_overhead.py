"""Durable functions (``@workflow`` / ``@step``) on SQLite, as ratios measured in one run.

1. **Per-step overhead.** A workflow of 100 trivial steps (each returns its int argument),
   run inline (``run_sync``) on a new SQLite file with ``synchronous=FULL``: wall time per
   step, as a multiple of a raw commit of a ~1 KB row (``BEGIN IMMEDIATE; INSERT; COMMIT``,
   WAL, FULL) measured on new files right before and right after it (the VM's fsync cost
   drifts). The same workflow under DBOS (``@DBOS.workflow`` / ``@DBOS.step``, its SQLite
   system database) is measured in the same run, paired the same way; the report gives
   both ratios and how many times less overhead per step stepstone has. DBOS is optional:
   ``pip install dbos`` (not a dependency of stepstone). Target: <= 1.3x the raw commit;
   goal: >= 5x less overhead than DBOS.
2. **Resume of a long run.** A 10,000-step workflow whose process stops after its last
   step (built with ``durability="normal"`` to save time; the resume reads the same
   journal either way) is run again: milliseconds from the call to the start of the first
   new step (one claim, one read of the journal, 10,000 replayed steps). Target: <= 150 ms.
3. **Concurrent runs.** 1,000 workflows of 10 steps started together in one process
   (``asyncio.gather`` of ``run()``), on one SQLite file with FULL: runs per second against
   the same workflows run one after another (the group commit writes the steps of many
   runs in one transaction), every result checked.

    python bench/workflow_overhead.py [--repeat 5] [--no-dbos]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepstone import Store, step, workflow

PAYLOAD = "x" * 1000


def raw_commit_ms(path: Path, n: int = 100) -> float:
    """Milliseconds per single-row (~1 KB) committed transaction on a new WAL file, FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", PAYLOAD))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed * 1000 / n


@step
def trivial(i: int) -> int:
    return i


@workflow
async def steps(n: int) -> int:
    total = 0
    for i in range(n):
        total += await trivial(i)
    return total


FIRST_NEW: list[float] = []
CRASH = [True]  # whether long_run's process "stops" after its last step


@step
def first_new() -> str:
    FIRST_NEW.append(time.perf_counter())
    FIRST_NEW.append(time.process_time())
    return "new"


@workflow
async def long_run(n: int) -> str:
    for i in range(n):
        await trivial(i)
    if CRASH[0]:
        raise KeyboardInterrupt  # the process stops after its last step
    return str(await first_new())


CPU: dict[str, list[float]] = {"stepstone": [], "dbos": []}  # CPU ms per step, per run


def stepstone_ms(path: Path, n: int) -> float:
    store = Store(db=path)
    t0, c0 = time.perf_counter(), time.process_time()
    assert steps.using(store=store, key="bench").run_sync(n) == n * (n - 1) // 2
    ms = (time.perf_counter() - t0) * 1000 / n
    CPU["stepstone"].append((time.process_time() - c0) * 1000 / n)
    store.close()
    return ms


class Dbos:
    """The same workflow under DBOS, on a SQLite system database in ``folder``."""

    def __init__(self, folder: Path) -> None:
        from dbos import DBOS, SetWorkflowID

        self.set_id = SetWorkflowID
        DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{folder}/dbos.sqlite"})

        @DBOS.step()
        def dbos_trivial(i: int) -> int:
            return i

        @DBOS.workflow()
        def dbos_steps(n: int) -> int:
            total = 0
            for i in range(n):
                total += dbos_trivial(i)
            return total

        self.workflow = dbos_steps
        self.dbos = DBOS
        DBOS.launch()
        self.runs = 0

    def ms(self, n: int) -> float:
        self.runs += 1
        t0, c0 = time.perf_counter(), time.process_time()
        with self.set_id(f"bench-{self.runs}"):
            assert self.workflow(n) == n * (n - 1) // 2
        CPU["dbos"].append((time.process_time() - c0) * 1000 / n)
        return (time.perf_counter() - t0) * 1000 / n

    def close(self) -> None:
        self.dbos.destroy()


def paired(tmp: Path, run: Any, n: int) -> tuple[float, float]:
    """(ms per step of ``run()``, its ratio to the raw FULL commit measured on new files
    right before and right after it)."""
    tag = len(list(tmp.glob("raw-*")))
    before = raw_commit_ms(tmp / f"raw-{tag}-a.sqlite", max(n, 50))
    ms = run()
    after = raw_commit_ms(tmp / f"raw-{tag}-b.sqlite", max(n, 50))
    return ms, ms / ((before + after) / 2)


def overhead(tmp: Path, repeat: int, with_dbos: bool) -> None:
    n = 100
    stepstone_ms(tmp / "warm.sqlite", 10)  # first-run costs (threads, caches)
    dbos = Dbos(tmp) if with_dbos else None
    if dbos is not None:
        dbos.ms(10)
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    try:
        for r in range(repeat):
            ours.append(paired(tmp, lambda r=r: stepstone_ms(tmp / f"wf-{r}.sqlite", n), n))
            if dbos is not None:
                theirs.append(paired(tmp, lambda: dbos.ms(n), n))
    finally:
        if dbos is not None:
            dbos.close()
    CPU["stepstone"] = CPU["stepstone"][-repeat:]
    CPU["dbos"] = CPU["dbos"][-repeat:]
    ms, ratio = statistics.median(m for m, _ in ours), statistics.median(x for _, x in ours)
    spread = f"{min(x for _, x in ours):.2f}-{max(x for _, x in ours):.2f}"
    cpu = statistics.median(CPU["stepstone"])
    print(
        f"stepstone, 100-step workflow, FULL: {ms:.3f} ms/step = {ratio:.2f}x raw ({spread}), "
        f"CPU {cpu:.3f} ms/step"
    )
    if theirs:
        dms, dratio = (
            statistics.median(m for m, _ in theirs),
            statistics.median(x for _, x in theirs),
        )
        dspread = f"{min(x for _, x in theirs):.2f}-{max(x for _, x in theirs):.2f}"
        dcpu = statistics.median(CPU["dbos"])
        print(
            f"DBOS, same workflow, SQLite:        {dms:.3f} ms/step = {dratio:.2f}x raw "
            f"({dspread}), CPU {dcpu:.3f} ms/step ({dcpu / cpu:.1f}x stepstone's)"
        )
        ours_over, dbos_over = ms - ms / ratio, dms - dms / dratio  # per step, over raw
        more = f"{dbos_over / ours_over:.0f}x" if ours_over > 0.005 else "n/a (ours is ~0)"
        print(
            f"  -> DBOS takes {dms / ms:.1f}x the time per step; time per step beyond the raw "
            f"commit: stepstone {ours_over:.3f} ms, DBOS {dbos_over:.3f} ms ({more} more)"
        )


def resume(tmp: Path, repeat: int) -> None:
    n = 10_000
    times: list[float] = []
    cpu: list[float] = []
    for r in range(repeat):
        path = tmp / f"long-{r}.sqlite"
        CRASH[0] = True
        with Store(db=path, durability="normal") as store:
            try:
                long_run.using(store=store, key="long").run_sync(n)
            except KeyboardInterrupt:
                pass
        CRASH[0] = False
        with Store(db=path) as store:
            FIRST_NEW.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            assert long_run.using(store=store, key="long").run_sync(n) == "new"
            times.append((FIRST_NEW[0] - t0) * 1000)
            cpu.append((FIRST_NEW[1] - c0) * 1000)
    print(
        f"resume of a {n:,}-step run to its first new step: median "
        f"{statistics.median(times):.0f} ms ({min(times):.0f}-{max(times):.0f}), CPU "
        f"{statistics.median(cpu):.0f} ms ({min(cpu):.0f}-{max(cpu):.0f})"
    )


def concurrent(tmp: Path) -> None:
    runs, n = 1000, 10

    async def together(store: Store) -> list[int]:
        return list(
            await asyncio.gather(
                *(steps.using(store=store, key=f"c-{i}").run(n) for i in range(runs))
            )
        )

    with Store(db=tmp / "many.sqlite") as store:
        t0 = time.perf_counter()
        results = asyncio.run(together(store))
        par = time.perf_counter() - t0
    assert results == [n * (n - 1) // 2] * runs
    seq_runs = 100
    with Store(db=tmp / "seq.sqlite") as store:
        t0 = time.perf_counter()
        for i in range(seq_runs):
            assert steps.using(store=store, key=f"s-{i}").run_sync(n) == n * (n - 1) // 2
        seq = time.perf_counter() - t0
    print(
        f"{runs} concurrent {n}-step workflows: {runs / par:.0f} runs/s ({par:.1f} s, every "
        f"result checked); one after another: {seq_runs / seq:.0f} runs/s "
        f"-> {(runs / par) / (seq_runs / seq):.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs per measurement (median)")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    parser.add_argument(
        "--only", choices=("overhead", "resume", "concurrent"), help="one measurement"
    )
    args = parser.parse_args()
    with_dbos = not args.no_dbos
    if with_dbos:
        try:
            import dbos  # noqa: F401
        except ImportError:
            print("dbos is not installed (pip install dbos): measuring stepstone alone")
            with_dbos = False
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} "
        f"cpus, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="stepstone-bench-") as tmp:
        if args.only in (None, "overhead"):
            overhead(Path(tmp), args.repeat, with_dbos)
        if args.only in (None, "resume"):
            resume(Path(tmp), max(1, min(args.repeat, 3)))
        if args.only in (None, "concurrent"):
            concurrent(Path(tmp))


if __name__ == "__main__":
    main()
