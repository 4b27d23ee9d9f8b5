"""stepstone beside the systems a user would pick instead, on the same SQLite disk, in one run.

The same pipeline in each system: N trivial steps in a row, each returning a 1 KB string,
each step's output committed to a SQLite file before the next step starts.

* stepstone: a ``Plan`` of N steps on ``Store(db=...)`` (WAL, ``synchronous=FULL``), the
  output journaled once per step (no ``writes=``);
* LangGraph: a ``StateGraph`` of N nodes in a line with ``SqliteSaver`` (WAL, SQLite's
  default ``synchronous=FULL``), invoked with ``durability="sync"`` so that each step's
  checkpoint is written before the next step starts;
* DBOS: a ``@DBOS.workflow`` calling N ``@DBOS.step`` functions, its system database on
  SQLite (as DBOS configures it: rollback journal, ``synchronous=FULL``).

Each system keeps one store file for the whole bench (a long-lived store); every run is a
new run in it. Runs of the systems alternate, round after round, and each run is paired
with raw commits of a 1 KB row (WAL, ``synchronous=FULL``, 50 before and 50 after it), so
the ratio to the raw commit cancels the disk's drift. The figures: the median wall time
per step over the rounds, the median ratio to the raw commit, and the median CPU time per
step of the whole process (all its threads), which a busy disk does not move.

LangGraph and DBOS are not stepstone's dependencies; install them beside it to compare:

    pip install langgraph langgraph-checkpoint-sqlite dbos
    python bench/compare.py [--rounds 7] [--steps 10 100]

A system that is not installed is left out, with a line saying so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepstone import Agent, Plan, Step, Store

PAYLOAD = "x" * 1000
Runner = Callable[[int, str], tuple[float, float]]  # N steps, a new run id -> (wall s, CPU s)


class RawCommit:
    """One committed ~1 KB row on a WAL file with ``synchronous=FULL``: the floor."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        self.seq = 0

    def ms(self, n: int = 50) -> float:
        start = time.perf_counter()
        for _ in range(n):
            self.seq += 1
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO t VALUES (?, ?)", (self.seq, PAYLOAD))
            self.conn.execute("COMMIT")
        return (time.perf_counter() - start) * 1000 / n


def stepstone_runner(path: Path) -> Runner:
    store = Store(db=path)

    def step(_: Any) -> str:
        return PAYLOAD

    def run(n: int, run_id: str) -> float:
        steps = [Step(step, name=f"s{i}") for i in range(n)]
        agent = Agent(engine=Plan(*steps, store=store, checkpoint_key=run_id))
        start, cpu = time.perf_counter(), time.process_time()
        env = agent("go")
        elapsed = time.perf_counter() - start, time.process_time() - cpu
        assert env.ok and env.payload == PAYLOAD, env.error
        return elapsed

    return run


def langgraph_runner(path: Path) -> Runner | str:
    try:
        from typing import TypedDict

        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return "pip install langgraph langgraph-checkpoint-sqlite"

    class S(TypedDict):
        out: str

    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    graphs: dict[int, Any] = {}

    def graph(n: int) -> Any:
        if n not in graphs:
            builder = StateGraph(S)
            prev = START
            for i in range(n):
                builder.add_node(f"s{i}", lambda state: {"out": PAYLOAD})
                builder.add_edge(prev, f"s{i}")
                prev = f"s{i}"
            builder.add_edge(prev, END)
            graphs[n] = builder.compile(checkpointer=saver)
        return graphs[n]

    def run(n: int, run_id: str) -> float:
        app = graph(n)
        config = {"configurable": {"thread_id": run_id}, "recursion_limit": n + 10}
        start, cpu = time.perf_counter(), time.process_time()
        out = app.invoke({"out": ""}, config, durability="sync")
        elapsed = time.perf_counter() - start, time.process_time() - cpu
        assert out["out"] == PAYLOAD
        return elapsed

    return run


def dbos_runner(path: Path) -> Runner | str:
    try:
        from dbos import DBOS, SetWorkflowID
    except ImportError:
        return "pip install dbos"

    @DBOS.step()
    def step(i: int) -> str:
        return PAYLOAD

    @DBOS.workflow()
    def pipeline(n: int) -> str:
        out = ""
        for i in range(n):
            out = step(i)
        return out

    url = f"sqlite:///{path}"
    DBOS(config={"name": "bench-compare", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()

    def run(n: int, run_id: str) -> float:
        with SetWorkflowID(run_id):
            start, cpu = time.perf_counter(), time.process_time()
            out = pipeline(n)
            elapsed = time.perf_counter() - start, time.process_time() - cpu
        assert out == PAYLOAD
        return elapsed

    return run


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    raw = RawCommit(tmp / "raw.sqlite")
    systems: dict[str, Runner] = {"stepstone": stepstone_runner(tmp / "stepstone.sqlite")}
    for name, make in (("LangGraph + SqliteSaver", langgraph_runner), ("DBOS", dbos_runner)):
        made = make(tmp / f"{name.split()[0].lower()}.sqlite")
        if isinstance(made, str):
            print(f"{name}: not installed, left out ({made})")
        else:
            systems[name] = made
    print(
        f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}; "
        f"stepstone {version('stepstone')}, langgraph {version('langgraph')}, "
        f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
        f"dbos {version('dbos')}"
    )
    for name, run in systems.items():  # warm up: imports, first statements, schema
        run(args.steps[0], f"warm-{name}")
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for r in range(args.rounds):
        for n in args.steps:
            for name, run in systems.items():
                before = raw.ms()
                wall, cpu = run(n, f"r{r}-n{n}")
                after = raw.ms()
                per_step = wall * 1000 / n
                got = (per_step, per_step / ((before + after) / 2), cpu * 1000 / n)
                results.setdefault((name, n), []).append(got)
    raws = [raw.ms() for _ in range(3)]
    print(f"raw FULL commit now: {min(raws):.3f}-{max(raws):.3f} ms")
    print("\n| system | steps | ms per step | x raw FULL commit | CPU ms per step |")
    print("|---|---:|---:|---:|---:|")
    for n in args.steps:
        for name in systems:
            rows = results[(name, n)]
            ms = statistics.median(row[0] for row in rows)
            ratio = statistics.median(row[1] for row in rows)
            cpu = statistics.median(row[2] for row in rows)
            print(f"| {name} | {n} | {ms:.2f} | {ratio:.1f}x | {cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
