"""A run with a damaged journal row: operators see what is left, and rewind past the damage.

Each test changes one byte of a closed SQLite store inside one step's stored output, as a
failing disk does: the row no longer matches its checksum. A resume refuses the run; these
tests check what an operator can still do with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stepstone import Agent, CheckpointCorruptError, Plan, Step, Store
from stepstone.cli import app
from stepstone.durable import retry_run, run_detail
from stepstone.store import check_store
from tests.store.damage import flip, settle, stored_rows

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def etl(store: Store, calls: list[str]) -> Agent:
    """extract -> transform -> load, each recording its call; resumable under "job"."""

    def extract(day: str) -> dict[str, Any]:
        calls.append("extract")
        return {"day": day, "n": 3}

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        calls.append("transform")
        return {"marker": "transformed-rows", "rows": batch["n"] * 2}

    def load(batch: dict[str, Any]) -> str:
        calls.append("load")
        return f"loaded {batch['rows']} rows"

    plan = Plan(
        Step(extract), Step(transform), Step(load), store=store, checkpoint_key="job", resume=True
    )
    return Agent(engine=plan)


def damaged_run(tmp_path: Path, marker: bytes) -> Path:
    """A finished run whose step output holding ``marker`` has one byte changed."""
    db = tmp_path / "etl.sqlite"
    with Store(db=db) as store:
        assert etl(store, [])("mon").ok
    settle(db)
    flip(db, marker, at=3)
    return db


def _cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout + result.stderr


def test_show_and_history_list_every_readable_row_and_mark_the_damaged_one(
    tmp_path: Path,
) -> None:
    # guarantee 354
    db = damaged_run(tmp_path, b"transformed-rows")
    with Store(db=db, read_only=True) as store:
        detail = run_detail(store, "job")
    assert detail is not None
    kinds = [(e["seq"], e["kind"], e["name"]) for e in detail["timeline"]]
    assert kinds == [(1, "step", "extract"), (2, "damaged", None), (3, "step", "load")]
    assert detail["timeline"][0]["payload"] == {"day": "mon", "n": 3}
    error = detail["timeline"][1]["error"]
    assert error["type"] == "CheckpointCorruptError"
    assert error["message"].startswith("journal row 2 does not match its checksum")
    assert "`stepstone retry job --from extract`" in detail["corrupt"]

    code, out = _cli("show", "job", "--db", str(db))
    assert code == 0, out
    assert "corrupt" in out and "stepstone retry job --from extract" in " ".join(out.split())
    code, out = _cli("history", "job", "--db", str(db), "--json")
    assert code == 0, out
    assert [e["kind"] for e in json.loads(out)] == ["step", "damaged", "step"]
    code, out = _cli("history", "job", "--db", str(db))
    assert code == 0, out
    assert "damaged" in out and "stepstone retry job --from extract" in " ".join(out.split())


def test_a_rewind_to_before_the_damage_recovers_the_run(tmp_path: Path) -> None:
    # guarantee 354: the step before the damage and those after it run again
    db = damaged_run(tmp_path, b"transformed-rows")
    before = stored_rows(db)
    with Store(db=db) as store:
        for past in ("transform", "load"):  # would keep the damaged row: refused
            with pytest.raises(CheckpointCorruptError, match=r"rewind it to 'extract'"):
                retry_run(store, "job", from_step=past)
    assert stored_rows(db) == before  # nothing was changed

    code, out = _cli("retry", "job", "--db", str(db), "--from", "extract")
    assert code == 0, out
    calls: list[str] = []
    with Store(db=db) as store:
        env = etl(store, calls)("mon")
        assert env.ok and env.payload == "loaded 6 rows"
        assert calls == ["extract", "transform", "load"]
        assert not check_store(store).problems
        calls.clear()
        assert etl(store, calls)("mon").metadata["cached"]  # done: nothing runs
        assert calls == []


def test_a_damaged_first_step_leaves_nothing_to_rewind_to(tmp_path: Path) -> None:
    # guarantee 354
    db = damaged_run(tmp_path, b'"day":"mon"')
    with Store(db=db) as store:
        detail = run_detail(store, "job")
        assert detail is not None
        assert "no step was journaled before it: delete it" in detail["corrupt"]
        with pytest.raises(CheckpointCorruptError, match="no step was journaled before it"):
            retry_run(store, "job", from_step="extract")
        assert store.delete("job")
        assert etl(store, [])("mon").ok


def test_the_web_inspector_shows_a_damaged_run(tmp_path: Path) -> None:
    # guarantee 354
    import urllib.request

    from stepstone.ui import InspectorServer

    db = damaged_run(tmp_path, b"transformed-rows")
    with (
        Store(db=db, read_only=True) as store,
        InspectorServer(store, port=0).start() as server,
        urllib.request.urlopen(server.url + "api/run?key=job", timeout=30) as resp,
    ):
        run = json.loads(resp.read())
    assert [e["kind"] for e in run["timeline"]] == ["step", "damaged", "step"]
    assert "stepstone retry job --from extract" in run["corrupt"]
