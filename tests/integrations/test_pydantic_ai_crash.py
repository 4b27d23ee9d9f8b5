"""A pydantic-ai agent with ``StepstoneDurability`` in a workflow, in real subprocesses
SIGKILLed inside its tool loop, then resumed (guarantees 530, 533, 534).

The model is pydantic-ai's OpenAI model talking to a loopback OpenAI-wire server in this
process, which counts the requests it gets. After each kill and resume: each tool's side
effect happened once (tools deduplicate by ``step_context().idempotency_key``, the same on
the rerun of a call in doubt), no model request whose answer was committed was sent again,
and the output and the usage ``result.usage`` counts equal an uninterrupted run's. Through the
queue too: a worker process killed inside a tool, a second worker finishing the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import Store, Worker
from stepstone.durable import read_run
from stepstone.testing import LoopbackServer, OpenAIDialect
from tests.integrations.pai_shop import (
    EFFECTS,
    EXPECTED,
    REQUESTS,
    attempts,
    effects,
    handle_ticket,
    reply,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer(OpenAIDialect(), respond=reply) as srv:
        yield srv


def _run(
    db: Path, logs: Path, server: LoopbackServer, kill_at: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHOP_KILL_AT": kill_at}
    args = [
        sys.executable,
        "-m",
        "tests.integrations.pai_crash_worker",
        str(db),
        str(logs),
        server.base_url,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def _committed_model_requests(db: Path, key: str) -> int:
    """Model requests whose answer the run's journal holds."""
    with Store(db=db) as store:
        found = read_run(store, key)
    if found is None:
        return 0
    n = 0
    for row in found[1]:
        if row.kind == "ops":
            n += sum(
                1
                for kind, _pos, data in json.loads(row.data)
                if kind == "outcome" and data["op"] == "model"
            )
    return n


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The outcome of an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("clean")
    with LoopbackServer(OpenAIDialect(), respond=reply) as srv, Store(db=tmp / "c.sqlite") as store:
        run = handle_ticket.using(store=store, key="clean")
        return run.run_sync(srv.base_url, str(tmp), "order 42 please")


@pytest.mark.crash
@pytest.mark.parametrize(
    "kill_at",
    [
        "answer:charge",  # the model answered with a tool call; the tool did not start
        "inside:charge",  # inside a tool, after its effect
        "between:reserve-a",  # one tool returned, the next did not start
        "inside:notify-seller",  # inside one of two tools running in parallel
    ],
)
def test_sigkill_inside_the_tool_loop_then_resume(
    tmp_path: Path, server: LoopbackServer, clean: dict[str, object], kill_at: str
) -> None:
    # guarantee 530, 533, 534
    assert clean["output"] == EXPECTED and clean["requests"] == REQUESTS
    db, logs = tmp_path / "shop.sqlite", tmp_path / "logs"
    logs.mkdir()
    died = _run(db, logs, server, kill_at)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (logs / "killed").read_text() == kill_at
    committed = _committed_model_requests(db, "ticket-1")
    sent = len(server.requests)
    done = _run(db, logs, server)
    assert done.returncode == 0, done.stderr
    # the output and the usage counted equal an uninterrupted run's
    assert json.loads(done.stdout.splitlines()[-1]) == clean
    # no model request whose answer was committed was sent again
    assert len(server.requests) - sent == REQUESTS - committed
    # each tool's effect happened once
    assert sorted(effects(logs)) == sorted(EFFECTS)
    # only calls whose outcome was not committed ran again
    again = Counter(attempts(logs)) - Counter(EFFECTS)
    assert all(n == 1 for n in again.values())
    if kill_at.startswith("inside:"):
        effect = "charge-1299" if kill_at == "inside:charge" else kill_at.split(":")[1]
        assert again[effect] == 1  # in doubt: run again, with the same idempotency key
    with Store(db=db) as store:
        assert store.read("ticket-1")["status"] == "done"


def _worker(db: Path, kill_at: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHOP_KILL_AT": kill_at}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "stepstone.cli", "worker", "--db", str(db)),
            *("--queue", "agents", "--poll-interval", "0.05", "--lease-seconds", "60", *args),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.crash
def test_a_submitted_agent_workflow_survives_its_worker_being_killed(
    tmp_path: Path, server: LoopbackServer
) -> None:
    # guarantee 530, 539
    db, logs = tmp_path / "q.sqlite", tmp_path / "logs"
    logs.mkdir()
    with Store(db=db) as store:
        handle = handle_ticket.using(store=store, key="ticket-q", queue="agents").submit(
            server.base_url, str(logs), "order 42 please"
        )
        first = _worker(db, "inside:charge")
        out, _ = first.communicate(timeout=120)
        assert first.returncode == -signal.SIGKILL, out
        committed = _committed_model_requests(db, "ticket-q")
        sent = len(server.requests)
        second = _worker(db, "", "--until-idle")
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 0, out
        env = handle.result(timeout=5)
        assert env.ok, env.error
        assert env.payload["output"] == EXPECTED and env.payload["requests"] == REQUESTS
        assert store.read("ticket-q")["status"] == "done"
    assert len(server.requests) - sent == REQUESTS - committed
    assert sorted(effects(logs)) == sorted(EFFECTS)


def test_a_submitted_agent_workflow_runs_on_an_in_process_worker(
    tmp_path: Path, server: LoopbackServer
) -> None:
    # guarantee 539
    logs = tmp_path / "logs"
    logs.mkdir()
    with Store(db=tmp_path / "q.sqlite") as store:
        handle = handle_ticket.using(store=store, key="ticket-w", queue="agents").submit(
            server.base_url, str(logs), "order 42 please"
        )
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 1
        env = handle.result(timeout=5)
        assert env.ok, env.error
        assert env.payload["output"] == EXPECTED
        assert env.payload["requests"] == REQUESTS
    assert sorted(effects(logs)) == sorted(EFFECTS)
