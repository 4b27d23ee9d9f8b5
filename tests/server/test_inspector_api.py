"""What the inspector's pages read, from a real `stepstone serve` process: the list's
counts and groups, a run's diagram, its change feed, an agent run's turns."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server._serve import HERE, Event, Served, sse, start_server, wait_until

W = {"X-Stepstone-Action": "1"}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A server whose workers serve the queue `default` only; one per module and backend
    (each test starts runs of keys of its own and reads only those)."""
    if request.param == "postgres":
        store = request.getfixturevalue("pg_url")
    else:
        store = str(tmp_path_factory.mktemp("served") / "app.sqlite")
    server = start_server(store, "--workers", "2", "--queue", "default")
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.lines)


def _status(c: Any, key: str) -> str:
    return str(c.get(f"/runs/{key}").json()["status"])


def test_counts_and_groups_of_the_list(served: Served) -> None:
    # guarantee 574
    with served.client() as c:
        for body in [
            {"target": "serveapp:hello", "args": ["ada"], "key": "g-done"},
            {"target": "serveapp:broken", "args": [3], "key": "g-failed"},
            {"target": "serveapp:waiter", "args": ["go"], "key": "g-waits"},
            {"target": "serveapp:hello", "args": ["x"], "key": "g-later", "queue": "nobody"},
        ]:
            assert c.post("/runs", json=body).status_code == 202
        wait_until(lambda: _status(c, "g-done") == "done" and _status(c, "g-failed") == "failed")
        wait_until(lambda: c.get("/runs/g-waits").json()["waiting"])
        page = c.get("/runs", params={"prefix": "g-"}).json()
        counts = page["counts"]
        assert counts["done"] == 1 and counts["failed"] == 1 and counts["queued"] == 1
        assert counts["waiting"] == 1 and counts["stranded"] == 0
        rows = {r["key"]: r for r in page["runs"]}
        assert set(rows) == {"g-done", "g-failed", "g-waits"}  # the queued one: its group
        assert rows["g-waits"]["waiting"]["state"] == "waiting"
        assert rows["g-waits"]["waiting"]["topic"] == "go"
        assert rows["g-failed"]["queue"] == "default" and "bad row 3" in rows["g-failed"]["error"]
        queued = c.get("/runs", params={"prefix": "g-", "group": "queued"}).json()
        assert [(r["key"], r["status"], r["queue"]) for r in queued["runs"]] == [
            ("g-later", "queued", "nobody")
        ]
        waiting = c.get("/runs", params={"prefix": "g-", "group": "waiting"}).json()
        assert [r["key"] for r in waiting["runs"]] == ["g-waits"]
        # the status filter keeps the counts of every status
        failed = c.get("/runs", params={"prefix": "g-", "status": "failed"}).json()
        assert [r["key"] for r in failed["runs"]] == ["g-failed"] and failed["counts"] == counts
        bad = c.get("/runs", params={"group": "lost"})
        assert bad.status_code == 400 and "stranded, waiting, queued" in bad.json()["error"]
        assert c.post("/runs/g-waits/messages/go", json="now").status_code == 202
        wait_until(lambda: _status(c, "g-waits") == "done")


