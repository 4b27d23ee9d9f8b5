"""The web inspector shows what a run waits for, its events, streams and mail (in a real
headless Chromium)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store, send
from stepstone.durable import claim_run
from stepstone.durable._messages import encode_value
from stepstone.store._extras import ExtraWrites, Timer
from stepstone.ui import InspectorServer
from tests.operate._browser import share

pytestmark = pytest.mark.slow


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A page in a fresh context of a headless Chromium."""
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        yield page
    finally:
        context.close()


def test_a_waiting_runs_page_lists_its_waits_events_streams_and_mail(
    page: Any, tmp_path: Path
) -> None:
    # guarantee 514
    with Store(db=tmp_path / "w.sqlite") as store:
        claimed = claim_run(store, "approval-o-42", kind="plan", resume=False, first_step="a")
        assert claimed.run is not None
        now = store.backend.clock()
        claimed.run.commit_sync(
            status="running",
            next_step="a",
            rows=[("t", None, {})],
            extras=ExtraWrites(
                events=(("stage", encode_value("asked ana", "e")),),
                stream=(("progress", encode_value({"pct": 50}, "s")),),
                timers=(
                    Timer(
                        run_key="approval-o-42",
                        name="3",
                        wake_at=now + 86400,
                        topic="approval",
                        since=now,
                    ),
                ),
            ),
        )
        send(store, "approval-o-42", "reminder", "ping")
        claimed.run.release()
        with InspectorServer(store, port=0, poll_seconds=0.3).start() as server:
            page.goto(server.url + "#run=approval-o-42")
            page.wait_for_selector("#waits:not([hidden])")
            items = page.locator("#waits-list li")
            texts = [items.nth(i).inner_text() for i in range(items.count())]
            assert texts[0].startswith("waits waiting for a message on 'approval', until")
            assert texts[1] == "event stage: asked ana"
            assert texts[2] == "stream progress: 1 value(s)"
            assert texts[3] == "messages 1 pending on 'reminder'"
            page.screenshot(path=str(tmp_path / "inspector-waiting-run.png"), full_page=True)
            share(tmp_path / "inspector-waiting-run.png")
