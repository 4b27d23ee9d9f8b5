"""Workflow runs seen and operated like any run: `stepstone runs/show/history/cancel/
retry/fork`, the inspector's API and page, and retention (guarantees 485-487)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import stepstone
from stepstone import Store, step, workflow
from stepstone.cli import app
from stepstone.durable import cancel_run, fork_run, prune, retry_run
from stepstone.exceptions import RunCancelledError
from stepstone.store import Retention
from stepstone.ui import InspectorServer
from tests.operate.conftest import open_args

RAN: list[str] = []
GATE: dict[str, threading.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RAN.clear()
    GATE.clear()
    yield
    for gate in GATE.values():
        gate.set()


@step
def fetch(order_id: str) -> dict[str, Any]:
    RAN.append(f"fetch {order_id}")
    return {"order": order_id, "cents": 1299}


@step(retries=1, retry_delay=0.0)
def price(order: dict[str, Any]) -> int:
    RAN.append("price")
    if "price" in GATE:
        GATE["started"].set()
        assert GATE["price"].wait(60)
    if RAN.count("price") == 1 and "flaky" in GATE:
        raise ConnectionError("rate service timed out")
    return int(order["cents"]) + 100


@step
def notify(order_id: str, total: int) -> str:
    RAN.append("notify")
    return f"{order_id}: {total}"


@workflow
async def invoice(order_id: str) -> str:
    order = await fetch(order_id)
    total = await price(order)
    return await notify(order_id, total)


def _cli(args: list[str]) -> Any:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, args)


def test_cli_lists_shows_and_tells_the_history_of_workflow_runs(store_args: list[str]) -> None:
    # guarantee 485
    GATE["flaky"] = threading.Event()
    with open_args(store_args) as store:
        assert invoice.using(store=store, key="inv-1").run_sync("o-1") == "o-1: 1399"
    runs = _cli(["runs", "--json", *store_args])
    assert runs.exit_code == 0, runs.output
    (row,) = json.loads(runs.stdout)
    assert (row["key"], row["kind"], row["status"], row["steps"]) == (
        "inv-1",
        "workflow",
        "done",
        3,
    )
    shown = _cli(["show", "inv-1", *store_args])
    assert shown.exit_code == 0, shown.output
    for text in ("workflow run", "3 step(s)", "fetch", "price", "notify", '["o-1", 1399]'):
        assert text in shown.stdout, text
    detail = json.loads(_cli(["show", "inv-1", "--json", *store_args]).stdout)
    ops = detail["operations"]
    assert [(o["position"], o["name"], o["status"]) for o in ops] == [
        ("0", "fetch", "done"),
        ("1", "price", "done"),
        ("2", "notify", "done"),
    ]
    assert ops[1]["attempts"] == 2 and ops[1]["failed_attempts"][0]["error"]["message"] == (
        "rate service timed out"
    )
    assert ops[0]["args"] == ["o-1"] and ops[0]["value"] == {"order": "o-1", "cents": 1299}
    assert all(isinstance(o["ms"], float) for o in ops)
    assert detail["record"]["result"] == "o-1: 1399"
    history = _cli(["history", "inv-1", *store_args])
    assert history.exit_code == 0, history.output
    for text in ("start", "0 fetch", "1 price", "2 notify", "result"):
        assert text in history.stdout, text


def _live(store: Store, key: str) -> tuple[threading.Thread, list[BaseException]]:
    GATE["price"], GATE["started"] = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            invoice.using(store=store, key=key).run_sync("o-2")
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert GATE["started"].wait(60)
    return thread, errors


def test_cancel_stops_a_live_workflow_at_its_next_commit_and_a_resume_continues(
    tmp_path: Path,
) -> None:
    # guarantee 486
    with Store(db=tmp_path / "c.sqlite") as store:
        thread, errors = _live(store, "inv-2")
        said = cancel_run(store, "inv-2", reason="wrong order")
        assert "cancel requested" in said
        GATE["price"].set()
        thread.join(60)
        assert len(errors) == 1 and isinstance(errors[0], RunCancelledError)
        view = store.read("inv-2")
        assert view["status"] == "failed" and view["error"]["type"] == "RunCancelledError"
        # the step that was running committed its outcome; nothing ran after it (the next
        # step's intent, committed with the cancel, is marked as never run)
        assert [s["status"] for s in view["steps"]] == ["done", "done", "not run"]
        assert RAN == ["fetch o-2", "price"]
        RAN.clear()
        assert invoice.using(store=store, key="inv-2").run_sync("o-2") == "o-2: 1399"
        assert RAN == ["notify"]


def test_retry_rewinds_a_workflow_to_a_step_and_fork_copies_it(tmp_path: Path) -> None:
    # guarantee 487
    with Store(db=tmp_path / "r.sqlite") as store:
        invoice.using(store=store, key="inv-3").run_sync("o-3")
        origin = store.read_entry("inv-3")  # noqa: F841 - read before the rewind
        RAN.clear()
        head = retry_run(store, "inv-3", from_step="price")
        assert head.status == "paused" and head.next_step == "1 price"
        view = store.read("inv-3")
        assert [s["name"] for s in view["steps"]] == ["fetch"] and view["result"] is None
        assert invoice.using(store=store, key="inv-3").run_sync("o-3") == "o-3: 1399"
        assert RAN == ["price", "notify"]  # fetch replayed; price and what follows ran
        RAN.clear()
        fork_run(store, "inv-3", at="0", to="inv-3b")
        assert store.read("inv-3b")["status"] == "paused"
        assert invoice.using(store=store, key="inv-3b").run_sync("o-3") == "o-3: 1399"
        assert RAN == ["price", "notify"]
        with pytest.raises(KeyError, match="no step 'ship'"):
            retry_run(store, "inv-3", from_step="ship")
        out = _cli(["retry", "inv-3", "--from", "2 notify", "--db", str(tmp_path / "r.sqlite")])
        assert out.exit_code == 0, out.output
        RAN.clear()
        assert invoice.using(store=store, key="inv-3").run_sync("o-3") == "o-3: 1399"
        assert RAN == ["notify"]


def test_retention_prunes_finished_workflow_runs(tmp_path: Path) -> None:
    # guarantee 485
    with Store(db=tmp_path / "p.sqlite") as store:
        invoice.using(store=store, key="old-1").run_sync("o")
        invoice.using(store=store, key="old-2").run_sync("o")
        report = prune(store, Retention(keep_last=1, min_age=__import__("datetime").timedelta(0)))
        assert [r.key for r in report.deleted] == ["old-1"]
        assert [r.kind for r in report.deleted] == ["workflow"]


def test_the_inspector_api_shows_a_workflow_runs_steps(tmp_path: Path) -> None:
    # guarantee 485
    import urllib.request

    with Store(db=tmp_path / "i.sqlite") as store:
        invoice.using(store=store, key="inv-5").run_sync("o-5")
        with (
            InspectorServer(store, port=0).start() as server,
            urllib.request.urlopen(server.url + "api/run?key=inv-5", timeout=30) as resp,
        ):
            data = json.loads(resp.read())
    assert data["kind"] == "workflow" and data["steps"] == 3
    assert [o["name"] for o in data["operations"]] == ["fetch", "price", "notify"]
    assert data["operations"][2]["value"] == "o-5: 1399"


@pytest.mark.slow
def test_the_inspector_page_shows_a_workflow_runs_steps(tmp_path: Path, chromium: Any) -> None:
    # guarantee 485
    from tests.operate._browser import share

    shots = tmp_path / "shots"
    shots.mkdir()
    with Store(db=tmp_path / "b.sqlite") as store:
        worker = threading.Thread(
            target=lambda: invoice.using(store=store, key="inv-6").run_sync("o-6")
        )
        worker.start()
        worker.join(60)
        with InspectorServer(store, port=0).start() as server:
            context = chromium.new_context(viewport={"width": 1280, "height": 800})
            try:
                page = context.new_page()
                page.set_default_timeout(60_000)
                page.goto(server.url + "#run=inv-6")
                page.wait_for_selector('#operations tbody tr[data-position="2"]')
                rows = page.locator("#operations tbody tr")
                assert rows.count() == 3
                assert "price" in rows.nth(1).inner_text() and "1399" in rows.nth(2).inner_text()
                assert "workflow run" in page.inner_text("#run-facts")
                page.screenshot(path=str(shots / "inspector-workflow.png"), full_page=True)
                share(shots / "inspector-workflow.png")
            finally:
                context.close()


def test_step_context_names_the_run_and_position_in_the_view(tmp_path: Path) -> None:
    # guarantee 481
    seen: list[stepstone.StepContext] = []

    @step(name="probe")
    def probe() -> str:
        seen.append(stepstone.step_context())
        return "ok"

    @workflow(name="probing")
    async def probing() -> str:
        return await probe()

    with Store(db=tmp_path / "s.sqlite") as store:
        probing.using(store=store, key="ctx-1").run_sync()
    (ctx,) = seen
    assert (ctx.key, ctx.position, ctx.name, ctx.attempt) == ("ctx-1", "0", "probe", 1)
    assert ctx.workflow == "workflow 'probing'"
