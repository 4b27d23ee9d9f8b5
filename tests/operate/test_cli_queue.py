"""``stepstone queue``: the work queue's entries, on SQLite and PostgreSQL."""

from __future__ import annotations

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
    with sqlite3.connect(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "stepstone_queue" not in names
