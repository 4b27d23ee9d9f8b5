"""The web inspector in a real headless Chromium: run list, a failed run, a live run."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.ui import InspectorServer
from tests.operate._browser import launch, share, share_near
from tests.operate._live import SteppedRun
from tests.operate._runs import done_run, failed_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def module_chromium() -> Iterator[Any]:
    """One headless Chromium for this module's tests (each gets a fresh context of it):
    started once instead of once per test. Every test here already makes its runs on
    another thread (Playwright's sync API holds a running loop on this one); the browser
    is closed when the module's last test ends, before any other module's test starts."""
    yield from launch()


@pytest.fixture
def browser(module_chromium: Any) -> Iterator[Any]:
    """A page in a fresh context of a headless Chromium."""
    context = module_chromium.new_context(viewport={"width": 1200, "height": 640})
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        yield page
    finally:
        context.close()


def _in_thread(fn: Callable[[], None]) -> None:
    # Playwright's sync API runs an event loop on this thread; runs are made on another.
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join(120)


def _share_of(png: bytes, rgb: tuple[int, int, int]) -> float:
    return share_near(png, rgb, tol=6)


def test_inspector_in_headless_chromium(browser: Any, tmp_path: Path) -> None:
    # guarantee 279, 280, 281
    from playwright.sync_api import expect

    page = browser
    shots = tmp_path / "shots"
    shots.mkdir()
    with Store(db=tmp_path / "runs.sqlite") as store:

        def prepare() -> None:
            for day in ("2026-11-20", "2026-11-21", "2026-11-22"):
                done_run(store, f"etl-{day}", payload=f"{day}: 3 rows loaded")
            failed_run(store, "nightly-report")

        _in_thread(prepare)
        live = SteppedRun(store, "backfill-live", steps=4).start()
        try:
            assert live.started[0].wait(60)
            with InspectorServer(store, port=0, poll_seconds=0.3).start() as server:
                # 1. the run list, with statuses and the failed run's error type
                page.goto(server.url)
                page.wait_for_selector('#runs tbody tr[data-key="nightly-report"]')
                rows = page.locator("#runs tbody tr")
                assert rows.count() == 5
                assert page.get_attribute('tr[data-key="nightly-report"]', "data-status") == (
                    "failed"
                )
                assert "ValueError" in page.inner_text('tr[data-key="nightly-report"]')
                assert "live (lease" in page.inner_text('tr[data-key="backfill-live"]')
                assert page.inner_text("#mode") == "read-only"
                page.select_option('select[name="status"]', "done")
                expect(rows).to_have_count(3, timeout=60_000)
                page.select_option('select[name="status"]', "")
                expect(rows).to_have_count(5, timeout=60_000)
                shot = page.screenshot(path=str(shots / "inspector-runs.png"), full_page=True)
                # the failed run's red status badge is on screen
                assert _share_of(shot, (0xFE, 0xE2, 0xE2)) > 0.0005
                share(shots / "inspector-runs.png")

                # 2. a failed run's timeline, with its error
                page.click('a[href="#run=nightly-report"]')
                page.wait_for_selector("#run-error:not([hidden])")
                error = page.inner_text("#run-error")
                assert error == "ValueError at step validate: bad row 7"
                timeline = page.locator("#timeline tbody tr")
                assert timeline.count() == 2
                assert "extract" in timeline.nth(0).inner_text()
                assert "bad row 7" in timeline.nth(1).inner_text()
                # guarantee 421: when each step started, how long it took, the gap before it
                took = timeline.nth(0).locator("td.took").inner_text()
                assert re.fullmatch(r"\d+(\.\d+)? (us|ms|s)", took), took
                assert re.fullmatch(
                    r".*\d\d\.\d{3}", timeline.nth(0).locator("td.started").inner_text()
                )
                assert timeline.nth(0).locator("td.gap").inner_text() != "—"
                assert page.is_hidden("#actions")  # read-only: no cancel button
                box = page.locator("#run-error").screenshot()
                assert _share_of(box, (0xFE, 0xF2, 0xF2)) > 0.5  # the red error box
                page.screenshot(path=str(shots / "inspector-failed-run.png"), full_page=True)
                share(shots / "inspector-failed-run.png")

                # 3. a live run updating without a reload
                page.goto(server.url + "#run=backfill-live")
                page.wait_for_selector('#run-facts[data-steps="0"]')
                for i in range(3):
                    live.advance(i)
                    page.wait_for_selector(f'#run-facts[data-steps="{i + 1}"]')
                    assert page.locator("#timeline tbody tr").count() == i + 1
                assert "step_2" in page.inner_text("#timeline tbody")
                assert page.get_attribute("#run-facts", "data-status") == "running"
                page.screenshot(path=str(shots / "inspector-live-run.png"), full_page=True)
                share(shots / "inspector-live-run.png")
                live.advance(3)
                page.wait_for_selector('#run-facts[data-status="done"]')
                assert int(page.get_attribute("#live", "data-updates") or 0) >= 4
        finally:
            live.finish()
        assert live.error is None


def test_cancel_from_the_page_with_actions_allowed(browser: Any, tmp_path: Path) -> None:
    # guarantee 283
    from playwright.sync_api import expect

    page = browser
    with Store(db=tmp_path / "runs.sqlite") as store:
        live = SteppedRun(store, "live-job", steps=3).start()
        try:
            assert live.started[0].wait(60)
            with InspectorServer(store, port=0, allow_actions=True, poll_seconds=0.3).start() as (
                server
            ):
                page.goto(server.url + "#run=live-job")
                page.wait_for_selector("#actions:not([hidden])")
                assert page.inner_text("#mode") == "actions enabled"
                page.click("#cancel")
                page.click("#confirm-yes")  # every action is confirmed first
                page.wait_for_selector("#action-result:has-text('cancel requested')")
                page.wait_for_selector("#run-facts .cancel-flag")  # the flag shows until it stops
                live.gates[0].set()  # the owner commits its step, sees the flag and stops
                page.wait_for_selector('#run-facts[data-status="failed"]')
                assert page.inner_text("#run-error").startswith("RunCancelledError at step step_1")
                assert page.is_hidden("#actions") is False  # still not done: cancel stays
                # guarantee 283: rewind it from the page
                page.click('#timeline tr[data-name="step_0"] button.retry')
                page.click("#confirm-yes")
                page.wait_for_selector('#run-facts[data-status="paused"]')
                assert "next step step_0" in page.inner_text("#run-facts")
                expect(page.locator("#timeline tbody tr")).to_have_count(0, timeout=60_000)
        finally:
            live.finish()
        assert store.read("live-job")["completed_steps"] == []
        assert store.read("live-job")["next_step"] == "step_0"
        assert live.started[1].is_set() is False


def test_run_list_pages(browser: Any, tmp_path: Path) -> None:
    # guarantee 288
    from playwright.sync_api import expect

    page = browser
    with Store(db=tmp_path / "runs.sqlite") as store:

        def prepare() -> None:
            for i in range(5):
                done_run(store, f"job-{i}")

        _in_thread(prepare)
        with InspectorServer(store, port=0, page_size=2).start() as server:
            page.goto(server.url)
            rows = page.locator("#runs tbody tr")
            expect(rows).to_have_count(2, timeout=60_000)
            assert page.inner_text("#page") == "1-2 of 5"
            assert page.is_disabled("#newer") and not page.is_disabled("#older")
            first = [rows.nth(i).get_attribute("data-key") for i in range(2)]
            assert first == ["job-4", "job-3"]
            page.click("#older")
            page.wait_for_selector('#pager[data-offset="2"]')
            page.click("#older")
            page.wait_for_selector('#pager[data-offset="4"]')
            expect(rows).to_have_count(1, timeout=60_000)
            assert rows.nth(0).get_attribute("data-key") == "job-0"
            assert page.inner_text("#page") == "5-5 of 5" and page.is_disabled("#older")
            page.click("#newer")
            page.wait_for_selector('#pager[data-offset="2"]')
            expect(rows).to_have_count(2, timeout=60_000)


def test_approve_a_paused_agent_run_from_its_page(browser: Any, tmp_path: Path) -> None:
    # the Approve button records the decision the run's next resume applies
    from stepstone import Agent, Runner, tool
    from stepstone.testing import FunctionModel, call

    ran: list[str] = []

    @tool(requires_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append(order)
        return f"refunded {amount} EUR on {order}"

    replies = {0: call("refund", order="o-42", amount=30), 1: "Refund issued."}
    agent = Agent(model=FunctionModel(lambda r: replies[r.turn]), tools=[refund])
    page = browser
    with Store(db=tmp_path / "runs.sqlite") as store:
        results: list[Any] = []
        _in_thread(
            lambda: results.append(
                Runner(store=store).run_sync(
                    agent, user_message="Refund o-42", run_id="refund-o42", thread_id="t"
                )
            )
        )
        call_id = results[0].pending_approvals[0]["call_id"]
        key = store.keys()[0]
        with InspectorServer(store, port=0, poll_seconds=0.3).start() as server:
            page.goto(server.url + "#run=" + key)
            row = f'#approvals-table tr[data-call-id="{call_id}"]'
            page.wait_for_selector(row)
            assert "refund" in page.inner_text(row) and "o-42" in page.inner_text(row)
            assert page.locator(f"{row} button.approve").count() == 0  # read-only
            assert "model:0:0" in page.inner_text("#effects")
        with InspectorServer(store, port=0, allow_actions=True, poll_seconds=0.3).start() as (
            server
        ):
            page.goto(server.url + "#run=" + key)
            page.click(f"{row} button.approve")
            page.click("#confirm-yes")
            page.wait_for_selector("#action-result:has-text('approved refund call')")
            page.wait_for_selector(f"{row} .decision:has-text('approved')")
            page.screenshot(path=str(tmp_path / "inspector-approve.png"))
            share(tmp_path / "inspector-approve.png")
            assert ran == []
            _in_thread(
                lambda: results.append(
                    Runner(store=store).resume_sync(agent, run_id="refund-o42", thread_id="t")
                )
            )
            assert results[1].state == "completed" and ran == ["o-42"]
            page.wait_for_selector('#run-facts[data-status="done"]')
            page.wait_for_selector("#approvals", state="hidden")
            page.wait_for_selector('#effects tr[data-position="tool:0:0"]')
            assert "refund" in page.inner_text('#effects tr[data-position="tool:0:0"]')


def test_a_run_with_megabytes_of_output_stays_live_in_the_page(
    browser: Any, tmp_path: Path
) -> None:
    """guarantee 379: the page of a run whose steps wrote 5 MB each gets their payloads cut,
    says how long each is and where to read it all, and keeps refreshing."""
    page = browser
    with Store(db=tmp_path / "runs.sqlite") as store:

        def prepare() -> None:
            for i in range(3):
                done_run(store, f"big-{i}", payload=str(i) * 5_000_000)

        _in_thread(prepare)
        with InspectorServer(store, port=0, poll_seconds=0.3).start() as server:
            page.goto(server.url + "#run=big-2")
            page.wait_for_selector("#timeline tbody tr")
            first = page.locator("#timeline tbody tr").nth(0).inner_text()
            assert "(5000000 characters; all of it: stepstone history KEY --payloads" in first
            updates = int(page.get_attribute("#live", "data-updates") or 0)
            page.wait_for_selector(f'#live[data-updates="{updates + 3}"]')
