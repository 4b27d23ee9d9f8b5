"""`stepstone runs` filters, order, paging and columns on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Store
from stepstone.cli import app
from stepstone.durable import query_runs
from stepstone.store._base import Claim, RunHead
from tests.operate._runs import done_run, failed_run
from tests.operate.conftest import open_args

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout, result.stderr


def _keys(*args: str) -> list[str]:
    code, out, err = _run("runs", *args, "--json")
    assert code == 0, err
    return [line["key"] for line in json.loads(out)]


def _age(store: Store, key: str, seconds: float) -> None:
    """Move a run's last commit ``seconds`` into the past (as if it ran then)."""

    def decide(head: RunHead | None, _kv: str | None) -> Claim:
        assert head is not None
        when = head.updated_at - seconds
        return Claim(
            head=head.replace(
                version=head.version + 1, updated_at=when, created_at=min(head.created_at, when)
            )
        )

    store.backend.run_transact(key, decide)


def test_filters_order_and_paging(store_args: list[str]) -> None:
    # guarantee 292
    with open_args(store_args) as store:
        done_run(store, "etl-old")
        done_run(store, "etl-new")
        failed_run(store, "etl-bad")
        done_run(store, "report-1")
        _age(store, "etl-old", 3 * 86400)
        _age(store, "etl-bad", 2 * 3600)
        _age(store, "report-1", 600)

    assert _keys(*store_args) == ["etl-bad", "etl-new", "etl-old", "report-1"]
    assert _keys(*store_args, "--status", "failed") == ["etl-bad"]
    assert _keys(*store_args, "--status", "done,failed", "--prefix", "etl-") == [
        "etl-bad",
        "etl-new",
        "etl-old",
    ]
    assert _keys(*store_args, "--kind", "plan", "--status", "done", "--status", "paused") == [
        "etl-new",
        "etl-old",
        "report-1",
    ]
    assert _keys(*store_args, "--kind", "agent") == []
    code, out, err = _run("runs", *store_args, "--kind", "plna")  # a typo is named
    assert code == 0 and "0 run(s)" in out
    kinds = "plan, graph, replan, agent, workflow"
    assert err == f"note: no run has kind 'plna'; stepstone's kinds are {kinds}\n"
    assert _keys(*store_args, "--older-than", "1d") == ["etl-old"]
    assert _keys(*store_args, "--newer-than", "1h") == ["etl-new", "report-1"]
    assert _keys(*store_args, "--older-than", "5m", "--newer-than", "1d") == [
        "etl-bad",
        "report-1",
    ]
    newest_first = ["etl-new", "report-1", "etl-bad", "etl-old"]
    assert _keys(*store_args, "--sort", "updated") == newest_first
    assert _keys(*store_args, "--sort", "updated", "--limit", "2") == newest_first[:2]
    assert (
        _keys(*store_args, "--sort", "updated", "--limit", "2", "--offset", "2")
        == (newest_first[2:])
    )
    assert _keys(*store_args, "--offset", "9") == []

    code, out, err = _run("runs", *store_args, "--json", "--status", "failed")
    (line,) = json.loads(out)
    assert line["steps"] == 1 and line["error_type"] == "ValueError"
    assert line["owner"]["state"] == "-"

    code, out, err = _run("runs", *store_args, "--sort", "updated", "--limit", "3")
    assert code == 0, err
    assert "4 run(s), 1-3 shown" in out and "--offset 3 shows the next page" in out
    bad = next(row for row in out.splitlines() if "etl-bad" in row)
    assert "ValueError" in bad and "failed" in bad and " 1 " in bad


def test_bad_filters_fail_in_one_line(store_args: list[str]) -> None:
    # guarantee 292
    for args, expected in [
        (["--status", "finished"], "unknown run status ['finished']; pass one of claimed"),
        (["--sort", "age"], "unknown sort 'age'; pass one of updated, created, key"),
        (["--older-than", "ten days"], "--older-than 'ten days'"),
    ]:
        code, _, err = _run("runs", *store_args, *args)
        assert code in (1, 2) and err.startswith("error: ") and err.count("\n") == 1, err
        assert expected in err
    code, _, err = _run("runs", *store_args, "--limit", "0")
    assert code == 2 and "--limit" in err


def test_query_runs_refuses_a_negative_page(tmp_path: Path) -> None:
    # guarantee 355: a negative limit would slice from the end and show a wrong page
    with Store(db=tmp_path / "q.sqlite") as store:
        done_run(store, "a")
        for kwargs in ({"limit": -1}, {"offset": -2}):
            with pytest.raises(ValueError, match="limit and offset must be >= 0"):
                query_runs(store, **kwargs)  # type: ignore[arg-type]
        assert query_runs(store, limit=0) == (1, [])


def test_runs_json_with_total_counts_every_page(store_args: list[str]) -> None:
    # guarantee 368
    with open_args(store_args) as store:
        for key in ("a", "b", "c"):
            done_run(store, key)
        failed_run(store, "d")

    code, out, err = _run("runs", *store_args, "--json", "--limit", "2", "--offset", "1")
    assert code == 0, err
    assert [line["key"] for line in json.loads(out)] == ["b", "c"]  # still a bare list

    code, out, err = _run(
        "runs", *store_args, "--json", "--with-total", "--limit", "2", "--offset", "1"
    )
    assert code == 0 and err == "", err
    page = json.loads(out)
    assert list(page) == ["total", "runs"] and page["total"] == 4
    assert [line["key"] for line in page["runs"]] == ["b", "c"]
    assert page["runs"][0] == json.loads(_run("runs", *store_args, "--json", "--prefix", "b")[1])[0]

    code, out, err = _run("runs", *store_args, "--json", "--with-total", "--status", "failed")
    assert json.loads(out)["total"] == 1
    code, out, err = _run("runs", *store_args, "--json", "--with-total", "--offset", "9")
    assert json.loads(out) == {"total": 4, "runs": []}
    code, out, err = _run("runs", *store_args, "--with-total", "--limit", "2")
    assert code == 0 and "4 run(s), 1-2 shown" in out  # the table always says it
