"""`stepstone runs` lays its table out itself and prints it as it goes: one line per run,
columns aligned, keys whole, on a store of thousands of runs as on one of two."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.cells import cell_len

from stepstone import Agent, Plan, Step, Store
from stepstone.durable import claim_run


def _runs(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "runs", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": str(columns)},
    )


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│")]


def test_each_run_is_one_line_however_wide(tmp_path: Path) -> None:
    # guarantee 229: before, a row wider than the table's width folded its cells onto
    # several lines, so one run took many lines and `grep` found half a row
    db = tmp_path / "s.sqlite"
    long_error = type("Failure" * 25, (Exception,), {})

    def broken(payload: Any) -> str:
        raise long_error("no")

    key = "nightly-for-the-customer-with-a-rather-long-name-" * 3
    with Store(db=db) as store:
        Agent(engine=Plan(Step(broken, name="load"), store=store, checkpoint_key=key))("go")
        Agent(engine=Plan(Step(lambda p: p, name="x"), store=store, checkpoint_key="short"))("go")
    proc = _runs("--db", str(db), columns=40)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert len(rows) == 2
    assert key in rows[0] and "Failure" * 25 in rows[0] and "failed" in rows[0]
    lines = proc.stdout.splitlines()
    assert lines[0].strip() == "2 run(s)"
    assert len({cell_len(line) for line in lines[1:]}) == 1  # every line of the box aligned
    bars = {
        tuple(i for i, c in enumerate(line) if c in "│┃") for line in lines[2:] if line[0] in "│┃"
    }
    assert len(bars) == 1  # the header's and every row's column edges at the same places


def test_thousands_of_runs_each_on_its_line_in_order(tmp_path: Path) -> None:
    # guarantee 229
    db = tmp_path / "many.sqlite"
    with Store(db=db, durability="normal") as store:
        for i in range(3000):
            run = claim_run(store, f"r{i:05d}", kind="plan", resume=False, first_step="s0").run
            assert run is not None
            failed = i % 7 == 0
            run.commit_sync(
                status="failed" if failed else "done",
                next_step="s1" if failed else None,
                rows=[("step", "s0", {"n": i})],
                meta={"error": {"type": "ValueError", "message": "bad"}} if failed else None,
            )
            run.release()
    proc = _runs("--db", str(db), columns=200)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert [row.split()[1] for row in rows] == [f"r{i:05d}" for i in range(3000)]
    assert sum("ValueError" in row for row in rows) == len(range(0, 3000, 7))
    assert proc.stdout.splitlines()[-1].startswith("└")
    page = _runs("--db", str(db), "--limit", "250", "--offset", "2900")
    assert "3000 run(s), 2901-3000 shown" in page.stdout and len(_rows(page.stdout)) == 100
