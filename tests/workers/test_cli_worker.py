"""``stepstone worker`` on the command line: argument errors and a run to idle."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from stepstone import RunHandle, Store, submit
from stepstone.cli import app
from tests.workers.targets import task


def test_worker_needs_exactly_one_store(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["worker"])
    assert result.exit_code == 2 and "exactly one of --db PATH or --url URL" in result.output
    result = runner.invoke(app, ["worker", "--db", str(tmp_path / "missing.sqlite")])
    assert result.exit_code == 2 and "no store file" in result.output


def test_worker_serves_a_sqlite_queue_until_idle(tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        h = submit(store, "tests.workers.targets:make_plan", task(str(tmp_path / "log"), "c"))
    result = CliRunner().invoke(app, ["worker", "--db", str(db), "--until-idle"])
    assert result.exit_code == 0, result.output
    assert "stopped after finishing 1 runs" in result.output
    with Store(db=db) as store:  # the handle, rebuilt against a new store
        assert RunHandle(store, h.id).result(timeout=5).payload["name"] == "c"


def test_worker_reports_an_unreachable_database() -> None:
    result = CliRunner().invoke(
        app, ["worker", "--url", "postgresql://nobody@127.0.0.1:1/x", "--until-idle"]
    )
    assert result.exit_code == 1
    assert "cannot set up the stepstone schema" in result.output
