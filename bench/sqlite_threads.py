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
        [--baseline-src OLD_CHECKOUT/src] [--lone-rounds 7] [--lone-steps 100]
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


def fan_out(path: Path, how: str, runs: int, steps: int, threads: int) -> tuple[float, float]:
    """Runs/s and CPU ms per run of ``runs`` runs of a ``steps``-step Plan, ``how``:
    ``sequential``, ``threads`` or ``arun_many``."""
    from stepstone import Agent, Envelope, Plan, Step, Store

    with Store(db=path) as store:
        plan = Plan(
            *[Step(add_one, name=f"s{i}") for i in range(steps)],
            store=store,
            checkpoint_key=how,
            on_concurrent="fork",
        )
        agent = Agent(engine=plan)
        tasks = [Envelope(task="t", payload=i) for i in range(runs)]
        t0, c0 = time.perf_counter(), time.process_time()
        if how == "sequential":
            envs = [agent(task) for task in tasks]
        elif how == "threads":
            with ThreadPoolExecutor(threads) as pool:
                envs = list(pool.map(agent, tasks))
        else:
            envs = asyncio.run(plan.arun_many(list(tasks), concurrency=threads))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        _check(store, how, envs, runs, steps)
    return runs / wall, cpu * 1000 / runs


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
            for r in range(2 * rounds + 2):  # the first pair warms up
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
    parser.add_argument("--skip", nargs="*", default=[], choices=["fanout", "lone"])
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
    if "lone" not in args.skip:
        run_lone(args)


def run_fan_out(args: argparse.Namespace) -> None:
    runs, steps, threads = args.runs, args.steps, args.threads
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for how in ("sequential", "threads", "arun_many"):  # warm-up: threads, imports
            fan_out(Path(tmp) / f"warm-{how}.sqlite", how, 10, steps, threads)
        for r in range(args.rounds):
            raw = raw_commit_ms(Path(tmp) / f"raw-{r}.sqlite")
            seq = fan_out(Path(tmp) / f"seq-{r}.sqlite", "sequential", runs, steps, threads)
            thr = fan_out(Path(tmp) / f"thr-{r}.sqlite", "threads", runs, steps, threads)
            many = fan_out(Path(tmp) / f"many-{r}.sqlite", "arun_many", runs, steps, threads)
            rows.append((raw, seq, thr, many))
    print()
    print(
        f"{runs} runs x {steps} steps, Plan(on_concurrent='fork'); threads: "
        f"ThreadPoolExecutor({threads}) calling the Agent; arun_many: concurrency {threads}; "
        "every result checked"
    )
    print(f"{'round':>5} {'raw commit':>10} {'sequential':>16} {'threads':>22} {'arun_many':>22}")
    for r, (raw, seq, thr, many) in enumerate(rows):
        print(
            f"{r:>5} {raw:>7.3f} ms {seq[0]:>6.1f} r/s {seq[1]:>4.2f} cpu "
            f"{thr[0]:>6.1f} r/s {thr[0] / seq[0]:>5.2f}x {thr[1]:>4.2f} cpu "
            f"{many[0]:>6.1f} r/s {many[0] / seq[0]:>5.2f}x {many[1]:>4.2f} cpu"
        )
    thr_ratio = statistics.median(row[2][0] / row[1][0] for row in rows)
    many_ratio = statistics.median(row[3][0] / row[1][0] for row in rows)
    print(f"median ratio threads / sequential: {thr_ratio:.2f}x (target >= 2)")
    print(f"median ratio arun_many / sequential: {many_ratio:.2f}x (target >= 2.5)")
    print("(cpu: CPU ms per run, the whole process)")


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
        f"the same in this process, {args.lone_rounds * 3} runs each way, alternating: CPU ms "
        "per step with the turns / without"
    )
    for durability, (with_turns, without, ratio) in inproc.items():
        print(f"{durability:>7} {with_turns:>9.4f} {without:>9.4f} {ratio:>8.3f}")
    direct, turned = turn_cost()
    print(
        f"one commit, NORMAL, in this process: {direct:.1f} us of CPU called directly, "
        f"{turned:.1f} us through the turns (+{turned - direct:.1f} us)"
    )


if __name__ == "__main__":
    main()
