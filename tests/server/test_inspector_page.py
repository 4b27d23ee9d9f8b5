"""The inspector's pages in a real headless Chromium, over a real `stepstone serve` process
with workers: runs of every kind started through the API, then read, compared and acted
on from the page, by mouse and by keyboard, at 1280x800. Screenshots are written under the
test's folder and copied to ``$STEPSTONE_SCREENSHOTS`` when it is set."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.operate._browser import share
from tests.server._serve import Served, start_server, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

W = {"X-Stepstone-Action": "1"}


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A page 1280x800 in a fresh context of a headless Chromium."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    try:
        tab = context.new_page()
        tab.set_default_timeout(60_000)
        yield tab
    finally:
        context.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = start_server(str(tmp_path / "app.sqlite"), "--workers", "3")
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.lines)


def _status(served: Served, key: str) -> str:
    with served.client() as c:
        return str(c.get(f"/runs/{key}").json()["status"])


def _shot(page: Any, folder: Path, name: str) -> None:
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a page drawn, not a blank one
    share(path)


def _redraw(page: Any) -> None:
    """Redraw the page now, as its poll does, and wait until it has."""
    from playwright.sync_api import expect

    drawn = page.get_attribute("#live", "data-updates")
    page.evaluate("window.dispatchEvent(new HashChangeEvent('hashchange'))")
    expect(page.locator("#live")).not_to_have_attribute("data-updates", drawn or "")


def _fits(page: Any) -> None:
    """Readable at 1280 wide: nothing runs off the right edge of the page."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, f"the page is {width} px wide"


def test_the_inspector_on_runs_of_every_kind(page: Any, served: Served, tmp_path: Path) -> None:
    # guarantee 578, 579, 580, 581, 582
    gate = tmp_path / "gate"
    try:
        _every_kind(page, served, tmp_path, gate)
    finally:  # the live run's step ends whatever happened, so the server stops
        for i in range(3):
            Path(f"{gate}.{i}").touch()


