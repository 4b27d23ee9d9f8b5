"""Agents of both frameworks in a workflow, in real subprocesses SIGKILLed inside their
tool loop, then resumed (guarantees 530, 533, 534, 539-542).

A pydantic-ai agent with ``StepstoneDurability`` (:mod:`tests.integrations.pai_shop`) and
an OpenAI Agents SDK desk run by ``DurableRunner``, a triage agent handing off to a billing
agent (:mod:`tests.integrations.oa_shop`). Both talk through their SDK's OpenAI model to a
loopback OpenAI-wire server in this process, which counts the requests it gets. After each
kill and resume: each tool's side effect happened once (tools deduplicate by
``step_context().idempotency_key``, the same on the rerun of a call in doubt), no model
request whose answer was committed was sent again, and the output and the usage counted
equal an uninterrupted run's. Through the queue too: a worker process killed inside a
tool, a second worker finishing the run.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stepstone import Store, Worker
from stepstone.durable import read_run
from stepstone.testing import LoopbackServer, OpenAIDialect
from tests import _spawn
from tests.integrations.effects import attempts, effects

ROOT = Path(__file__).resolve().parents[2]
SHOPS = {"pydantic-ai": "pai", "openai-agents": "oa"}


@pytest.fixture(params=list(SHOPS))
def shop(request: pytest.FixtureRequest) -> ModuleType:
    """The framework's shop module (its agent, loopback replies and expected outcome)."""
    return importlib.import_module(f"tests.integrations.{SHOPS[request.param]}_shop")


@pytest.fixture
def server(shop: ModuleType) -> Iterator[LoopbackServer]:
    with LoopbackServer(OpenAIDialect(), respond=shop.reply) as srv:
        yield srv


