"""The `stepstone` command: demo, inspect, runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store
from stepstone.cli import app

runner = CliRunner()


def test_demo_runs_the_etl_story_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "demo.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "demo", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=180,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Run 1: the pipeline crashes during validate" in out
    assert "status failed  next step validate" in out
    assert "completed steps: ['extract', 'transform']" in out
    assert "Run 2: resume=True picks up at validate" in out
    assert "done: 'loaded 3 rows'" in out
    assert "no step ran; payload keys: ['clean', 'loaded', 'raw', 'verdict']" in out
    assert "pruned 3 finished fork checkpoints" in out
    with Store(db=db) as store:
        assert store.read("etl-2026-04-30")["status"] == "done"


def _failed_run(db: Path) -> None:
    def broken(payload: object) -> str:
        raise ValueError("bad row 7")

    with Store(db=db) as store:
        plan = Plan(
            Step(lambda p: "rows", name="extract", writes="raw"),
            Step(broken),
            store=store,
            checkpoint_key="nightly",
        )
        Agent(engine=plan)("go")


def test_inspect_prints_the_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    result = runner.invoke(app, ["inspect", "--db", str(db), "nightly"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "status failed" in result.output and "next step broken" in result.output
    assert "completed steps: ['extract']" in result.output
    assert "kv keys: ['raw']" in result.output
    assert "error at step 'broken': ValueError: bad row 7" in result.output
    assert "history" in result.output and "rows" in result.output


def test_inspect_errors_name_the_problem(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    missing = runner.invoke(app, ["inspect", "--db", str(db), "nightlx"])
    assert missing.exit_code == 1 and "no key 'nightlx'" in missing.output
    assert "nightly" in missing.output  # suggests near keys
    nofile = runner.invoke(app, ["inspect", "--db", str(tmp_path / "nope.sqlite"), "k"])
    assert nofile.exit_code == 2 and "no store file" in nofile.output
    neither = runner.invoke(app, ["inspect", "k"])
    assert neither.exit_code == 2 and "--db PATH or --url URL" in neither.output


def test_runs_lists_runs(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    result = runner.invoke(app, ["runs", "--db", str(db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "nightly" in result.output and "failed" in result.output