def _every_kind(page: Any, served: Served, tmp_path: Path, gate: Path) -> None:
    from playwright.sync_api import expect

    shots = tmp_path / "shots"
    shots.mkdir()
    with served.client() as c:
        starts = [
            {"target": "serveapp:hello", "args": ["ada"], "key": "hello-ada"},
            {"target": "serveapp:hello", "args": ["bob"], "key": "hello-bob"},
            {
                "target": "serveapp:pipeline",
                "task": {"task": "load", "payload": "orders"},
                "key": "plan-ok",
            },
            {
                "target": "serveapp:pipeline",
                "task": {"task": "load", "payload": "bad batch"},
                "key": "plan-bad",
            },
            {"target": "serveapp:approver", "task": "refund o-1", "key": "agent-1"},
            {"target": "serveapp:talker", "args": ["talk-live", 3, str(gate)], "key": "talk-live"},
            {"target": "serveapp:trip", "task": {"task": "go", "payload": {}}, "key": "graph-1"},
        ]
        for body in starts:
            resp = c.post("/runs", json=body)
            assert resp.status_code == 202, resp.text
    for key, want in [
        ("hello-ada", "done"),
        ("hello-bob", "done"),
        ("plan-ok", "done"),
        ("plan-bad", "failed"),
        ("graph-1", "done"),
        ("agent-1", "paused"),
    ]:
        wait_until(lambda key=key, want=want: _status(served, key) == want)

    # 1. the list: counts, filters, error text
    page.goto(served.url)
    rows = page.locator("#runs tbody tr")
    page.wait_for_selector('#runs tbody tr[data-key="plan-bad"]')
    assert page.get_attribute('#counts button[data-count="failed"]', "data-n") == "1"
    assert int(page.get_attribute('#counts button[data-count="done"]', "data-n") or 0) >= 3
    said = page.inner_text('tr[data-key="plan-bad"]')
    assert "ValueError: bad rows in 'bad batch: 3 rows'" in said
    page.fill('input[name="error"]', "BAD ROWS")
    expect(rows).to_have_count(1, timeout=60_000)
    assert rows.nth(0).get_attribute("data-key") == "plan-bad"
    page.fill('input[name="error"]', "")
    page.click('#counts button[data-count="failed"]')  # a count is a filter too
    expect(rows).to_have_count(1, timeout=60_000)
    page.click('#counts button[data-count="failed"]')
    expect(rows).to_have_count(7, timeout=60_000)
    _fits(page)
    _shot(page, shots, "serve-runs.png")

    # 2. two runs side by side, picked on the list
    page.check('tr[data-key="hello-ada"] input.pick')
    page.check('tr[data-key="hello-bob"] input.pick')
    page.click("#compare")
    page.wait_for_selector("#diff tbody tr.first-diff")
    first = page.inner_text("#diff tbody tr.first-diff")
    assert "ada" in first and "bob" in first
    assert "differ" in page.inner_text("#diff-summary")
    _fits(page)
    _shot(page, shots, "serve-diff.png")

    # 3. a failed Plan, reached by keyboard: diagram, bars over time, its error inline
    page.goto(served.url)
    page.wait_for_selector('#runs tbody tr[data-key="plan-bad"]')
    page.focus('a[href="#run=plan-bad"]')
    _redraw(page)  # the list redraws on every poll: a row that did not change stays
    assert page.evaluate("document.activeElement.getAttribute('href')") == "#run=plan-bad"
    page.keyboard.press("Enter")
    page.wait_for_selector('#run-facts[data-status="failed"]')
    page.wait_for_selector('#diagram g.node[data-id="fetch"][data-state="done"]')
    assert page.get_attribute('#diagram g.node[data-id="check"]', "data-state") == "failed"
    lane = page.locator('#gantt .lane[data-name="fetch"]')
    assert "took" in (lane.get_attribute("title") or "")
    lane.focus()
    page.keyboard.press("Enter")  # brings its timeline row into view
    page.wait_for_selector('#timeline tr[aria-current="true"][data-name="fetch"]')
    _redraw(page)  # it rebuilds lanes and rows: the focus and the mark stay
    assert page.evaluate("document.activeElement.dataset.name") == "fetch"
    assert page.is_visible('#timeline tr[aria-current="true"][data-name="fetch"]')
    assert "bad rows" in page.inner_text("#run-error")
    assert page.is_visible("#retry-box") and page.is_hidden("#cancel")  # nothing to cancel
    _fits(page)
    _shot(page, shots, "serve-failed-plan.png")

    # a graph run, named by its queue entry's key: the nodes it went through
    page.goto(served.url + "#run=graph-1")
    for node in ("book", "pack", "leave"):
        page.wait_for_selector(f'#diagram g.node[data-id="{node}"][data-state="done"]')
    assert page.locator("#gantt .lane").count() >= 4
    _fits(page)
    _shot(page, shots, "serve-graph.png")

    # 4. a done run offers no action that cannot apply
    page.goto(served.url + "#run=hello-ada")
    page.wait_for_selector('#run-facts[data-status="done"]')
    assert page.is_hidden("#cancel") and page.is_hidden("#resume")

    # 5. an agent run: its turns, then an approval, confirmed (a dismissed one does nothing)
    page.goto(served.url + "#run=agent-1")
    turn = page.locator('#turns li.turn[data-turn="0"]')
    expect(turn).to_contain_text("refund")
    assert "o-1" in turn.inner_text() and "tokens" in turn.inner_text()
    page.click("#approvals-table button.approve")
    page.wait_for_selector("#confirm[open]")
    page.keyboard.press("Escape")
    page.wait_for_selector("#confirm", state="hidden")
    with served.client() as c:
        waiting = c.get("/runs/agent-1").json()["pending_approvals"]
    assert [p["decision"] for p in waiting] == [None]
    page.click("#approvals-table button.approve")
    page.wait_for_selector("#confirm[open]")
    page.keyboard.press("Tab")  # from "keep it as it is" to "do it"
    page.keyboard.press("Enter")
    page.wait_for_selector("#action-result:has-text('approved refund call')")
    # the worker resumes it; the page follows without a reload
    page.wait_for_selector('#run-facts[data-status="done"]')
    expect(page.locator('#turns li.turn[data-turn="1"]')).to_contain_text("refund done")
    _fits(page)
    _shot(page, shots, "serve-agent.png")

    # 6. a live run: its stream item by item, a cancel dismissed, then its end
    page.goto(served.url + "#run=talk-live")
    page.wait_for_selector("#live:has-text('live (events)')")
    page.wait_for_selector("#cancel:visible")
    page.click("#cancel")
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm-no")
    with served.client() as c:
        assert c.get("/runs/talk-live").json()["cancel_requested"] is False
    Path(f"{gate}.0").touch()
    box = '#streams .stream[data-name="tokens"]'
    page.wait_for_selector(f'{box}[data-items="1"]')
    assert "tok0" in page.inner_text(f"{box} .stream-text")
    _shot(page, shots, "serve-live-stream.png")
    Path(f"{gate}.1").touch()
    page.wait_for_selector(f'{box}[data-items="2"]')
    Path(f"{gate}.2").touch()
    page.wait_for_selector(f'{box}[data-ended="done"]')
    assert page.inner_text(f"{box} .stream-text").count("tok") == 3
    page.wait_for_selector('#run-facts[data-status="done"]')


def test_a_stranded_run_shows_where_its_owner_died(page: Any, tmp_path: Path) -> None:
    # guarantee 574, 578
    db = tmp_path / "app.sqlite"
    crash = subprocess.run(  # a graph run whose process dies in its node "leave"
        [sys.executable, str(ROOT / "tests" / "operate" / "_graph_crash.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert crash.returncode == 9, crash.stderr
    served = start_server(str(db))
    try:
        page.goto(served.url)
        stranded = '#counts button[data-count="stranded"]'
        page.wait_for_selector(f'{stranded}[data-n="1"]')
        page.click(stranded)
        rows = page.locator("#runs tbody tr")
        page.wait_for_selector('#runs tbody tr[data-status="running"]')
        assert rows.count() == 1 and "dead (stranded)" in rows.nth(0).inner_text()
        rows.nth(0).locator("a").first.click()
        page.wait_for_selector('#gantt .lane-now[data-state="stranded"]')
        assert "stranded" in page.inner_text("#gantt .lane-now")
        for node in ("book", "pack"):
            page.wait_for_selector(f'#diagram g.node[data-id="{node}"][data-state="done"]')
        assert page.get_attribute('#diagram g.node[data-id="(next)"]', "data-state") == "stranded"
        _fits(page)
        _shot(page, tmp_path, "serve-stranded.png")
    finally:
        assert served.stop() == 0
