"""``stepstone serve`` as a real process, talked to over HTTP, on SQLite and PostgreSQL:
starting runs, reading them, listing them, acting on them, sending messages, approving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server._serve import SECRET, Served, sse, start_server, wait_until

W = {"X-Stepstone-Action": "1"}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server (with 4 worker slots) per backend for the whole module."""
    if request.param == "postgres":
        store = request.getfixturevalue("pg_url")
    else:
        store = str(tmp_path_factory.mktemp("serve") / "app.sqlite")
    secret = tmp_path_factory.mktemp("secret") / "secret"
    secret.write_text(SECRET)
    server = start_server(store, "--workers", "4", "--webhook-secret-file", str(secret))
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.lines)


def _finished(served: Served, key: str) -> dict:
    with served.client() as c:

        def done() -> dict | None:
            run = c.get(f"/runs/{key}").json()
            entry = run.get("entry") or {}
            return run if entry.get("status") in ("done", "failed", "cancelled") else None

        return wait_until(done)


def test_start_a_workflow_and_read_its_result(served: Served) -> None:
    # guarantee 565
    with served.client() as c:
        resp = c.post("/runs", json={"target": "serveapp:hello", "args": ["ada"]})
        assert resp.status_code == 202, resp.text
        started = resp.json()
        assert started["status"] == "queued" and started["queue"] == "default"
        key = started["key"]
        run = _finished(served, key)
        assert run["status"] == "done" and run["kind"] == "workflow"
        assert run["result"] == "HELLO ADA!" and run["error"] is None
        assert run["entry"]["status"] == "done" and run["entry"]["target"] == "serveapp:hello"
        assert [op["name"] for op in run["operations"]] == ["shout"]
        assert "cancel" not in run["actions"]
        # the same key again: the done run gives its result again
        again = c.post("/runs", json={"target": "serveapp:hello", "args": ["ada"], "key": key})
        assert again.status_code == 202 and again.json()["key"] == key


def test_a_failed_run_shows_its_error_and_lists_by_error_text(served: Served) -> None:
    # guarantee 565, 566
    with served.client() as c:
        key = c.post(
            "/runs", json={"target": "serveapp:broken", "args": [7], "key": "etl-broken"}
        ).json()["key"]
        run = _finished(served, key)
        assert run["status"] == "failed"
        assert (
            run["error"]["type"].endswith("ValueError") and "bad row 7" in run["error"]["message"]
        )
        found = c.get("/runs", params={"error": "BAD ROW 7"}).json()
        assert "etl-broken" in [r["key"] for r in found["runs"]]
        assert c.get("/runs", params={"error": "no such text"}).json()["total"] == 0
        failed = c.get("/runs", params={"status": "failed", "kind": "workflow"}).json()
        assert "etl-broken" in [r["key"] for r in failed["runs"]]
        assert c.get("/runs", params={"prefix": "etl-"}).json()["total"] >= 1
        assert "etl-broken" in [
            r["key"] for r in c.get("/runs", params={"queue": "default"}).json()["runs"]
        ]
        assert c.get("/runs", params={"queue": "nowhere"}).json()["total"] == 0
        # retry from its step: rewound and queued again, it fails the same way
        retried = c.post(f"/runs/{key}/retry", params={"from": "0"}, headers=W)
        assert retried.status_code == 200, retried.text
        assert retried.json()["entry"] is not None


def test_runs_are_paged(served: Served) -> None:
    # guarantee 566
    with served.client() as c:
        for i in range(3):
            r = c.post(
                "/runs", json={"target": "serveapp:hello", "args": [f"p{i}"], "key": f"page-{i}"}
            )
            assert r.status_code == 202
        for i in range(3):
            _finished(served, f"page-{i}")
        first = c.get("/runs", params={"prefix": "page-", "limit": 2}).json()
        assert first["total"] == 3 and len(first["runs"]) == 2 and first["next_offset"] == 2
        rest = c.get("/runs", params={"prefix": "page-", "limit": 2, "offset": 2}).json()
        assert len(rest["runs"]) == 1 and rest["next_offset"] is None
        keys = {r["key"] for r in first["runs"] + rest["runs"]}
        assert keys == {"page-0", "page-1", "page-2"}