def _run(
    shop: ModuleType,
    db: Path | str,
    logs: Path,
    server: LoopbackServer,
    kill_at: str = "",
    *extra: str,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """The shop's crash worker run to its end (forked from the warm server unless ``fresh``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHOP_KILL_AT": kill_at}
    worker = f"tests.integrations.{shop.__name__.rsplit('.', 1)[1].split('_')[0]}_crash_worker"
    args = [sys.executable, "-m", worker, str(db), str(logs), server.base_url, *extra]
    return _spawn.run(
        args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, fresh=fresh
    )


def _open(db: Path | str) -> Store:
    """The store at ``db``: a SQLite file, or a ``postgresql://`` URL."""
    return Store(url=db) if str(db).startswith("postgresql://") else Store(db=db)


def _committed_model_requests(db: Path | str, key: str) -> int:
    """Model requests whose answer the run's journal holds."""
    with _open(db) as store:
        found = read_run(store, key)
    if found is None:
        return 0
    n = 0
    for row in found[1]:
        if row.kind == "ops":
            records = json.loads(row.data)
            n += sum(1 for kind, _, data in records if kind == "outcome" and data["op"] == "model")
    return n


def _clean(shop: ModuleType, tmp: Path) -> dict[str, object]:
    """The outcome of an uninterrupted run, in this process."""
    with (
        LoopbackServer(OpenAIDialect(), respond=shop.reply) as srv,
        Store(db=tmp / "c.sqlite") as store,
    ):
        run = shop.handle_ticket.using(store=store, key="clean")
        out: dict[str, object] = run.run_sync(srv.base_url, str(tmp), "order 42 please")
    return out


KILLS = [
    "answer:charge",  # the model answered with a tool call; the tool did not start
    "inside:charge",  # inside a tool, after its effect
    "between:reserve-a",  # one tool returned, the next did not start (or runs beside it)
    "inside:notify-seller",  # inside one of two tools running in parallel
]


@pytest.mark.crash
@pytest.mark.parametrize("kill_at", KILLS)
def test_sigkill_inside_the_tool_loop_then_resume(
    tmp_path: Path, shop: ModuleType, server: LoopbackServer, kill_at: str
) -> None:
    # guarantee 530, 533, 534, 540, 541
    clean = _clean(shop, tmp_path)
    assert clean["output"] == shop.EXPECTED and clean["requests"] == shop.REQUESTS
    db, logs = tmp_path / "shop.sqlite", tmp_path / "logs"
    logs.mkdir()
    # one kill per framework in a fresh interpreter, the others in a forked one
    died = _run(shop, db, logs, server, kill_at, fresh=kill_at == "inside:charge")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (logs / "killed").read_text() == kill_at
    committed = _committed_model_requests(db, "ticket-1")
    sent = len(server.requests)
    done = _run(shop, db, logs, server)
    assert done.returncode == 0, done.stderr
    # the output and the usage counted equal an uninterrupted run's
    assert json.loads(done.stdout.splitlines()[-1]) == clean
    # no model request whose answer was committed was sent again
    assert len(server.requests) - sent == shop.REQUESTS - committed
    # each tool's effect happened once
    assert sorted(effects(logs)) == sorted(shop.EFFECTS)
    # only calls whose outcome was not committed ran again, once
    again = Counter(attempts(logs)) - Counter(shop.EFFECTS)
    assert all(n == 1 for n in again.values())
    if kill_at.startswith("inside:"):
        effect = "charge-1299" if kill_at == "inside:charge" else kill_at.split(":")[1]
        assert again[effect] == 1  # in doubt: run again, with the same idempotency key
    with Store(db=db) as store:
        assert store.read("ticket-1")["status"] == "done"


@pytest.mark.crash
@pytest.mark.postgres
def test_sigkill_inside_a_tool_then_resume_on_postgresql(
    tmp_path: Path, shop: ModuleType, server: LoopbackServer, pg_server: Any
) -> None:
    # guarantee 530, 540: the same on PostgreSQL
    clean = _clean(shop, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    name = "crash_" + shop.__name__.rsplit(".", 1)[1]
    key_url = pg_server.create_database(name)
    try:
        _sigkill_and_resume_on(key_url, shop, server, logs, clean)
    finally:
        pg_server.drop_database(name)


def _sigkill_and_resume_on(
    key_url: str, shop: ModuleType, server: LoopbackServer, logs: Path, clean: object
) -> None:
    died = _run(shop, key_url, logs, server, "inside:charge")
    assert died.returncode == -signal.SIGKILL, died.stderr
    committed = _committed_model_requests(key_url, "ticket-1")
    sent = len(server.requests)
    done = _run(shop, key_url, logs, server)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == clean
    assert len(server.requests) - sent == shop.REQUESTS - committed
    assert sorted(effects(logs)) == sorted(shop.EFFECTS)
    assert Counter(attempts(logs))["charge-1299"] == 2  # in doubt: run again, same key


@pytest.mark.crash
def test_a_keyed_durable_runner_run_resumes_after_a_kill(tmp_path: Path) -> None:
    # guarantee 540, 542
    shop = importlib.import_module("tests.integrations.oa_shop")
    with LoopbackServer(OpenAIDialect(), respond=shop.reply) as server:
        db, logs = tmp_path / "shop.sqlite", tmp_path / "logs"
        logs.mkdir()
        died = _run(shop, db, logs, server, "inside:charge", "keyed")
        assert died.returncode == -signal.SIGKILL, died.stderr
        committed = _committed_model_requests(db, "ticket-1")
        sent = len(server.requests)
        done = _run(shop, db, logs, server, "", "keyed")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == shop.EXPECTED
        assert len(server.requests) - sent == shop.REQUESTS - committed
        # a finished key returns its recorded output and sends nothing
        again = _run(shop, db, logs, server, "", "keyed")
        assert json.loads(again.stdout.splitlines()[-1]) == shop.EXPECTED
        assert len(server.requests) - sent == shop.REQUESTS - committed
    assert sorted(effects(logs)) == sorted(shop.EFFECTS)
    with Store(db=db) as store:
        view = store.read("ticket-1")
        assert view["status"] == "done" and view["workflow"] == "openai-agents"


def _worker(db: Path, kill_at: str, *args: str) -> _spawn.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHOP_KILL_AT": kill_at}
    return _spawn.Popen(
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
    tmp_path: Path, shop: ModuleType, server: LoopbackServer
) -> None:
    # guarantee 530, 539, 540
    db, logs = tmp_path / "q.sqlite", tmp_path / "logs"
    logs.mkdir()
    with Store(db=db) as store:
        handle = shop.handle_ticket.using(store=store, key="ticket-q", queue="agents").submit(
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
        assert env.payload["output"] == shop.EXPECTED
        assert env.payload["requests"] == shop.REQUESTS
        assert store.read("ticket-q")["status"] == "done"
    assert len(server.requests) - sent == shop.REQUESTS - committed
    assert sorted(effects(logs)) == sorted(shop.EFFECTS)


def test_a_submitted_agent_workflow_runs_on_an_in_process_worker(
    tmp_path: Path, shop: ModuleType, server: LoopbackServer
) -> None:
    # guarantee 539
    logs = tmp_path / "logs"
    logs.mkdir()
    with Store(db=tmp_path / "q.sqlite") as store:
        handle = shop.handle_ticket.using(store=store, key="ticket-w", queue="agents").submit(
            server.base_url, str(logs), "order 42 please"
        )
        assert Worker(store, queues=["agents"]).run(until_idle=True) == 1
        env = handle.result(timeout=5)
        assert env.ok, env.error
        assert env.payload["output"] == shop.EXPECTED
        assert env.payload["requests"] == shop.REQUESTS
    assert sorted(effects(logs)) == sorted(shop.EFFECTS)
