"""Operating runs: list, show, diff, cancel, fork, prune and vacuum a store.

The same operations the ``stepstone`` command offers (``stepstone runs``, ``show``,
``diff``, ``prune --dry-run``, ``vacuum``...), from Python, on a SQLite file.

    python examples/operate_runs.py [path/to/runs.sqlite]
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from stepstone import Agent, Plan, Step, Store
from stepstone.durable import diff_runs, fork_run, prune, query_runs, run_detail
from stepstone.store import Retention, vacuum


def nightly(store: Store, day: str, rows: int) -> None:
    def load(report: str) -> str:
        if rows < 0:
            raise ValueError(f"negative row count {rows}")
        return f"loaded {rows} rows"

    plan = Plan(
        Step(lambda task: f"{day}: {rows} rows", name="extract"),
        Step(load, name="load"),
        store=store,
        checkpoint_key=f"nightly-{day}",
    )
    Agent(engine=plan)("go")


def main(path: Path) -> None:
    policy = Retention(ttl=timedelta(days=30), keep_last=2, min_age=timedelta(0))
    with Store(db=path, retention=policy) as store:
        for day, rows in (("11-19", 3), ("11-20", 5), ("11-21", 4), ("11-22", -1)):
            nightly(store, day, rows)

        total, runs = query_runs(store)
        print(f"{total} runs:", ", ".join(f"{r['key']}={r['status']}" for r in runs))

        failed = run_detail(store, "nightly-11-22")
        assert failed is not None
        err = failed["error"]
        print(f"nightly-11-22 failed at {err['step']}: {err['type']}: {err['message']}")

        diff = diff_runs(store, "nightly-11-20", "nightly-11-21")
        first = diff["first_difference"]
        print(
            f"11-20 vs 11-21 differ at row {first['index']}: {first['a']['payload']!r} vs "
            f"{first['b']['payload']!r}"
        )

        copy = fork_run(store, "nightly-11-21", at="extract", to="nightly-11-21-rerun")
        print(f"forked nightly-11-21 at extract: {copy.key} resumes at {copy.next_step!r}")

        later = time.time() + 1  # every run here is a second old: keep_last decides
        report = prune(store, dry_run=True, now=later)
        print("prune --dry-run would delete:", [r.key for r in report.deleted])
        report = prune(store, now=later)
        print("pruned:", [r.key for r in report.deleted])
        print("runs left:", [h.key for h in store.backend.run_list(None)])
        backend = store.backend
    shrink = vacuum(backend)
    print(f"vacuum: {shrink.bytes_before} -> {shrink.bytes_after} bytes")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="stepstone-ops-") as tmp:
            main(Path(tmp) / "runs.sqlite")
