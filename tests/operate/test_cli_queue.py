"""``stepstone queue``: the work queue's entries, on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from stepstone import Store, Worker, submit
from stepstone.cli import app
from tests.operate.conftest import open_args
from tests.workers.targets import task

runner = CliRunner()


def _queue(*args: str) -> list[dict[str, object]]:
    result = runner.invoke(app, ["queue", *args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    entries: list[dict[str, object]] = json.loads(result.stdout)
    return entries


def test_queue_lists_entries_by_queue_and_status(store_args: list[str], tmp_path: Path) -> None:
    # guarantee 363
    log = str(tmp_path / "log")
    with open_args(store_args) as store:
        waiting = submit(store, "tests.workers.targets:make_plan", task(log, "a"), key="n-1")
        failing = submit(store, "tests.workers.targets:failing_plan", task(log, "b"), queue="etl")
        Worker(store, queues=["etl"], poll_interval=0.05).run(until_idle=True)
    listed = _queue(*store_args)
    assert [(e["id"], e["queue"], e["status"]) for e in listed] == [
        (waiting.id, "default", "queued"),
        (failing.id, "etl", "failed"),
    ]
    assert listed[0]["run_key"] == "n-1" and "bad input for run b" in str(listed[1]["error"])
    assert [e["id"] for e in _queue(*store_args, "--status", "failed")] == [failing.id]
    assert [e["id"] for e in _queue(*store_args, "--queue", "default")] == [waiting.id]
    assert [e["id"] for e in _queue(*store_args, "--limit", "1")] == [failing.id]
    table = runner.invoke(app, ["queue", *store_args], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "n-1" in table.stdout and "bad input" in table.stdout
    wrong = runner.invoke(app, ["queue", *store_args, "--status", "bogus"])
    assert wrong.exit_code == 2 and "--status bogus: an entry is one of" in wrong.stderr


def test_a_store_without_a_queue_lists_none_and_gets_none(tmp_path: Path) -> None:
    # guarantee 363
    db = tmp_path / "plain.sqlite"
    Store(db=db).close()
    result = runner.invoke(app, ["queue", "--db", str(db)])
    assert result.exit_code == 0 and "no queue entries" in result.stdout
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "stepstone_queue" not in names


def test_a_second_retry_says_the_run_is_still_in_its_queue(
    store_args: list[str], tmp_path: Path
) -> None:
    """guarantee 259: retrying a queued run whose entry a first retry already put back says
    a worker resumes it (before: `resume=True runs it again`, as if nothing would)."""
    from stepstone import RunHandle

    log = str(tmp_path / "log")
    Path(log + ".down").touch()
    with open_args(store_args) as store:
        h = submit(store, "tests.workers.targets:flaky_plan", task(log, "r"), key="nightly")
        Worker(store, queues=["default"], poll_interval=0.05).run(until_idle=True)
        assert RunHandle(store, h.id).status() == "failed"
    env = {"COLUMNS": "200"}
    first = runner.invoke(app, ["retry", "nightly", "--from", "flaky", *store_args], env=env)
    assert first.exit_code == 0 and f"{h.id} is queued again" in first.stdout
    again = runner.invoke(app, ["retry", "nightly", "--from", "flaky", *store_args], env=env)
    assert again.exit_code == 0, again.stderr
    assert f"its queue entry {h.id} is still in the queue: a worker resumes it" in again.stdout
    assert "resume=True" not in again.stdout
    said = runner.invoke(
        app, ["retry", "nightly", "--from", "flaky", "--json", *store_args], env=env
    )
    assert json.loads(said.stdout)["queued"] == h.id
    assert json.loads(said.stdout)["requeued"] is None
