"""Durable timers and messages: a thousand sleeping runs on one worker, the round trip of a
message to a waiting run, and how soon a stream reader sees a value.

* sleepers: N workflow runs (default 1,000) each sleeping S seconds (default 60) are
  submitted to one SQLite store and served by ONE ``stepstone worker`` process of
  concurrency 8. Each run parks (its queue entry goes back until its wake time) so all of
  them sleep at once with no slot held. Reported: how long until every run slept, how late
  each run finished after its wake time (median, p99, max), and the worker's peak memory
  (RSS) and CPU seconds. "taken late" is how late after its wake time a worker took
  each run again (the rest of "late" is the resumed run's own work);
* roundtrip: a workflow run waiting in a worker (``recv``) and a client in another process:
  the client sends a message stamped with its clock, the run writes a stream value stamped
  with the time it continued and the time it wrote, the client reads it. Reported: the
  message round trip (send -> the run continues) and the stream read latency (write ->
  the reader sees it), median and p99, on PostgreSQL (LISTEN/NOTIFY) and SQLite (in-process
  publish between the worker's threads, 0.1 s polls across processes). Then the same
  with a worker that parks the run at every receive (``--park-after 0``): the send makes
  its queue entry runnable, the worker takes it again and the run resumes from its journal.

Everything runs on this machine (one clock). PostgreSQL is a throwaway server
(``tests/pgserver.py``, loopback, fsync on).

    python bench/time_and_messages.py sleepers [--runs 1000] [--sleep 60] [--concurrency 8]
                                               [--baseline-src OLD/src --rounds 2]
    python bench/time_and_messages.py roundtrip [--messages 200] [--parked 50]
                                                [--stores postgres sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # for tests.pgserver when run as a script
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402 - after the path set-up

import stepstone  # noqa: E402
from stepstone import Store, workflow  # noqa: E402


@workflow
async def sleeper(seconds: float) -> int:
    await stepstone.sleep(seconds)
    return 1


@workflow
async def echo(n: int) -> int:
    for i in range(n):
        msg = await stepstone.recv("ping")
        continued = time.time()
        await stepstone.write_stream(
            "pong", {"i": i, "sent": msg["sent"], "continued": continued, "written": time.time()}
        )
    return n


def _worker(
    args: list[str], concurrency: int, park_after: float, src: str | None = None
) -> subprocess.Popen[bytes]:
    """A ``stepstone worker`` process (importing stepstone from ``src`` when given)."""
    path = os.pathsep.join([src, str(ROOT)] if src else [str(ROOT)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            *args,
            "--queue",
            "bench",
            "--concurrency",
            str(concurrency),
            "--park-after",
            str(park_after),
            "--poll-interval",
            "0.1",
            "--import-path",
            str(Path(__file__).resolve().parent),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if b" serving " in line:
            return proc
    raise SystemExit(f"the worker exited before serving (code {proc.wait()})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def sleepers(runs: int, seconds: float, concurrency: int, src: str | None = None) -> dict[str, Any]:
    from stepstone.durable._operations import operation_rows
    from stepstone.durable._queue import queue_backend
    from stepstone.durable._records import read_run

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "sleepers.sqlite"
        store = Store(db=db)
        started = time.time()
        handles = [
            sleeper.using(store=store, key=f"s-{i}", queue="bench").submit(seconds)
            for i in range(runs)
        ]
        submitted = time.time() - started
        worker = _worker(["--db", str(db)], concurrency, 5.0, src)
        ps = psutil.Process(worker.pid)
        queue = queue_backend(store)
        peak_rss, all_asleep = 0, None
        t0 = time.time()
        try:
            while True:
                peak_rss = max(peak_rss, ps.memory_info().rss)
                timers = len(store.backend.timers(None))
                if all_asleep is None and timers >= runs:
                    all_asleep = time.time() - t0
                done = len(queue.entries("bench", "done"))
                if done >= runs:
                    break
                if time.time() - t0 > seconds + 600:
                    raise SystemExit(f"only {done} of {runs} runs finished")
                time.sleep(0.2)
            cpu = ps.cpu_times()
            cpu_s = cpu.user + cpu.system
        finally:
            _stop(worker)
        late: list[float] = []
        taken_late: list[float] = []
        for handle in handles:
            entry = handle.entry()
            found = read_run(store, entry.run_key)
            assert found is not None
            (op,) = [o for o in operation_rows(*found) if o["op"] == "sleep"]
            late.append(entry.updated_at - op["value"]["wake_at"])
            assert entry.started_at is not None
            taken_late.append(entry.started_at - op["value"]["wake_at"])
        store.close()
    return {
        "worker": "baseline" if src else "this checkout",
        "runs": runs,
        "sleep_s": seconds,
        "concurrency": concurrency,
        "submit_s": round(submitted, 2),
        "all_asleep_after_s": None if all_asleep is None else round(all_asleep, 2),
        "late_median_s": round(statistics.median(late), 3),
        "late_p99_s": round(_pct(late, 99), 3),
        "late_max_s": round(max(late), 3),
        "taken_late_median_s": round(statistics.median(taken_late), 3),
        "taken_late_p99_s": round(_pct(taken_late, 99), 3),
        "worker_peak_rss_mb": round(peak_rss / 2**20, 1),
        "worker_cpu_s": round(cpu_s, 2),
    }


def roundtrip(
    store_args: list[str], store: Store, messages: int, *, parked: bool = False
) -> dict[str, Any]:
    key = f"echo-{time.monotonic_ns()}"
    handle = echo.using(store=store, key=key, queue="bench").submit(messages)
    # it waits in the worker (no parking), or (parked) gives its slot back at every receive
    worker = _worker(store_args, 1, 0.0 if parked else 3600.0)
    rtt: list[float] = []
    read: list[float] = []
    try:
        reader = handle.read_stream("pong", timeout=60)
        items = iter(reader)
        for i in range(messages):
            stepstone.send(store, key, "ping", {"sent": time.time()})
            _, value = next(items)
            seen = time.time()
            assert value["i"] == i
            if i >= 5:  # the first ones warm the connections up
                rtt.append(value["continued"] - value["sent"])
                read.append(seen - value["written"])
        assert handle.result(timeout=60).ok
    finally:
        _stop(worker)
    ms = 1000.0
    return {
        "store": store.backend.describe().split(":")[0],
        "waits": "parked" if parked else "in the worker",
        "messages": len(rtt),
        "rtt_median_ms": round(statistics.median(rtt) * ms, 1),
        "rtt_p99_ms": round(_pct(rtt, 99) * ms, 1),
        "stream_read_median_ms": round(statistics.median(read) * ms, 1),
        "stream_read_p99_ms": round(_pct(read, 99) * ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sleepers")
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--sleep", type=float, default=60.0)
    s.add_argument("--concurrency", type=int, default=8)
    s.add_argument(
        "--baseline-src",
        help="also run the worker from this src directory (an older checkout's), in "
        "alternating rounds with this checkout's",
    )
    s.add_argument("--rounds", type=int, default=1, help="rounds of each worker")
    r = sub.add_parser("roundtrip")
    r.add_argument("--messages", type=int, default=200)
    r.add_argument("--stores", nargs="+", default=["postgres", "sqlite"])
    r.add_argument(
        "--parked",
        type=int,
        default=50,
        help="messages to a run that parks at every receive (0: skip that part)",
    )
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; load average before: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    if args.what == "sleepers":
        for _ in range(args.rounds):
            for src in [args.baseline_src, None] if args.baseline_src else [None]:
                print(json.dumps(sleepers(args.runs, args.sleep, args.concurrency, src)))
        return
    for name in args.stores:
        if name == "postgres":
            from tests.pgserver import PgServer

            with PgServer(fsync=True) as server:
                url = server.create_database("bench")
                with Store(url=url) as store:
                    store.setup()
                    print(json.dumps(roundtrip(["--url", url], store, args.messages)))
                    if args.parked:
                        got = roundtrip(["--url", url], store, args.parked, parked=True)
                        print(json.dumps(got))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                db = Path(tmp) / "rtt.sqlite"
                with Store(db=db) as store:
                    print(json.dumps(roundtrip(["--db", str(db)], store, args.messages)))
                    if args.parked:
                        got = roundtrip(["--db", str(db)], store, args.parked, parked=True)
                        print(json.dumps(got))


if __name__ == "__main__":
    main()