def test_a_plan_diagram_says_each_step_state(served: Served) -> None:
    # guarantee 575
    with served.client() as c:
        for key, payload in [("d-ok", "orders"), ("d-bad", "bad batch")]:
            body = {"target": "serveapp:pipeline", "task": {"task": "t", "payload": payload}}
            assert c.post("/runs", json={**body, "key": key}).status_code == 202
        wait_until(lambda: _status(c, "d-ok") == "done" and _status(c, "d-bad") == "failed")
        ok = c.get("/runs/d-ok").json()["diagram"]
        assert ok["kind"] == "plan"
        assert [(n["id"], n["state"], n["visits"], n["col"]) for n in ok["nodes"]] == [
            ("fetch", "done", 1, 0),
            ("check", "done", 1, 1),
        ]
        assert ok["edges"] == [{"from": "fetch", "to": "check", "count": 1}]
        bad = c.get("/runs/d-bad").json()["diagram"]
        assert [(n["id"], n["state"]) for n in bad["nodes"]] == [
            ("fetch", "done"),
            ("check", "failed"),
        ]
        # rewound to fetch: fetch is next, check not reached
        assert c.post("/runs/d-bad/retry", params={"from": "fetch"}, headers=W).status_code == 200
        assert c.post("/runs/d-bad/cancel", headers=W).status_code == 200
        wait_until(lambda: c.get("/runs/d-bad").json()["entry"]["status"] != "queued")
        # a graph run, read under its queue entry's key: the nodes it reached, in order
        body = {"target": "serveapp:trip", "task": {"task": "go", "payload": {}}, "key": "d-g"}
        assert c.post("/runs", json=body).status_code == 202
        wait_until(lambda: _status(c, "d-g") == "done")
        graph = c.get("/runs/d-g").json()
        assert graph["kind"] == "graph" and graph["record_key"].startswith("graph:")
        assert [(n["id"], n["state"], n["col"]) for n in graph["diagram"]["nodes"]] == [
            ("book", "done", 0),
            ("pack", "done", 1),
            ("leave", "done", 2),
        ]
        assert [(e["from"], e["to"]) for e in graph["diagram"]["edges"]] == [
            ("book", "pack"),
            ("pack", "leave"),
        ]
        hello = c.post("/runs", json={"target": "serveapp:hello", "args": ["z"]}).json()["key"]
        wait_until(lambda: _status(c, hello) == "done")
        assert c.get(f"/runs/{hello}").json()["diagram"] is None  # a workflow has none


def test_the_watch_feed_follows_a_run_from_any_process(served: Served, tmp_path: Path) -> None:
    # guarantee 576
    gate = tmp_path / "gate"
    with served.client() as c:
        key = c.post(
            "/runs", json={"target": "serveapp:talker", "args": ["w-1", 2, str(gate)], "key": "w-1"}
        ).json()["key"]
        wait_until(lambda: _status(c, key) == "running")
        seen: list[Event] = []
        done = threading.Event()

        def read() -> None:
            with served.client() as reader:
                for event in sse(reader, f"/runs/{key}/watch"):
                    seen.append(event)
                    state = json.loads(event.data)
                    if state.get("status") == "done" and state.get("entry_status") == "done":
                        break
            done.set()

        follower = threading.Thread(target=read, daemon=True)
        follower.start()
        wait_until(lambda: seen)
        first = json.loads(seen[0].data)
        assert seen[0].event == "run" and first["status"] == "running" and first["streams"] == {}
        # a message sent by another process (the CLI) shows in the next event
        sent = subprocess.run(
            [
                sys.executable,
                "-m",
                "stepstone.cli",
                "send",
                *_store_args(served.store),
                key,
                "nudge",
                "1",
            ],
            capture_output=True,
            text=True,
            cwd=HERE,
            timeout=120,
            env={**os.environ, "SERVEAPP_STORE": served.store},
        )
        assert sent.returncode == 0, sent.stderr
        wait_until(lambda: json.loads(seen[-1].data)["messages"] == 1)
        Path(f"{gate}.0").touch()
        wait_until(lambda: json.loads(seen[-1].data)["streams"] == {"tokens": 1})
        Path(f"{gate}.1").touch()
        assert done.wait(120)
        states = [json.loads(e.data) for e in seen]
        assert all(a != b for a, b in itertools.pairwise(states))  # changes only
        assert states[-1]["streams"] == {"tokens": 2}
        assert c.get("/runs/nobody/watch").status_code == 404


def _store_args(store: str) -> list[str]:
    return ["--url", store] if "://" in store else ["--db", store]


def test_an_agent_run_shows_each_turn_with_tokens_and_cost(served: Served) -> None:
    # guarantee 577
    with served.client() as c:
        assert (
            c.post(
                "/runs", json={"target": "serveapp:approver", "task": "refund", "key": "t-1"}
            ).status_code
            == 202
        )
        wait_until(lambda: _status(c, "t-1") == "paused")
        run = c.get("/runs/t-1").json()
        (turn,) = [e for e in run["agent"]["effects"] if e["kind"] == "model"]
        assert turn["model"] == "function-model" and turn["turn"] == 0
        assert turn["input_tokens"] > 0 and turn["output_tokens"] > 0
        assert turn["cost_usd"] is None  # no price is known for it
        assert turn["tool_calls"][0]["name"] == "refund"
        assert turn["tool_calls"][0]["arguments"] == {"order": "o-1"}
