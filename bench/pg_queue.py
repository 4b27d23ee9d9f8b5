"""Runs through the PostgreSQL work queue: fan-out over worker processes, recovery, and
the lookup of a queued graph run's earlier attempts.

Starts its own throwaway server (``tests/pgserver.py``, loopback, fsync on), then in this
one run:

* fan-out: 200 runs of a 10-step durable Plan (trivial steps) submitted to one queue and
  served by 1, 2 and 4 ``stepstone worker`` processes (concurrency 1, 4 and 8 each). The
  workers are started first; the runs come due at once when every worker serves the
  queue. Runs per second from the first start to the last finish (the database's
  timestamps), the ratio to one worker, and the CPU seconds the workers and the server
  spent per run meanwhile (psutil; they share the machine's cores). Then the same with
  steps that each await 2 ms (``--wait-ms``; as a step calling a service does), which
  shows how workers scale when the steps, not the cores, set the pace;
* recovery: a worker is SIGKILLed inside a 100-step run (20 ms steps) while a second
  worker stands by; the time from the kill until the run is done, and proof from the step
  log that no committed step ran again;
* graph lookup: the time a worker takes to run a fresh queued one-node graph run beside 0
  and 2,000 other graph records in the store.

    python bench/pg_queue.py [--runs 200] [--workers 1 2 4] [--concurrency 1 4 8]
        [--wait-ms 0 2] [--baseline-src OLD_CHECKOUT/src]
"""

from __future__ import annotations

import argparse
import asyncio
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

import psutil  # noqa: E402 - after the path set-up

from stepstone import Plan, Step  # noqa: E402


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


async def waiting(payload: Any) -> Any:
    cfg = json.loads(payload) if isinstance(payload, str) else payload
    await asyncio.sleep(cfg["wait"])
    return cfg


plan = Plan(*[Step(trivial, name=f"s{i}") for i in range(10)])
waiting_plan = Plan(*[Step(waiting, name=f"w{i}") for i in range(10)])
long_plan = Plan(*[Step(_logged(i)) for i in range(100)], max_iterations=101)


def spawn(
    url: str, *args: str, stderr: bool = False, src: str | None = None
) -> subprocess.Popen[bytes]:
    """A ``stepstone worker`` process; ``src``: import stepstone from that folder instead
    (an older checkout's ``src``, to compare code in one run)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
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
        stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env=env,
    )


def _ready(proc: subprocess.Popen[bytes]) -> None:
    """Wait until a spawned worker says it serves its queue (its imports are done)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if b" serving " in line:
            return
    raise SystemExit(f"worker {proc.pid} exited before serving (code {proc.wait()})")


def _cpu(procs: list[Any]) -> dict[int, float]:
    """CPU seconds (user + system, all threads) of each process, by pid."""
    out: dict[int, float] = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = t.user + t.system
    return out


def _server_procs(server: Any) -> list[Any]:
    postmaster = psutil.Process(int((server.data / "postmaster.pid").read_text().split()[0]))
    return [postmaster, *postmaster.children(recursive=True)]


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def fan_out(
    url: str,
    server: Any,
    workers: int,
    runs: int,
    concurrency: int,
    wait: float = 0.0,
    src: str | None = None,
) -> tuple[float, float, float]:
    """Runs per second, and the workers' and the server's CPU seconds per run (steps that
    each await ``wait`` seconds, or trivial ones).

    The workers are started (and have imported everything) before the runs come due: all
    of them are submitted not before a far-off time, and released at once when every
    worker serves the queue, as a long-running pool of workers would meet a burst.
    """
    import psycopg

    from stepstone import Store, submit

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE stepstone_queue, stepstone_kv, stepstone_runs, stepstone_journal")
    with Store(url=url) as store:
        far = store.backend.clock() + 3600.0
        target, task = (
            ("pg_queue:waiting_plan", json.dumps({"wait": wait}))
            if wait
            else ("pg_queue:plan", "go")
        )
        handles = [submit(store, target, task, queue="bench", not_before=far) for _ in range(runs)]
        procs = [
            spawn(url, "--queue", "bench", "--concurrency", str(concurrency), stderr=True, src=src)
            for _ in range(workers)
        ]
        try:
            for p in procs:
                _ready(p)
            watched = [psutil.Process(p.pid) for p in procs]
            cpu0 = _cpu(watched), _cpu(_server_procs(server))
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE stepstone_queue SET not_before = 0 WHERE queue = 'bench' "
                    "AND status = 'queued'"
                )
            for h in handles:
                if not h.result(timeout=600).ok:
                    raise SystemExit(f"run {h.id} failed")
            cpu1 = _cpu(watched), _cpu(_server_procs(server))
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
    return runs / float(row[0]), _spent(cpu0[0], cpu1[0]) / runs, _spent(cpu0[1], cpu1[1]) / runs


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


def _graph_node(state: Any) -> dict[str, Any]:
    return {"n": state.n + 1}


def _tiny_graph() -> Any:
    from stepstone.graph import END, GraphBuilder, State

    class Counter(State):
        n: int = 0

    return (
        GraphBuilder(Counter)
        .add_node("inc", _graph_node)
        .add_edge("inc", END)
        .set_entry("inc")
        .compile()
    )


