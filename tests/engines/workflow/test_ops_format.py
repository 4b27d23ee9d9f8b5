"""The first operation journal format keeps loading: runs it recorded replay, show and
resume with today's code (guarantee 495).

The fixture is a SQLite store written by ``make_ops_fixture.py`` with the stepstone of the
first ``ops`` journal format; each test opens a copy of it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stepstone import Store
from stepstone.cli import app
from stepstone.durable import read_run
from tests.engines.workflow.make_ops_fixture import (
    BREAK,
    CALLS,
    RESULTS,
    fx_checkout,
    fx_failing,
    fx_interrupted,
    fx_refund,
    fx_shipping,
)

FIXTURE = Path(__file__).with_name("fixtures") / "ops_journal_v1.sqlite.gz"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    CALLS.clear()
    BREAK.clear()
    yield
    CALLS.clear()
    BREAK.clear()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A copy of the frozen store (the fixture itself is never written)."""
    path = tmp_path / "ops.sqlite"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def _cli(args: list[str]) -> Any:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, args)


def test_the_fixture_holds_runs_of_every_kind(db: Path) -> None:
    # guarantee 495: what was frozen (a test that would pass on an empty store proves nothing)
    with Store(db=db) as store:
        status = {key: store.read(key)["status"] for key in store.keys()}
        found = read_run(store, "done")
        assert found is not None
        _, rows = found
    assert [r.kind for r in rows] == ["start", *["ops"] * 8, "result"]
    assert json.loads(rows[0].data)["format"] == 1
    assert status == {
        "done": "done",
        "done/2": "done",
        "stopped": "running",
        "failed": "failed",
        "in-doubt": "running",
    }


def test_a_finished_run_returns_its_recorded_result_and_runs_no_step(db: Path) -> None:
    # guarantee 495
    with Store(db=db) as store:
        assert fx_checkout.using(store=store, key="done").run_sync("o-1") == RESULTS["done"]
        assert fx_refund.using(store=store, key="done/2").run_sync("o-1") == "receipt-o-1--100"
        view = store.read("done")
        assert view["result"] == RESULTS["done"] and view["workflow"] == "fx_checkout"
    assert CALLS == []


def test_show_and_history_tell_the_recorded_steps(db: Path) -> None:
    # guarantee 495: the operator's views of old runs, from the CLI
    args = ["--db", str(db)]
    shown = _cli(["show", "done", "--json", *args])
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.stdout)
    assert [(o["position"], o["name"], o["status"]) for o in detail["operations"]] == [
        ("0", "fx_charge", "done"),
        ("1", "fx_score", "done"),
        ("2.0.0", "fx_reserve", "done"),
        ("2.1.0", "fx_reserve", "done"),
        ("2", "fx_refund", "done"),
        ("3", "fx-tax", "done"),
        ("4", "fx_tax", "done"),
        ("5", "stage", "done"),
        ("6", "progress", "done"),
        ("7", "sleep", "done"),
    ]
    ops = detail["operations"]
    assert ops[0]["args"] == ["o-1", 1299] and ops[0]["value"] == "receipt-o-1-1299"
    assert detail["record"]["result"] == RESULTS["done"]
    text = _cli(["show", "done", *args])
    assert text.exit_code == 0, text.output
    for word in ("workflow run", "fx_charge", "fx_score", "fx_reserve", "fx_refund"):
        assert word in text.stdout, word
    history = _cli(["history", "done", *args])
    assert history.exit_code == 0, history.output
    for word in ("start", "0 fx_charge", "1 fx_score", "4 fx_tax", "result"):
        assert word in history.stdout, word
    failed = json.loads(_cli(["show", "failed", "--json", *args]).stdout)
    assert failed["record"]["error"]["message"] == "card declined"
    assert [o["status"] for o in failed["operations"]] == ["done", "failed"]


def test_a_stopped_run_resumes_replaying_its_recorded_steps(db: Path) -> None:
    # guarantee 495: the first step and the gathered two are replayed; only the last runs
    with Store(db=db) as store:
        assert (
            fx_interrupted.using(store=store, key="stopped").run_sync("o-2") == (RESULTS["stopped"])
        )
        assert CALLS == [("fx_charge", 2)]
        view = store.read("stopped")
        assert view["status"] == "done"
        assert [s["position"] for s in view["steps"]] == ["0", "1.0.0", "1.1.0", "1"]


def test_a_failed_run_resumes_running_the_failed_step_again(db: Path) -> None:
    # guarantee 495
    with Store(db=db) as store:
        assert fx_failing.using(store=store, key="failed").run_sync("o-3") == RESULTS["failed"]
        assert CALLS == [("fx_charge", 2)]
        assert store.read("failed")["status"] == "done"


def test_a_step_left_in_doubt_runs_again_and_the_rest_replays(db: Path) -> None:
    # guarantee 495
    with Store(db=db) as store:
        assert (
            fx_shipping.using(store=store, key="in-doubt").run_sync("o-4") == (RESULTS["in-doubt"])
        )
        assert CALLS == [("fx_ship", "o-4")]
        assert store.read("in-doubt")["status"] == "done"
