"""Fan-out from threads on SQLite: runs on many threads of one process share commits.

Measured in this one run, ``synchronous=FULL``, in ``--rounds`` rounds (each on new files;
medians reported, the machine's noise cancels in the ratios of one round):

* sequential: 200 runs of a 10-step durable Plan (trivial sync steps) with
  ``on_concurrent="fork"``, the Agent called once per run, one call after another;
* threads: the same 200 calls of the same Agent from a ``ThreadPoolExecutor(8)``: each
  thread runs the sync API on its own private loop, and the commits and claims that the
  threads make at the same moment share one transaction and one fsync;
* ``arun_many``: the same 200 runs through ``plan.arun_many(..., concurrency=8)`` on one
  loop (the loop's group commit);
* every run's result is checked, and every run's record is ``done``;
* CPU ms per run: the process's CPU time over the runs (fsyncs shared are system time
  saved).

Then a lone run, A/B: one 100-step run at a time in a new process, alternately with this
checkout's code and with ``--baseline-src`` (an older checkout's ``src/``), ``--lone-rounds``
pairs: ms and CPU ms per step, ``synchronous=FULL`` and ``NORMAL`` (no fsync: the Python
path alone). Without ``--baseline-src`` both sides run this code (the noise floor). The
same A/B in one process (no noise between processes): lone runs alternately through the
turns and with the kernel's commits and claims sent straight to the backend, CPU per step;
and one commit's CPU both ways.

Targets: threads >= 2x sequential, ``arun_many`` >= 2.5x sequential, the lone run's
per-step time within 5% of the baseline's.

    python bench/sqlite_threads.py [--runs 200] [--steps 10] [--threads 8] [--rounds 3]
        [--baseline-src OLD_CHECKOUT/src] [--lone-rounds 7] [--lone-steps 100] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"


def add_one(x: int) -> int:
    return x + 1


def raw_commit_ms(path: Path, n: int = 200) -> float:
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


def _check(store: Any, tag: str, envs: list[Any], runs: int, steps: int) -> None:
    assert [e.payload for e in envs] == [i + steps for i in range(runs)], envs[:3]
    heads = store.backend.run_list(f"{tag}:")
    assert len(heads) == runs and {h.status for h in heads} == {"done"}, len(heads)


def counting_store(path: Path) -> Any:
    """A ``Store`` on a SQLite file whose backend counts its write transactions (each
    one fsync): ``store.backend.txs``."""
    import threading
    from collections.abc import Iterator
    from contextlib import contextmanager

    from stepstone import Store
    from stepstone.store._sqlite import SQLiteBackend

    class Counting(SQLiteBackend):
        def __init__(self, path: Path) -> None:
            self.txs, self.count_lock = 0, threading.Lock()
            super().__init__(path)

        @contextmanager
        def _tx(self, *, flush: bool = True) -> Iterator[Any]:
            if flush:  # a claim's inner transaction (flush=False) is counted once
                with self.count_lock:
                    self.txs += 1
            with super()._tx(flush=flush) as conn:
                yield conn

    return Store(backend=Counting(path))


Measure = tuple[float, float, float]  # runs/s, CPU ms per run, transactions per run


def fan_out(path: Path, how: str, runs: int, steps: int, threads: int) -> Measure:
    """Runs/s, CPU ms per run and write transactions per run of ``runs`` runs of a
    ``steps``-step Plan, ``how``: ``sequential``, ``threads`` or ``arun_many``."""
    from stepstone import Agent, Envelope, Plan, Step

    with counting_store(path) as store:
        plan = Plan(
            *[Step(add_one, name=f"s{i}") for i in range(steps)],
            store=store,
            checkpoint_key=how,
            on_concurrent="fork",
        )
        agent = Agent(engine=plan)
        tasks = [Envelope(task="t", payload=i) for i in range(runs)]
        t0, c0, txs = time.perf_counter(), time.process_time(), store.backend.txs
        if how == "sequential":
            envs = [agent(task) for task in tasks]
        elif how == "threads":
            with ThreadPoolExecutor(threads) as pool:
                envs = list(pool.map(agent, tasks))
        else:
            envs = asyncio.run(plan.arun_many(list(tasks), concurrency=threads))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        txs = store.backend.txs - txs
        _check(store, how, envs, runs, steps)
    return runs / wall, cpu * 1000 / runs, txs / runs


def engines(path: Path, what: str, how: str, runs: int, threads: int) -> Measure:
    """Runs/s of ``runs`` runs of ``what`` (``graph``: a 10-node graph invoked with a
    store checkpointer; ``agent``: a durable agent run of ``Runner.run_sync``, a model
    turn calling a tool, the tool, a final model turn; ``agent-memory``: the same on the
    in-memory store, no SQL and no fsync), ``how``: ``sequential`` or
    ``threads``; every result checked. As :func:`fan_out`."""
    from stepstone import Agent, Runner, Store, tool
    from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer
    from stepstone.testing import FunctionModel, call

    class Count(State):
        n: int = 0

    def bump(state: Count) -> dict[str, int]:
        return {"n": state.n + 1}

    @tool
    def echo(x: str) -> str:
        """Echo x."""
        return x

    def reply(request: Any) -> Any:
        return call("echo", x="hi") if request.turn == 0 else "done"

    with counting_store(path) if what != "agent-memory" else Store() as store:
        one: Any
        if what == "graph":
            builder = GraphBuilder(Count)
            for i in range(10):
                builder.add_node(f"n{i}", bump)
                builder.add_edge(f"n{i}", f"n{i + 1}" if i < 9 else END)
            graph = (
                builder.set_entry("n0")
                .with_checkpointer(StoreCheckpointer(store, prefix=f"{how}:"))
                .compile()
            )

            def one(i: int) -> Any:
                return graph.invoke(Count(n=i)).n == i + 10

        else:
            agent = Agent(name="echoer", model=FunctionModel(reply), tools=[echo])
            runner = Runner(store=store)

            def one(i: int) -> Any:
                got = runner.run_sync(agent, user_message=f"m{i}", run_id=f"{how}-{i}")
                return got.state == "completed" and got.final_text == "done"

        counted = getattr(store.backend, "txs", 0)
        t0, c0 = time.perf_counter(), time.process_time()
        if how == "sequential":
            ok = [one(i) for i in range(runs)]
        else:
            with ThreadPoolExecutor(threads) as pool:
                ok = list(pool.map(one, range(runs)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        txs = getattr(store.backend, "txs", 0) - counted
        assert all(ok) and len(ok) == runs, ok
    return runs / wall, cpu * 1000 / runs, txs / runs


def _user_cpu() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def lone_child(steps: int, repeat: int) -> None:
    """In a new process: ms, CPU ms and user CPU ms per step of lone ``steps``-step runs
    (median of ``repeat``), FULL and NORMAL; prints JSON."""
    import stepstone
    from stepstone import Agent, Envelope, Plan, Step, Store

    out: dict[str, Any] = {"src": str(Path(stepstone.__file__).resolve().parent.parent)}
    with tempfile.TemporaryDirectory() as tmp:
        for durability in ("full", "normal"):
            samples = []
            for r in range(repeat + 1):  # the first warms up
                path = Path(tmp) / f"{durability}-{r}.sqlite"
                with Store(db=path, durability=durability) as store:  # type: ignore[arg-type]
                    plan = Plan(
                        *[Step(add_one, name=f"s{i}") for i in range(steps)],
                        store=store,
                        checkpoint_key="lone",
                        max_iterations=steps + 1,
                    )
                    agent = Agent(engine=plan)
                    t0, c0, u0 = time.perf_counter(), time.process_time(), _user_cpu()
                    env = agent(Envelope(task="t", payload=0))
                    took = (time.perf_counter() - t0, time.process_time() - c0, _user_cpu() - u0)
                    assert env.ok and env.payload == steps, env
                if r:
                    samples.append([x * 1000 / steps for x in took])
            out[durability] = [statistics.median(s[i] for s in samples) for i in range(3)]
    print(json.dumps(out))


def lone(src: str, steps: int, repeat: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, str(HERE), "--lone-child", str(steps), str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["src"]) != Path(src).resolve():
        raise SystemExit(f"the child imported stepstone from {result['src']}, not {src}")
    return result


def turn_cost(rounds: int = 9, n: int = 2000) -> tuple[float, float]:
    """CPU us per commit of one run, NORMAL (no fsync): the backend's ``run_commit``
    called directly (what a lone run did before) against the same commit through the
    backend's turns (what it does now), alternating, in this process."""
    from stepstone import Store
    from stepstone.durable import claim_run
    from stepstone.durable._group import shared_commit

    with (
        tempfile.TemporaryDirectory() as tmp,
        Store(db=Path(tmp) / "turn.sqlite", durability="normal") as store,
    ):
        claimed = claim_run(store, "k", kind="bench", resume=False, first_step="a")
        run = claimed.run
        assert run is not None
        backend = store.backend

        def commits(shared: bool) -> float:
            c0 = time.process_time()
            for i in range(n):
                new, rows, encoded = run._prepare("running", "a", None, None, [("s", "a", i)], [])
                item = (new, run.head.version, rows, encoded)
                assert shared_commit(backend, item) if shared else backend.run_commit(*item)
                run.head = new
            return (time.process_time() - c0) * 1e6 / n

        direct, turned = [], []
        for _ in range(rounds):
            direct.append(commits(False))
            turned.append(commits(True))
        run.release()
    return statistics.median(direct), statistics.median(turned)


