"""Every kind of target through the queue with the same submit/handle API: compiled
graphs, Agents over a ReplanEngine and LLM agents (run as the Runner runs them), each run
durably under its entry's key and resumed, not restarted, when a worker takes it again."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stepstone import AgentResult, Envelope, Store, Worker, submit
from stepstone._worker_targets import queued_graph
from stepstone.graph import CheckpointFilter, StoreCheckpointer
from stepstone.testing import LoopbackServer, OpenAIDialect, block_model_requests, call
from tests.workers import targets
from tests.workers.targets import Tally, executions


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "q.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()
        with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_queue_limits")
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _worker(store: Store) -> Worker:
    return Worker(store, poll_interval=0.05)


def test_a_graph_run_is_queued_from_its_initial_state(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    h = targets.graph.submit(Tally(log=log, name="g1", total=10), store=store, queue="graphs")
    other = submit(store, "tests.workers.targets:graph", Tally(log=log, name="g2"), queue="graphs")
    assert h.status() == "queued"
    assert Worker(store, queues=["graphs"], poll_interval=0.05).run(until_idle=True) == 2
    env = h.result(timeout=10)
    assert env.ok and env.payload == {"log": log, "name": "g1", "total": 13}  # guarantee 248
    assert other.result(timeout=10).payload["total"] == 3
    # durable: the run's invocation carries the entry's key as its correlation_id
    records = StoreCheckpointer(store).list(CheckpointFilter(correlation_id=h.key))
    assert [r.status for r in records] == ["done"]
    runs = executions(log)
    assert sorted(runs) == [(n, i) for n in ("g1", "g2") for i in range(3)]
    assert all(len(p) == 1 for p in runs.values())


def test_a_graph_run_taken_again_does_not_run_its_nodes_again(store: Store, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    h = targets.graph.submit(Tally(log=log, name="again"), store=store)
    entry = h.entry()
    assert _worker(store).run(until_idle=True) == 1
    assert h.result(timeout=10).payload["total"] == 3
    # a worker that died after the graph finished but before it recorded the result:
    # the next worker to take the entry runs it the same way, and gets the finished
    # invocation's final state without running a node
    again = asyncio.run(
        queued_graph(targets.graph, store, entry)(Envelope(task="Tally", payload={}))
    )
    assert again.payload == {"log": log, "name": "again", "total": 3}  # guarantee 249
    assert all(len(p) == 1 for p in executions(log).values())


def test_a_replan_agent_is_queued(store: Store) -> None:
    h = targets.replan_agent.submit("hello", store=store, key="replan-1")
    assert _worker(store).run(until_idle=True) == 1
    env = h.result(timeout=10)
    assert env.ok and env.payload == "QUEUED!", env.error  # guarantee 248
    assert store.read_entry("replan-1").value["status"] == "done"  # durable under its key


def test_an_llm_agent_is_queued_and_run_as_the_runner_runs_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call("shout", text="ticket 7"), "escalated TICKET 7"]
    with block_model_requests(), LoopbackServer(OpenAIDialect(), model="gpt-4o-mini") as srv:
        srv.push(*script)
        monkeypatch.setattr(targets, "LOOPBACK_URL", srv.base_url)
        h = submit(store, "tests.workers.targets:llm_agent", "escalate ticket 7", key="ag-1")
        assert _worker(store).run(until_idle=True) == 1
        env = h.result(timeout=10)
        assert env.ok, env.error
        result = AgentResult.from_dict(env.payload)  # guarantee 248
        assert result.state == "completed" and result.final_text == "escalated TICKET 7"
        assert [t["content"] for t in result.tool_executions] == ["TICKET 7"]
        assert len(srv.requests) == 2
        # run_id is the entry's key: the Runner's record, finished, answers again
        # without a model call
        again = submit(store, "tests.workers.targets:llm_agent", "escalate ticket 7", key="ag-1")
        assert _worker(store).run(until_idle=True) == 1
        assert AgentResult.from_dict(again.result(timeout=10).payload).final_text == (
            "escalated TICKET 7"
        )
        assert len(srv.requests) == 2  # guarantee 249
    json.dumps(env.payload)


def _listings(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The prefixes of every listing of runs the store's backend makes from now on."""
    listed: list[str | None] = []
    real_list = type(store.backend).run_list

    def spy(backend: object, prefix: str | None) -> object:
        listed.append(prefix)
        return real_list(backend, prefix)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store.backend), "run_list", spy)
    return listed