def graph_lookup(url: str, sizes: list[int], samples: int = 5) -> dict[int, float]:
    """Milliseconds for a worker to run a fresh queued one-node graph run (its lookup of
    earlier attempts, then the run), with ``n`` other graph records in the store; median
    of ``samples``."""
    import asyncio

    import psycopg

    from stepstone import Envelope, Store, submit
    from stepstone._worker_targets import queued_graph
    from stepstone.graph import StoreCheckpointer

    graph = _tiny_graph()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE stepstone_queue, stepstone_kv, stepstone_runs, stepstone_journal")
    out: dict[int, float] = {}
    with Store(url=url) as store:
        from stepstone.engines.graph import CompiledGraph

        recorded: CompiledGraph[Any] = CompiledGraph(
            state_cls=graph.state_cls,
            nodes=graph.nodes,
            edges=graph.edges,
            entry=graph.entry,
            checkpointer=StoreCheckpointer(store),
            migrations=graph.migrations,
        )
        have = 0

        async def fill(n: int) -> None:
            for start in range(0, n, 16):
                await asyncio.gather(
                    *(
                        recorded.ainvoke(graph.state_cls(), correlation_id=f"filler-{start + i}")
                        for i in range(min(16, n - start))
                    )
                )

        for size in sizes:
            asyncio.run(fill(size - have))
            have = size
            times = []
            for _ in range(samples + 1):  # the first one warms up, and is not counted
                h = submit(store, "pg_queue:tiny", graph.state_cls(), queue="lookup")
                run = queued_graph(graph, store, h.entry())
                env = Envelope(task="Counter", payload={"n": 0})
                t0 = time.perf_counter()
                final = asyncio.run(run(env))
                times.append((time.perf_counter() - t0) * 1000)
                assert final.payload == {"n": 1}
            out[size] = statistics.median(times[1:])
    return out


def _same_schema(src: str) -> None:
    """Refuse a baseline whose PostgreSQL schema differs from this code's: its workers and
    this code's cannot share the benchmark's database (opening it migrates it, and a worker
    of the other version then refuses it)."""
    from stepstone.store._postgres_schema import MIGRATIONS

    env = {**os.environ, "PYTHONPATH": src}
    probe = "from stepstone.store._postgres_schema import MIGRATIONS; print(len(MIGRATIONS))"
    theirs = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if theirs != str(len(MIGRATIONS)):
        raise SystemExit(
            f"--baseline-src {src}: its PostgreSQL schema is version {theirs}, this code's "
            f"{len(MIGRATIONS)}; their workers cannot share one database. Run that "
            "checkout's own bench/pg_queue.py (PYTHONPATH=its src) right before or after this one"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--wait-ms", type=float, nargs="+", default=[0.0, 2.0], help="each step awaits this long"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--graph-records", type=int, nargs="+", default=[0, 2000])
    parser.add_argument("--skip", nargs="*", default=[], choices=["fanout", "recovery", "graph"])
    parser.add_argument(
        "--baseline-src",
        help="also run the fan-out with workers importing stepstone from this folder (an "
        "older checkout's src/), interleaved with this code's, to compare in one run",
    )
    args = parser.parse_args()
    if args.baseline_src is not None:
        _same_schema(args.baseline_src)

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
            f"{os.cpu_count()} cpus, fsync on; load average before: "
            + " ".join(f"{x:.2f}" for x in os.getloadavg())
        )
        if "fanout" not in args.skip:
            print(f"{args.runs} runs x 10 steps through the queue (wait: ms each step awaits)")
            codes: list[str | None] = (
                [None]
                if args.baseline_src is None
                else [
                    args.baseline_src,
                    None,
                ]
            )
            waits = [ms / 1000 for ms in args.wait_ms]
            sizes = [
                (src, wait, c, w)
                for src in codes
                for wait in waits
                for c in args.concurrency
                for w in args.workers
            ]
            got: dict[Any, list[tuple[float, float, float]]] = {k: [] for k in sizes}
            for _ in range(args.repeat):  # interleaved, so drift hits every size alike
                for src, wait, c, w in sizes:
                    got[(src, wait, c, w)].append(fan_out(url, server, w, args.runs, c, wait, src))
            print(
                f"{'code':>8} {'wait':>4} {'concurrency':>11} {'workers':>7} {'runs/s':>8} "
                f"{'x 1 worker':>10} {'worker cpu ms/run':>17} {'server cpu ms/run':>17}"
                f"   (medians of {args.repeat})"
            )
            for src in codes:
                for wait in waits:
                    for c in args.concurrency:
                        first = got[(src, wait, c, args.workers[0])]
                        base = statistics.median(r for r, _, _ in first)
                        for w in args.workers:
                            runs = got[(src, wait, c, w)]
                            rate = statistics.median(r for r, _, _ in runs)
                            wcpu = statistics.median(x for _, x, _ in runs) * 1000
                            scpu = statistics.median(x for _, _, x in runs) * 1000
                            print(
                                f"{'baseline' if src else 'this':>8} {wait * 1000:>4g} {c:>11} "
                                f"{w:>7} {rate:>8.1f} {rate / base:>10.2f} {wcpu:>17.2f} "
                                f"{scpu:>17.2f}"
                            )
        if "recovery" not in args.skip:
            took, reran, executed = recovery(url, Path(tmp) / "steps.log")
            print()
            print(
                f"recovery: worker SIGKILLed after 50 of 100 steps; a standby worker finished "
                f"the run {took:.2f}s after the kill; steps executed {executed}, re-run "
                f"{reran} (only the step in flight may re-run)"
            )
        if "graph" not in args.skip:
            ms = graph_lookup(url, args.graph_records)
            print()
            print("a queued one-node graph run, taken by a worker (median of 5):")
            for size, t in ms.items():
                print(f"  beside {size:>6} other graph records: {t:7.2f} ms")
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