def lone_in_process(steps: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    """The lone run's A/B in this one process, where the noise of separate processes is
    gone: lone ``steps``-step runs, alternately as they are (their commits and claims
    through the backend's turns) and with the kernel's two entry points into the turns
    swapped for the backend's own ``run_commit``/``run_claim`` (what a lone run did
    before). Per durability: (ms per step with the turns, without, median of the
    rounds' ratios), CPU time."""
    from stepstone import Agent, Envelope, Plan, Step, Store
    from stepstone.durable import _kernel

    shared = (_kernel.shared_commit, _kernel.shared_claim)
    direct = (
        lambda backend, item: backend.run_commit(*item),
        lambda backend, key, decide: backend.run_claim(key, decide),
    )
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for durability in ("full", "normal"):
            took: dict[bool, list[float]] = {True: [], False: []}
            n = rounds if durability == "full" else 4 * rounds  # a NORMAL run is quick
            for r in range(2 * n + 2):  # the first pair warms up
                turned = r % 2 == (r // 2) % 2  # ABBA order
                _kernel.shared_commit, _kernel.shared_claim = shared if turned else direct
                try:
                    with Store(
                        db=Path(tmp) / f"{durability}-{r}.sqlite", durability=durability
                    ) as store:  # type: ignore[arg-type]
                        plan = Plan(
                            *[Step(add_one, name=f"s{i}") for i in range(steps)],
                            store=store,
                            checkpoint_key="lone",
                            max_iterations=steps + 1,
                        )
                        agent = Agent(engine=plan)
                        c0 = time.process_time()
                        env = agent(Envelope(task="t", payload=0))
                        cpu = time.process_time() - c0
                        assert env.ok and env.payload == steps, env
                finally:
                    _kernel.shared_commit, _kernel.shared_claim = shared
                if r >= 2:
                    took[turned].append(cpu * 1000 / steps)
            ratios = [a / b for a, b in zip(took[True], took[False], strict=True)]
            out[durability] = (
                statistics.median(took[True]),
                statistics.median(took[False]),
                statistics.median(ratios),
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-src", help="an older checkout's src/, for the lone run's A/B")
    parser.add_argument("--lone-rounds", type=int, default=7)
    parser.add_argument("--lone-steps", type=int, default=100)
    parser.add_argument("--lone-repeat", type=int, default=3, help="runs per sample")
    parser.add_argument("--engine-runs", type=int, default=100)
    parser.add_argument(
        "--dir", help="where the fan-out's files go (default: the temp dir; /dev/shm: no disk)"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["fanout", "engines", "lone"])
    parser.add_argument("--lone-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lone_child:
        lone_child(*args.lone_child)
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, synchronous=FULL")
    print(f"{os.cpu_count()} cpus, load average {load:.1f}")
    if "fanout" not in args.skip:
        run_fan_out(args)
    if "engines" not in args.skip:
        run_engines(args)
    if "lone" not in args.skip:
        run_lone(args)


def _cell(m: Measure, base: Measure | None = None) -> str:
    ratio = f" {m[0] / base[0]:>5.2f}x" if base is not None else ""
    return f"{m[0]:>6.1f} r/s{ratio} {m[1]:>4.2f} cpu {m[2]:>5.2f} tx"


def run_engines(args: argparse.Namespace) -> None:
    runs, threads = args.engine_runs, args.threads
    rows: dict[str, list[tuple[Measure, Measure]]] = {"graph": [], "agent": [], "agent-memory": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for what in rows:  # warm-up
            for how in ("sequential", "threads"):
                engines(Path(tmp) / f"warm-{what}-{how}.sqlite", what, how, 8, threads)
        for r in range(args.rounds):
            for what, got in rows.items():
                order = ["sequential", "threads"][:: -1 if r % 2 else 1]
                m = {
                    h: engines(Path(tmp) / f"{what}-{h}{r}", what, h, runs, threads) for h in order
                }
                got.append((m["sequential"], m["threads"]))
    print()
    print(
        f"{runs} runs one after another and from ThreadPoolExecutor({threads}); graph: "
        "graph.invoke of 10 nodes; agent: Runner.run_sync, a model turn calling a tool, the "
        "tool, a final model turn; agent-memory: the same on the in-memory store; every result "
        "checked"
    )
    print(f"{'':>12} {'round':>5} {'sequential':>30} {'threads':>37}")
    for what, got in rows.items():
        for r, (seq, thr) in enumerate(got):
            print(f"{what:>12} {r:>5} {_cell(seq):>30} {_cell(thr, seq):>37}")
        median = statistics.median(t[0] / s[0] for s, t in got)
        print(f"{what:>12} median ratio threads / sequential: {median:.2f}x")
    print("(cpu: CPU ms per run, the whole process; tx: write transactions per run)")


def run_fan_out(args: argparse.Namespace) -> None:
    runs, steps, threads = args.runs, args.steps, args.threads
    rows = []
    hows = ["sequential", "threads", "arun_many"]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for how in hows:  # warm-up: threads, imports
            fan_out(Path(tmp) / f"warm-{how}.sqlite", how, 10, steps, threads)
        for r in range(args.rounds):
            raw = raw_commit_ms(Path(tmp) / f"raw-{r}.sqlite")
            order = hows[r % 3 :] + hows[: r % 3]  # each mode first in one round of three
            m = {h: fan_out(Path(tmp) / f"{h}-{r}.sqlite", h, runs, steps, threads) for h in order}
            rows.append((raw, m["sequential"], m["threads"], m["arun_many"]))
    print()
    print(
        f"{runs} runs x {steps} steps, Plan(on_concurrent='fork'); threads: "
        f"ThreadPoolExecutor({threads}) calling the Agent; arun_many: concurrency {threads}; "
        "every result checked"
    )
    print(f"{'round':>5} {'raw commit':>10} {'sequential':>30} {'threads':>37} {'arun_many':>37}")
    for r, (raw, seq, thr, many) in enumerate(rows):
        print(
            f"{r:>5} {raw:>7.3f} ms {_cell(seq):>30} {_cell(thr, seq):>37} {_cell(many, seq):>37}"
        )
    thr_ratio = statistics.median(row[2][0] / row[1][0] for row in rows)
    many_ratio = statistics.median(row[3][0] / row[1][0] for row in rows)
    print(f"median ratio threads / sequential: {thr_ratio:.2f}x (target >= 2)")
    print(f"median ratio arun_many / sequential: {many_ratio:.2f}x (target >= 2.5)")
    print("(cpu: CPU ms per run, the whole process; tx: write transactions (fsyncs) per run)")


def run_lone(args: argparse.Namespace) -> None:
    new_src = str(SRC)
    old_src = args.baseline_src or new_src
    pairs = []
    for r in range(args.lone_rounds):
        order = [(new_src, "new"), (old_src, "old")]
        if r % 2:
            order.reverse()
        got = {name: lone(src, args.lone_steps, args.lone_repeat) for src, name in order}
        pairs.append((got["new"], got["old"]))
    print()
    print(
        f"a lone {args.lone_steps}-step run, {args.lone_rounds} pairs of processes "
        f"(median of {args.lone_repeat} runs each); new: {new_src}, old: {old_src}"
    )
    print(f"{'':>7} {'per step':>9} {'new':>9} {'old':>9} {'new/old':>8} {'spread over pairs':>19}")
    for durability in ("full", "normal"):
        for i, what in enumerate(("wall ms", "CPU ms", "user ms")):
            new = statistics.median(p[0][durability][i] for p in pairs)
            old = statistics.median(p[1][durability][i] for p in pairs)
            ratios = [p[0][durability][i] / p[1][durability][i] for p in pairs]
            print(
                f"{durability:>7} {what:>9} {new:>9.4f} {old:>9.4f} "
                f"{statistics.median(ratios):>8.3f} {min(ratios):>9.3f}-{max(ratios):.3f}"
            )
    print("(new/old: median of the pairs' ratios; target: within 5%)")
    inproc = lone_in_process(args.lone_steps, args.lone_rounds * 3)
    print(
        f"the same in this process, alternating ({args.lone_rounds * 3} runs each way FULL, "
        f"{args.lone_rounds * 12} NORMAL): CPU ms per step with the turns, without, "
        "median ratio"
    )
    for durability, (with_turns, without, ratio) in inproc.items():
        print(f"{durability:>7} {with_turns:>9.4f} {without:>9.4f} {ratio:>8.3f}")
    direct, turned = turn_cost()
    extra = turned - direct
    print(
        f"one commit, NORMAL, in this process: {direct:.1f} us of CPU called directly, "
        f"{turned:.1f} us through the turns (+{extra:.1f} us: "
        f"{100 * extra / (inproc['normal'][1] * 1000):.1f}% of a NORMAL step's CPU, "
        f"{100 * extra / (inproc['full'][1] * 1000):.1f}% of a FULL one's)"
    )


if __name__ == "__main__":
    main()
