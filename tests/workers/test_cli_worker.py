"""``stepstone worker`` on the command line: argument errors and a run to idle."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from stepstone import Agent, Plan, RunHandle, Step, Store, submit
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


def test_worker_refuses_a_poll_interval_that_is_no_number(tmp_path: Path) -> None:
    # guarantee 299: --poll-interval nan was taken, and the worker spun on its queue
    db = tmp_path / "q.sqlite"
    Store(db=db).close()
    result = CliRunner().invoke(
        app, ["worker", "--db", str(db), "--poll-interval", "nan", "--until-idle"]
    )
    assert result.exit_code == 2
    assert "poll_interval must be a finite number of seconds > 0, got nan" in result.output


def test_retry_puts_a_queued_run_back_in_its_queue(tmp_path: Path) -> None:
    # guarantee 259
    db, log = tmp_path / "q.sqlite", str(tmp_path / "log")
    Path(log + ".down").touch()
    with Store(db=db) as store:
        h = submit(store, "tests.workers.targets:flaky_plan", task(log, "r"), key="nightly")
    runner = CliRunner()
    assert runner.invoke(app, ["worker", "--db", str(db), "--until-idle"]).exit_code == 0
    Path(log + ".down").unlink()
    result = runner.invoke(app, ["retry", "nightly", "--from", "flaky", "--db", str(db)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"its queue entry {h.id} is queued again: a worker resumes it" in said
    assert runner.invoke(app, ["worker", "--db", str(db), "--until-idle"]).exit_code == 0
    with Store(db=db) as store:
        assert RunHandle(store, h.id).result(timeout=5).ok
        assert store.read("nightly")["status"] == "done"
    plain = tmp_path / "plain.sqlite"  # a store with no queue: a retry makes none
    with Store(db=plain) as store:
        Agent(engine=Plan(Step(_down), store=store, checkpoint_key="p"))("x")
    result = runner.invoke(app, ["retry", "p", "--from", "_down", "--db", str(plain)])
    assert result.exit_code == 0 and "resume=True runs it again" in result.output
    with contextlib.closing(sqlite3.connect(plain)) as conn, conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "stepstone_queue" not in tables


def _down(text: str) -> str:
    raise RuntimeError("down")
