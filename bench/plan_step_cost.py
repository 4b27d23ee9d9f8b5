"""What a durable Plan step costs in Python, on the in-memory store (no SQL, no fsync).

Whatever a database adds, every durable step also pays the engine and the kernel before its
commit reaches the store; this measures exactly that part, with a trivial sync step
function whose ~1 KB output is stored with ``writes=``:

* ``step@100 sync``: ms per step of a 100-step run through ``agent("go")`` (a sync call:
  its private event loop is started once per run);
* ``step@100 async``: the same per step through ``await agent.run(...)`` on one running
  loop (the engine and kernel alone);
* ``run@10 sync`` / ``run@10 async``: ms per 10-step run, the same two ways;
* ``build@10``: ms to construct (and compile) a 10-step ``Plan`` and its ``Agent``;
* ``many@8``: ms per step of 200 runs x 10 steps through ``plan.run_many(...,
  concurrency=8)`` with ``on_concurrent="fork"`` (concurrent runs: sync step functions go
  to worker threads there).

With ``--compare DIR`` (a source tree holding ``DIR/src/stepstone``, e.g. an older commit
checked out with ``git worktree add`` or ``git archive``), the same measurements run
alternately on this tree and on that one, each round in fresh subprocesses, and the table
shows both with their ratio: a before/after comparison within one run, so the machine's
load cancels out in the ratios.

    python bench/plan_step_cost.py [--rounds 5] [--cpu] [--compare /tmp/old-checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PAYLOAD = "x" * 1000


def trivial(payload: Any) -> str:
    return PAYLOAD


def measure(clock: Any = time.perf_counter) -> dict[str, float]:
    """One round of every measurement (milliseconds by ``clock``), in this process."""
    from stepstone import Agent, Envelope, Plan, Step, Store

    store = Store()
    counter = iter(range(10**9))

    def agent_of(n: int) -> Any:
        tag = next(counter)
        steps = [Step(trivial, name=f"s{i}", writes=f"k{tag}:w{i}") for i in range(n)]
        plan = Plan(*steps, store=store, checkpoint_key=f"p{tag}", max_iterations=n + 1)
        return Agent(engine=plan)

    def sync_ms(n: int, runs: int) -> float:
        agents = [agent_of(n) for _ in range(runs)]
        times = []
        for agent in agents:
            t0 = clock()
            env = agent("go")
            times.append(clock() - t0)
            assert env.ok and env.payload == PAYLOAD, env
        return statistics.median(times) * 1000

    def async_ms(n: int, runs: int) -> float:
        agents = [agent_of(n) for _ in range(runs)]

        async def main() -> float:
            times = []
            for agent in agents:
                t0 = clock()
                env = await agent.run(Envelope.from_task("go"))
                times.append(clock() - t0)
                assert env.ok and env.payload == PAYLOAD, env
            return statistics.median(times) * 1000

        return asyncio.run(main())

    def build_ms(n: int, runs: int) -> float:
        steps = [Step(trivial, name=f"s{i}", writes=f"b:w{i}") for i in range(n)]
        t0 = clock()
        for r in range(runs):
            Agent(engine=Plan(*steps, store=store, checkpoint_key=f"b{r}", max_iterations=n + 1))
        return (clock() - t0) * 1000 / runs

    def add_one(x: int) -> int:
        return x + 1

    def many_ms(runs: int, steps_per_run: int, concurrency: int) -> float:
        steps = [Step(add_one, name=f"s{i}") for i in range(steps_per_run)]
        plan = Plan(*steps, store=Store(), checkpoint_key="m", on_concurrent="fork")
        tasks: list[str | Envelope[Any]] = [Envelope(task="t", payload=i) for i in range(runs)]
        t0 = clock()
        envs = plan.run_many(tasks, concurrency=concurrency)
        elapsed = clock() - t0
        assert [e.payload for e in envs] == [i + steps_per_run for i in range(runs)]
        return elapsed * 1000 / (runs * steps_per_run)

    sync_ms(10, 20)  # warm-up: imports, caches, the first loop
    async_ms(10, 20)
    many_ms(20, 10, 8)
    return {
        "step@100 sync": sync_ms(100, 15) / 100,
        "step@100 async": async_ms(100, 15) / 100,
        "run@10 sync": sync_ms(10, 200),
        "run@10 async": async_ms(10, 200),
        "build@10": build_ms(10, 300),
        "many@8": many_ms(200, 10, 8),
    }


def one_round(src: Path | None, cpu: bool) -> dict[str, float]:
    """One round in a fresh subprocess (on the tree ``src``, or this one)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    else:
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "src")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *(["--cpu"] if cpu else [])],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per tree (median)")
    parser.add_argument("--compare", type=Path, help="another source tree to measure alongside")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time by this process's CPU time instead of the wall clock (steadier on a "
        "loaded machine; for many@8 it counts the worker threads' CPU too)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(time.process_time if args.cpu else time.perf_counter)))
        return
    if args.compare is not None and not (args.compare / "src" / "stepstone").is_dir():
        parser.error(f"--compare {args.compare}: no src/stepstone there (a stepstone checkout?)")
    here: list[dict[str, float]] = []
    there: list[dict[str, float]] = []
    for _ in range(args.rounds):
        here.append(one_round(None, args.cpu))
        if args.compare is not None:
            there.append(one_round(args.compare, args.cpu))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}, in-memory store, {args.rounds} rounds (medians), "
        f"{'CPU time' if args.cpu else 'wall clock'}, {os.cpu_count()} cpus, "
        f"load average {load:.1f}"
    )
    print()
    names = list(here[0])
    if args.compare is None:
        print(f"{'measure':<16} {'ms':>9}")
        for name in names:
            print(f"{name:<16} {statistics.median(r[name] for r in here):>9.4f}")
        return
    print(f"{'measure':<16} {'this tree':>10} {'compared':>10} {'ratio':>7}")
    for name in names:
        mine = statistics.median(r[name] for r in here)
        theirs = statistics.median(r[name] for r in there)
        ratios = statistics.median(a[name] / b[name] for a, b in zip(here, there, strict=True))
        print(f"{name:<16} {mine:>10.4f} {theirs:>10.4f} {ratios:>6.2f}x")
    print()
    print(f"ms; ratio = this tree / {args.compare} (median of per-round ratios; < 1 is faster)")


if __name__ == "__main__":
    main()
