"""Workers park waiting runs: the queue entry goes back until the wake time (or a message),
the slot serves other runs meanwhile, and a cancel reaches a parked run at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stepstone import Store, Worker, send, submit
from stepstone.durable import claim_run, read_run
from stepstone.durable._queue import queue_backend
from stepstone.store._extras import ExtraWrites, Timer
from stepstone.store._queue_base import NEVER, Owner

T = "tests.messages.targets:"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "park.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        s = Store(url=url)
        s.setup()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_queue, stepstone_schedules")
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _wait(what: str, check: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_parked_run_frees_its_slot_and_resumes_at_its_wake_time(
    store: Store, tmp_path: Path
) -> None:
    # guarantee 512
    task = json.dumps({"marker": str(tmp_path / "m"), "key": "sleeper", "wake_in": 1.5})
    sleeper = submit(store, T + "parking_plan", task, key="sleeper")
    worker = Worker(store, concurrency=1, poll_interval=0.05, park_after=0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait("the sleeper to park", lambda: (tmp_path / "m").exists() and worker.parked == 1)
        parked_at = time.monotonic()
        others = [submit(store, T + "noop_plan", f"o{i}") for i in range(3)]
        for handle in others:  # the one slot serves them while the sleeper waits
            assert handle.result(timeout=30).ok
        assert sleeper.status() == "queued"
        env = sleeper.result(timeout=30)
        woke = time.monotonic() - parked_at
    finally:
        worker.stop()
        thread.join()
    assert env.ok and env.payload == "woke"
    assert woke >= 1.0  # not before its wake time (1.5 s after it parked, minus the setup)
    entry = sleeper.entry()
    assert entry.attempts == 1  # a park is not an attempt
    assert store.read("sleeper")["status"] == "done"


def test_a_cancel_reaches_a_parked_run_at_once(store: Store, tmp_path: Path) -> None:
    # guarantee 513
    task = json.dumps({"marker": str(tmp_path / "m"), "key": "long", "wake_in": 3600})
    handle = submit(store, T + "parking_plan", task, key="long")
    worker = Worker(store, concurrency=1, poll_interval=0.05, park_after=0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait("the run to park", lambda: worker.parked == 1)
        entry = handle.entry()
        assert entry.status == "queued" and entry.not_before > time.time() + 3000
        start = time.monotonic()
        assert handle.cancel()
        assert handle.status() == "cancelled"
        assert time.monotonic() - start < 2
        assert store.read("long")["status"] == "paused"  # its waiting step, resumable
    finally:
        worker.stop()
        thread.join()


def test_a_message_makes_a_run_parked_on_its_topic_runnable(store: Store) -> None:
    # guarantee 512: the send and the park see each other, whichever comes first
    qb = queue_backend(store)
    owner = Owner(worker="w", host="h", pid=1, pid_start=None)
    for order in ("send after park", "send before park"):
        key = f"waiter-{order.split()[1]}"
        handle = submit(store, T + "noop_plan", "x", key=key, queue=key)
        (entry,) = qb.claim(key, owner, 30.0)
        claimed = claim_run(store, key, kind="test", resume=False, first_step="a")
        assert claimed.run is not None
        now = store.backend.clock()
        timer = Timer(run_key=key, name="0", wake_at=None, topic="go", since=now)
        claimed.run.commit_sync(
            status="paused",
            next_step="a",
            rows=[("t", None, {})],
            extras=ExtraWrites(timers=(timer,)),
        )
        claimed.run.release()
        if order == "send before park":
            send(store, key, "go", 1)
        assert qb.park(entry.id, "w", key, NEVER, ("go",))
        if order == "send after park":
            assert handle.entry().not_before == NEVER
            send(store, key, "other-topic", 1)  # not what it waits for
            assert handle.entry().not_before == NEVER
            send(store, key, "go", 1)
        got = handle.entry()
        assert got.status == "queued" and got.not_before <= qb.now(), order
        assert qb.claim(key, owner, 30.0)  # runnable now


def _records(store: Store, key: str, op: str) -> list[str]:
    """The kinds of the journal records of the run's ``op`` operations, in order."""
    found = read_run(store, key)
    assert found is not None
    records = [r for row in found[1] if row.kind == "ops" for r in json.loads(row.data)]
    ops = {pos: data["op"] for kind, pos, data in records if kind == "intent"}
    return [kind for kind, pos, _ in records if ops.get(pos) == op]


def _serve(store: Store, **options: object) -> tuple[Worker, threading.Thread]:
    worker = Worker(store, poll_interval=0.05, **options)  # type: ignore[arg-type]
    thread = threading.Thread(target=worker.run)
    thread.start()
    return worker, thread


def test_a_sleeping_workflow_gives_its_slot_back_until_its_wake_time(store: Store) -> None:
    # guarantee 512, 515
    from tests.messages.targets import napper

    sleeper = napper.using(store=store, key="nap", queue="default").submit(1.5)
    worker, thread = _serve(store, concurrency=1, park_after=0.3)
    try:
        _wait("the sleeper to park", lambda: worker.parked == 1)
        assert store.read("nap")["status"] == "paused"
        from stepstone.durable import run_detail

        detail = run_detail(store, "nap")
        assert detail is not None and [w["state"] for w in detail["waiting"]] == ["sleeping"]
        others = [submit(store, T + "noop_plan", f"o{i}") for i in range(2)]
        for handle in others:
            assert handle.result(timeout=30).ok
        assert sleeper.status() == "queued"  # parked: no slot held
        env = sleeper.result(timeout=30)
    finally:
        worker.stop()
        thread.join()
    assert env.ok and 1.4 <= env.payload < 10  # woke at its time, not before
    assert sleeper.entry().attempts == 1
    # taken again past its wake time, the sleep ended without a second intent
    assert _records(store, "nap", "sleep") == ["intent", "outcome"]
    assert store.backend.timers("nap") == []


def test_a_message_wakes_a_workflow_parked_on_its_topic(store: Store) -> None:
    # guarantee 512, 516
    from tests.messages.targets import inbox

    handle = inbox.using(store=store, key="parked-inbox", queue="default").submit(1)
    worker, thread = _serve(store, concurrency=1, park_after=0.2)
    try:
        _wait("the run to park", lambda: worker.parked == 1)
        assert handle.entry().not_before == NEVER
        start = time.monotonic()
        send(store, "parked-inbox", "in", {"hello": "world"})
        env = handle.result(timeout=30)
        took = time.monotonic() - start
    finally:
        worker.stop()
        thread.join()
    assert env.ok and env.payload == [{"hello": "world"}]
    assert took < 3  # the send made it runnable: no wait for a timeout
    # taken again with its message there: received without a second intent
    assert _records(store, "parked-inbox", "recv") == ["intent", "outcome"]
    (msg,) = store.backend.messages("parked-inbox")
    assert msg.consumed_at is not None


def test_a_cancel_stops_a_run_waiting_in_its_worker_at_once(store: Store) -> None:
    # guarantee 513
    from tests.messages.targets import inbox

    handle = inbox.using(store=store, key="waiting-inbox", queue="default").submit(1)
    worker, thread = _serve(store, concurrency=1, park_after=60)
    try:
        _wait("the run to wait", lambda: bool(store.backend.timers("waiting-inbox")))
        start = time.monotonic()
        assert handle.cancel()
        _wait("the cancel", lambda: handle.status() == "cancelled", timeout=20)
        took = time.monotonic() - start
    finally:
        worker.stop()
        thread.join()
    assert took < 3 and worker.parked == 0  # stopped where it waited, not at a renewal