def test_a_queued_graph_run_finds_its_attempts_by_key_not_by_a_scan(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """guarantee 295: the ids of a queued graph run's invocations are noted under its key
    before each is claimed; a worker taking it again finds the latest by that key, without
    listing the store's other graph records."""
    log = str(tmp_path / "log")
    for i in range(5):  # other graph records in the same store and prefix
        targets.graph.submit(Tally(log=log, name=f"other{i}"), store=store)
    assert _worker(store).run(until_idle=True) == 5
    h = targets.graph.submit(Tally(log=log, name="keyed"), store=store)
    entry = h.entry()
    assert _worker(store).run(until_idle=True) == 1
    noted = store.read(h.key)["graph_invocations"]
    assert len(noted) == 1
    record = StoreCheckpointer(store).load(noted[0])
    assert record.correlation_id == h.key and record.status == "done"
    listed = _listings(store, monkeypatch)
    again = asyncio.run(
        queued_graph(targets.graph, store, entry)(Envelope(task="Tally", payload={}))
    )
    assert again.payload == {"log": log, "name": "keyed", "total": 3}
    assert listed == []  # found by key: no listing of graph records
    assert store.read(h.key)["graph_invocations"] == noted  # nothing new was started


def test_a_noted_invocation_that_never_saved_is_skipped(store: Store, tmp_path: Path) -> None:
    """guarantee 295: an invocation noted under the key but killed before its record was
    saved is passed over; the latest one that saved is resumed (here: returned, done)."""
    log = str(tmp_path / "log")
    h = targets.graph.submit(Tally(log=log, name="skip"), store=store)
    entry = h.entry()
    assert _worker(store).run(until_idle=True) == 1
    noted = store.read(h.key)["graph_invocations"]
    store.write(h.key, {"graph_invocations": [*noted, "never-claimed"]})
    again = asyncio.run(
        queued_graph(targets.graph, store, entry)(Envelope(task="Tally", payload={}))
    )
    assert again.payload["total"] == 3
    assert all(len(p) == 1 for p in executions(log).values())


def test_a_graph_run_taken_before_invocations_were_noted_resumes(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """guarantee 296: a queued graph run that a worker of an earlier stepstone took (its
    invocation carries the run's key as correlation_id, but no id was noted under the key)
    is found by that correlation_id when a worker takes it again: it is resumed (here:
    returned, done), not started over; a first take never scans."""
    log = str(tmp_path / "log")
    h = targets.graph.submit(Tally(log=log, name="legacy"), store=store)
    assert _worker(store).run(until_idle=True) == 1
    store.delete(h.key)  # the note an earlier stepstone did not write
    entry = h.entry()
    assert entry is not None and entry.attempts == 1
    listed = _listings(store, monkeypatch)
    again = asyncio.run(
        queued_graph(targets.graph, store, dataclasses.replace(entry, attempts=2))(
            Envelope(task="Tally", payload={})
        )
    )
    assert again.payload == {"log": log, "name": "legacy", "total": 3}
    assert all(len(p) == 1 for p in executions(log).values())  # no node ran again
    assert listed  # found by a scan
    listed.clear()
    fresh = targets.graph.submit(Tally(log=log, name="first"), store=store)
    assert _worker(store).run(until_idle=True) == 1
    assert fresh.result(timeout=10).payload["total"] == 3
    assert listed == []  # a first take finds nothing to resume, without a scan