def test_stream_then_end_event(served: Served) -> None:
    # guarantee 568
    with served.client() as c:
        key = c.post(
            "/runs", json={"target": "serveapp:talker", "args": ["talk-1", 5], "key": "talk-1"}
        ).json()["key"]
        events = list(sse(c, f"/runs/{key}/streams/tokens"))
        items = [e for e in events if e.event == "item"]
        assert [e.id for e in items] == ["0", "1", "2", "3", "4"]
        assert '"tok4"' in items[-1].data
        assert events[-1].event == "end" and '"status": "done"' in events[-1].data
        # reconnecting after the last item: only the end
        again = list(sse(c, f"/runs/{key}/streams/tokens", last_id="4"))
        assert [e.event for e in again] == ["end"]
        middle = list(sse(c, f"/runs/{key}/streams/tokens", last_id="1"))
        assert [e.id for e in middle if e.event == "item"] == ["2", "3", "4"]
        assert c.get("/runs/nobody/streams/tokens").status_code == 404


def test_messages_and_cancel(served: Served, tmp_path: Path) -> None:
    # guarantee 567
    gate = tmp_path / "gate"
    with served.client() as c:
        key = c.post(
            "/runs",
            json={"target": "serveapp:talker", "args": ["held", 3, str(gate)], "key": "held"},
        ).json()["key"]
        wait_until(lambda: c.get(f"/runs/{key}").json()["status"] == "running")
        sent = c.post(f"/runs/{key}/messages/nudge", json={"n": 1})
        assert sent.status_code == 202 and isinstance(sent.json()["id"], int)
        run = c.get(f"/runs/{key}").json()
        assert [m["topic"] for m in run["messages"]["pending"]] == ["nudge"]
        assert "cancel" in run["actions"] and "send" in run["actions"]
        out = c.post(f"/runs/{key}/cancel", json={"reason": "enough"})
        assert out.status_code == 200 and out.json()["outcome"].startswith("cancel requested")
        assert c.get(f"/runs/{key}").json()["cancel_requested"] is True
        for i in range(3):
            (tmp_path / f"gate.{i}").touch()
        _finished(served, key)
        # a run that has not started yet is cancelled at once, and offers no cancel after
        later = c.post(
            "/runs", json={"target": "serveapp:hello", "args": ["x"], "delay": 600, "key": "later"}
        ).json()["key"]
        assert "cancel" in c.get(f"/runs/{later}").json()["actions"]
        out = c.post(f"/runs/{later}/cancel", headers=W)
        assert out.status_code == 200, out.text
        run = c.get(f"/runs/{later}").json()
        assert run["entry"]["status"] == "cancelled" and "cancel" not in run["actions"]


def test_an_approval_from_the_api_resumes_the_run(served: Served) -> None:
    # guarantee 567
    with served.client() as c:
        key = c.post(
            "/runs", json={"target": "serveapp:approver", "task": "refund o-1", "key": "bill-7"}
        ).json()["key"]
        run = wait_until(lambda: (r := c.get(f"/runs/{key}").json())["pending_approvals"] and r)
        call = run["pending_approvals"][0]
        assert call["tool"] == "refund" and "approve" in run["actions"]
        bad = c.post(f"/runs/{key}/approvals/nope", json={"approve": True})
        assert bad.status_code == 409 and call["call_id"] in bad.json()["error"]
        ok = c.post(f"/runs/{key}/approvals/{call['call_id']}", json={"approve": True})
        assert ok.status_code == 200, ok.text
        assert ok.json()["requeued"] and "queued again" in ok.json()["outcome"]
        # the run's last commit, then its queue entry's (a separate commit on PostgreSQL)
        done = wait_until(
            lambda: (r := c.get(f"/runs/{key}").json())["entry"]["status"] == "done" and r
        )
        assert done["status"] == "done"
        assert done["agent"]["effects"][-1]["name"] in ("refund", "model") or done["agent"]


def test_openapi_document_names_every_route(served: Served) -> None:
    with served.client() as c:
        doc = c.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in (
        "/runs",
        "/runs/{key}",
        "/runs/{key}/streams/{name}",
        "/runs/{key}/cancel",
        "/runs/{key}/messages/{topic}",
        "/runs/{key}/approvals/{call_id}",
    ):
        assert path in doc["paths"]
