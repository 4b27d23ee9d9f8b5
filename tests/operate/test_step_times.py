"""Per-step times (issue 36 item 8): every journal row records when its work started and
when it committed, on the database's clock; `history`, `show`, their `--json` and the
inspector show each step's start, how long it took and the gap before it. Runs written
before rows had times still load. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store
from stepstone.cli import app
from stepstone.ui import InspectorServer
from tests.operate.conftest import open_args

runner = CliRunner()
FIXTURE_V4 = Path(__file__).parents[1] / "store" / "fixtures" / "store_v4.sqlite"


def _json(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _plan(store: Store, key: str, fixed: list[bool]) -> Plan:
    def slow(p: Any) -> str:
        time.sleep(0.25)
        return "slow"

    def fragile(p: Any) -> str:
        if not fixed:
            raise ValueError("not yet")
        return "ok"

    return Plan(
        Step(lambda p: "fast", name="fast"),
        Step(slow, name="slow"),
        Step(fragile, name="fragile"),
        store=store,
        checkpoint_key=key,
        resume=True,
    )


def test_history_show_and_the_inspector_time_every_step(store_args: list[str]) -> None:
    # guarantee 420, 421: before, no row said when it ran
    fixed: list[bool] = []
    with open_args(store_args) as store:
        assert not Agent(engine=_plan(store, "timed", fixed))("go").ok  # fails at fragile
        time.sleep(0.4)  # the run waits, failed, before it is resumed
        fixed.append(True)
        assert Agent(engine=_plan(store, "timed", fixed))("go").ok
        head = store.backend.run_get("timed")
        assert head is not None
    hist = _json("history", "timed", *store_args)
    fast, slow, fragile = hist
    assert [e["name"] for e in hist] == ["fast", "slow", "fragile"]
    for entry in hist:
        assert entry["committed_at"] >= entry["started_at"] >= head.created_at
        assert entry["duration_seconds"] == round(entry["committed_at"] - entry["started_at"], 6)
    assert slow["duration_seconds"] >= 0.25 > fast["duration_seconds"]  # the slow step
    assert fast["gap_seconds"] < 0.25 and slow["gap_seconds"] < 0.25
    assert fragile["gap_seconds"] >= 0.4  # the time it waited, failed, before the resume
    assert fragile["committed_at"] == head.updated_at  # the run's last commit
    shown = _json("show", "timed", *store_args)
    assert [(e["started_at"], e["duration_seconds"]) for e in shown["timeline"]] == [
        (e["started_at"], e["duration_seconds"]) for e in hist
    ]
    out = runner.invoke(app, ["history", "timed", *store_args], env={"COLUMNS": "200"}).stdout
    assert "started" in out and "took" in out and "gap" in out
    slow_line = next(line for line in out.splitlines() if " slow " in line)
    assert " ms " in slow_line
    out = runner.invoke(app, ["show", "timed", *store_args], env={"COLUMNS": "200"}).stdout
    assert "took" in out and "fragile" in out
    with (
        open_args(store_args) as store,
        InspectorServer(store, port=0).start() as server,
        urllib.request.urlopen(server.url + "api/run?key=timed", timeout=30) as resp,
    ):
        page = json.loads(resp.read())
    assert [e["gap_seconds"] for e in page["timeline"]] == [e["gap_seconds"] for e in hist]


def test_parallel_branches_are_timed_each_from_its_own_start(store_args: list[str]) -> None:
    # guarantee 420: a branch that finishes second took its own time, not the time since
    # its sibling's commit
    def sleeper(seconds: float) -> Any:
        def run(p: Any) -> float:
            time.sleep(seconds)
            return seconds

        return run

    with open_args(store_args) as store:
        plan = Plan(
            Step(sleeper(0.05), name="quick", parallel=True),
            Step(sleeper(0.35), name="long", parallel=True),
            store=store,
            checkpoint_key="band",
        )
        assert Agent(engine=plan)("go").ok
    hist = {e["name"]: e for e in _json("history", "band", *store_args) if e["kind"] == "step"}
    assert hist["long"]["duration_seconds"] >= 0.35 > hist["quick"]["duration_seconds"]
    assert abs(hist["long"]["started_at"] - hist["quick"]["started_at"]) < 0.25
    assert hist["long"]["gap_seconds"] < 0.25  # since the commit before it started


def test_runs_written_before_rows_had_times_still_load(tmp_path: Path) -> None:
    # guarantee 422: a schema version 4 store (frozen) reads, read-only, without times;
    # opened for writing, its old rows keep none and new ones get theirs
    db = tmp_path / "v4.sqlite"
    shutil.copyfile(FIXTURE_V4, db)
    before = db.read_bytes()
    old = _json("history", "etl-failed", "--db", str(db))
    assert [(e["name"], e["started_at"], e["duration_seconds"]) for e in old] == [
        ("extract", None, None),
        ("broken", None, None),  # the step it failed at: no row, no start
    ]
    agent = _json("history", "bill-1", "--db", str(db))  # the agent run, by its run id
    assert [e["kind"] for e in agent] == ["run", "model", "tool", "model", "end"]
    assert all(e["started_at"] is None and e["gap_seconds"] is None for e in agent)
    out = runner.invoke(app, ["history", "etl-failed", "--db", str(db)]).stdout
    assert "extract" in out and "ValueError: bad row 7" in out
    assert db.read_bytes() == before  # read only
    with Store(db=db) as store:  # upgrades the file
        plan = Plan(
            Step(lambda t: "rows", name="extract", writes="raw"),
            Step(lambda rows: f"fixed {rows}", name="broken"),  # the fixture's plan, fixed
            store=store,
            checkpoint_key="etl-failed",
            resume=True,
        )
        assert Agent(engine=plan)("go").ok
    new = _json("history", "etl-failed", "--db", str(db))
    assert [(e["name"], e["started_at"] is None) for e in new] == [
        ("extract", True),
        ("broken", False),
    ]
    assert new[1]["duration_seconds"] >= 0 and new[1]["gap_seconds"] is not None
