"""What retention costs on a large SQLite store: prune, then vacuum, and their effect.

Builds a store of finished Plan runs through the durable kernel (``--mb`` of journal, each
run ``--steps`` steps of ``--payload`` bytes, ``durability="normal"`` so the build is
quick), then measures, in this one run:

* ``prune --dry-run`` (judging every run) and ``prune`` of half the runs (``keep_last``):
  seconds, runs/s, MB of journal deleted per second;
* the effect on a worker committing steps to the same file meanwhile: its per-commit
  latency (median and p99) during the prune, as a ratio to the same writer idle;
* the file size before, after the prune (unchanged: SQLite keeps free pages) and after
  ``vacuum`` (first call: a full rewrite that switches the file to incremental vacuum),
  then a second prune + incremental vacuum.

    python bench/prune_cost.py [--mb 1024] [--steps 10] [--payload 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from stepstone import Store
from stepstone.durable import claim_run, prune
from stepstone.store import Retention, vacuum


def size_mb(path: Path) -> float:
    wal = path.with_name(path.name + "-wal")
    return (path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)) / 1e6


def build(store: Store, runs: int, steps: int, payload: str) -> None:
    for i in range(runs):
        run = claim_run(store, f"run-{i:06d}", kind="plan", resume=False, first_step="s0").run
        assert run is not None
        for s in range(steps):
            last = s == steps - 1
            run.commit_sync(
                status="done" if last else "running",
                next_step=None if last else f"s{s + 1}",
                rows=[("step", f"s{s}", {"iteration": s + 1, "envelope": {"payload": payload}})],
            )
        run.release()
        if i % 500 == 0:
            print(f"  built {i}/{runs} runs", file=sys.stderr, flush=True)


def writer(store: Store, stop: threading.Event, lat: list[float]) -> None:
    run = claim_run(store, f"writer-{time.time()}", kind="plan", resume=False, first_step="s")
    assert run.run is not None
    while not stop.is_set():
        t = time.perf_counter()
        run.run.commit_sync(status="running", next_step="s", rows=[("step", "s", {"n": 1})])
        lat.append((time.perf_counter() - t) * 1000)
        time.sleep(0.002)
    run.run.release()


def idle_latency(store: Store, seconds: float) -> list[float]:
    lat: list[float] = []
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(store, stop, lat))
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    return lat


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--payload", type=int, default=10_000)
    args = ap.parse_args()
    runs = max(4, int(args.mb * 1e6 / (args.steps * args.payload)))
    path = Path(tempfile.mkdtemp(prefix="stepstone-prune-bench-")) / "big.sqlite"
    payload = "p" * args.payload
    store = Store(db=path, durability="normal")
    t = time.perf_counter()
    build(store, runs, args.steps, payload)
    store.close()
    store = Store(db=path, durability="normal")
    print(f"built {runs} runs x {args.steps} steps in {time.perf_counter() - t:.0f} s")
    before = size_mb(path)
    print(f"store: {before:.0f} MB")

    later = time.time() + 3600
    policy = Retention(keep_last=runs // 2, min_age=timedelta(0))
    t = time.perf_counter()
    dry = prune(store, policy, dry_run=True, now=later)
    dry_s = time.perf_counter() - t
    print(f"prune --dry-run: {len(dry.deleted)} runs judged for deletion in {dry_s:.2f} s")

    idle = idle_latency(store, 3.0)
    lat: list[float] = []
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(store, stop, lat))
    th.start()
    t = time.perf_counter()
    report = prune(store, policy, now=later)
    prune_s = time.perf_counter() - t
    stop.set()
    th.join()
    deleted_mb = before * len(report.deleted) / runs
    print(
        f"prune: {len(report.deleted)} runs in {prune_s:.1f} s "
        f"({len(report.deleted) / prune_s:.0f} runs/s, {deleted_mb / prune_s:.0f} MB/s)"
    )
    med_idle, med_busy = statistics.median(idle), statistics.median(lat)
    print(
        f"concurrent writer commit: idle median {med_idle:.2f} ms p99 {pct(idle, 0.99):.2f} ms; "
        f"during prune median {med_busy:.2f} ms p99 {pct(lat, 0.99):.2f} ms "
        f"(ratio {med_busy / med_idle:.2f}x median, {pct(lat, 0.99) / pct(idle, 0.99):.2f}x p99)"
    )
    print(f"after prune: {size_mb(path):.0f} MB (free pages stay in the file)")
    backend = store.backend
    store.close()
    t = time.perf_counter()
    first = vacuum(backend)
    print(
        f"vacuum (first: full rewrite): {first.bytes_before / 1e6:.0f} -> "
        f"{first.bytes_after / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s"
    )
    store = Store(db=path, durability="normal")
    policy2 = Retention(keep_last=runs // 4, min_age=timedelta(0))
    t = time.perf_counter()
    report2 = prune(store, policy2, now=later)
    p2 = time.perf_counter() - t
    backend = store.backend
    store.close()
    t = time.perf_counter()
    second = vacuum(backend)
    print(
        f"second prune: {len(report2.deleted)} runs in {p2:.1f} s; incremental vacuum "
        f"{second.bytes_before / 1e6:.0f} -> {second.bytes_after / 1e6:.0f} MB in "
        f"{time.perf_counter() - t:.1f} s"
    )
    for p in path.parent.iterdir():
        p.unlink()
    path.parent.rmdir()


if __name__ == "__main__":
    main()
