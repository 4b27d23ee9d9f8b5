"""A submitted workflow whose agent (either framework) waits for a person's approval: the
worker leaves it paused, an approval given later from another process puts it back in
its queue, and the next worker continues it (guarantee 547)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import Store, Worker
from stepstone.durable._queue import queue_backend
from stepstone.testing import LoopbackServer, OpenAIDialect
from tests.integrations import approval_desk
from tests.integrations.approval_desk import CALL_ID, EXPECTED, refunds

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(OpenAIDialect(), respond=approval_desk.reply) as srv:
        yield srv


def _approve(db: Path, key: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "approve", "--db", str(db), key, CALL_ID, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("framework", ["pai", "oa"])
def test_an_approval_from_another_process_continues_a_queued_run(
    tmp_path: Path, server: LoopbackServer, framework: str
) -> None:
    # guarantee 547
    db, logs = tmp_path / "q.sqlite", tmp_path / "logs"
    logs.mkdir()
    ticket = getattr(approval_desk, f"{framework}_ticket")
    with Store(db=db) as store:
        handle = ticket.using(store=store, key="ticket-42", queue="agents").submit(
            server.base_url, str(logs), "refund order 42"
        )
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 1
        assert store.read("ticket-42")["status"] == "paused"  # waits for a person
        assert refunds(logs) == []
        sent = len(server.requests)
        # nothing runs it meanwhile: another worker finds nothing to do
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 0
        approved = _approve(db, "ticket-42")
        assert approved.returncode == 0, approved.stderr
        assert "queued again" in approved.stdout
        [entry] = queue_backend(store).entries(None, None)
        assert entry.status == "queued"
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 1
        env = handle.result(timeout=5)
        assert env.ok, env.error
        assert env.payload == EXPECTED
        assert store.read("ticket-42")["status"] == "done"
    assert refunds(logs) == ["42"]  # the approved call ran once
    if framework == "oa":  # the first answer was replayed, only the last one asked
        assert len(server.requests) == sent + 1


def test_a_denial_continues_a_queued_run_and_the_tool_does_not_run(
    tmp_path: Path, server: LoopbackServer
) -> None:
    # guarantee 547
    db, logs = tmp_path / "q.sqlite", tmp_path / "logs"
    logs.mkdir()
    with Store(db=db) as store:
        handle = approval_desk.pai_ticket.using(store=store, key="t", queue="agents").submit(
            server.base_url, str(logs), "refund order 42"
        )
        Worker(store, queues=["agents"]).run(until_idle=True)
        denied = _approve(db, "t", "--deny", "order 42 was never paid")
        assert denied.returncode == 0, denied.stderr
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 1
        env = handle.result(timeout=5)
        assert env.ok and env.payload == "the tool said: order 42 was never paid"
    assert refunds(logs) == []


def test_an_inline_run_is_not_queued_by_an_approval(tmp_path: Path, server: LoopbackServer) -> None:
    # guarantee 547: a run that was not submitted continues when its key is run again
    db, logs = tmp_path / "q.sqlite", tmp_path / "logs"
    logs.mkdir()
    run = approval_desk.pai_ticket.using(store=Store(db=db), key="inline")
    with pytest.raises(Exception, match="waits for approval"):
        run.run_sync(server.base_url, str(logs), "refund order 42")
    approved = _approve(db, "inline")
    assert approved.returncode == 0, approved.stderr
    assert "next resume applies it" in approved.stdout
    assert run.run_sync(server.base_url, str(logs), "refund order 42") == EXPECTED
