"""sleep, sleep_until, recv, set_event and write_stream inside workflows, Plan steps and graph
nodes: journaled at their positions, replayed on resume, on every store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import stepstone
from stepstone import Agent, Plan, RunHandle, Store, UserError, step, workflow
from stepstone.durable import cancel_run, read_run
from stepstone.exceptions import RunCancelledError
from tests.messages.targets import approval, inbox, napper, waiting_plan, writer


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        s = Store()
    elif request.param == "sqlite":
        s = Store(db=tmp_path / "in.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _ops(store: Store, key: str) -> list[dict[str, object]]:
    from stepstone.durable._operations import operation_rows

    found = read_run(store, key)
    assert found is not None
    head, rows = found
    return operation_rows(head, rows)


def test_sleep_waits_its_time_and_records_when_it_woke(store: Store) -> None:
    # guarantee 515
    took = napper.using(store=store, key="nap").run_sync(0.4)
    assert 0.35 <= took < 5
    (_, op) = _ops(store, "nap")
    assert op["op"] == "sleep" and op["status"] == "done"
    woke = op["value"]
    assert isinstance(woke, dict) and woke["woke_at"] >= woke["wake_at"]
    assert store.backend.timers("nap") == []  # the wait is over
    start = time.monotonic()  # a finished run returns its result without sleeping
    assert napper.using(store=store, key="nap").run_sync(0.4) == took
    assert time.monotonic() - start < 0.3


def test_sleep_until_an_aware_time_and_refuses_a_naive_one(store: Store) -> None:
    # guarantee 515

    @workflow(name="until")
    async def until(at: datetime) -> str:
        await stepstone.sleep_until(at)
        return "woke"

    at = datetime.now(UTC) + timedelta(seconds=0.3)
    start = time.monotonic()
    assert until.using(store=store, key="until").run_sync(at) == "woke"
    assert time.monotonic() - start >= 0.25

    async def naive() -> None:
        await stepstone.sleep_until(datetime(2030, 1, 1))

    with pytest.raises(stepstone.ConfigurationError, match="aware datetime"):
        asyncio.run(naive())


def test_recv_gets_messages_in_order_once_and_none_on_timeout(store: Store) -> None:
    # guarantee 516
    stepstone.send(store, "inbox", "in", {"n": 1})  # before the run exists: kept for it

    async def both() -> list[object]:
        run = asyncio.create_task(inbox.using(store=store, key="inbox").run(3))
        await asyncio.sleep(0.2)
        await stepstone.asend(store, "inbox", "in", {"n": 2})
        await stepstone.asend(store, "inbox", "other", "ignored")
        await stepstone.asend(store, "inbox", "in", {"n": 3})
        return await run

    assert asyncio.run(both()) == [{"n": 1}, {"n": 2}, {"n": 3}]
    msgs = store.backend.messages("inbox")
    assert [(m.topic, m.consumed_at is not None) for m in msgs] == [
        ("in", True),
        ("in", True),
        ("other", False),
        ("in", True),
    ]
    # a run that finished answers from its journal: nothing consumed again
    assert inbox.using(store=store, key="inbox").run_sync(3) == [{"n": 1}, {"n": 2}, {"n": 3}]
    with pytest.raises(stepstone.RunFinishedError):
        stepstone.send(store, "inbox", "in", {"n": 4})


def test_an_approval_with_a_reminder_and_a_timeout(store: Store, tmp_path: Path) -> None:
    # guarantee 516, 517: the docs' example, three ways
    log = str(tmp_path / "log")
    assert approval.using(store=store, key="late").run_sync(log, 0.2, 0.2) == "expired"
    assert RunHandle(store, key="late").get_event("stage", timeout=0) == "expired"

    async def answered(key: str, after: float) -> str:
        run = asyncio.create_task(approval.using(store=store, key=key).run(log, 5.0, 5.0))
        handle = RunHandle(store, key=key)
        assert await handle.aget_event("stage", timeout=10) == "asked"
        await asyncio.sleep(after)
        await stepstone.asend(store, key, "approval", {"ok": True, "by": "ana"})
        return await run

    assert asyncio.run(answered("prompt", 0.0)) == "approved by ana"
    steps = [v for _, v in RunHandle(store, key="prompt").read_stream("steps")]
    assert steps == ["asked"]
    events = RunHandle(store, key="prompt").events()
    assert events == {"stage": "answered"}


def test_events_from_a_body_are_journaled_and_not_set_again_on_resume(store: Store) -> None:
    # guarantee 517
    tries: list[int] = []

    @step(name="boom")
    def boom() -> None:
        if not tries:
            tries.append(1)
            raise ValueError("first try")

    @workflow(name="staged")
    async def staged() -> str:
        stepstone.set_event("stage", "one")
        stepstone.set_event("stage", "two")
        await boom()
        stepstone.set_event("stage", "three")
        return "ok"

    with pytest.raises(ValueError, match="first try"):
        staged.using(store=store, key="staged").run_sync()
    assert RunHandle(store, key="staged").get_event("stage", timeout=0) == "two"
    assert staged.using(store=store, key="staged").run_sync() == "ok"
    assert RunHandle(store, key="staged").get_event("stage", timeout=0) == "three"
    ops = [(o["op"], o["name"]) for o in _ops(store, "staged")]
    assert ops == [("event", "stage"), ("event", "stage"), ("step", "boom"), ("event", "stage")]


def test_body_writes_are_exactly_once_and_step_writes_carry_their_attempt(store: Store) -> None:
    # guarantee 518
    assert writer.using(store=store, key="w").run_sync(5, 0.0) == 5
    values = list(RunHandle(store, key="w").read_stream("numbers"))
    assert [(o, v, i.attempt) for (o, v), i in zip(values, values, strict=True)] == [
        (i, i, None) for i in range(5)
    ]
    failed: list[int] = []

    @step(name="flaky", retries=1, retry_delay=0.0)
    async def flaky() -> str:
        await stepstone.write_stream("log", f"try {len(failed) + 1}")
        if not failed:
            failed.append(1)
            raise ConnectionError("down")
        return "up"

    @workflow(name="retrying")
    async def retrying() -> str:
        return await flaky()

    assert retrying.using(store=store, key="r").run_sync() == "up"
    got = list(RunHandle(store, key="r").read_stream("log"))
    assert [(v, i.attempt) for (_, v), i in zip(got, got, strict=True)] == [
        ("try 1", 1),
        ("try 2", 2),
    ]


def test_a_plan_step_sleeps_receives_and_writes_in_its_own_journal(store: Store) -> None:
    # guarantee 519
    plan = Plan(*waiting_plan.steps, store=store, checkpoint_key="plan-w")

    async def go() -> object:
        run = asyncio.create_task(Agent(engine=plan).run("start"))
        handle = RunHandle(store, key="plan-w")
        assert await handle.aget_event("step", timeout=10) == "started"
        await stepstone.asend(store, "plan-w", "go", "now")
        return await run

    env = asyncio.run(go())
    assert env.ok and env.payload == "go=now"  # type: ignore[attr-defined]
    progress = [v for _, v in RunHandle(store, key="plan-w").read_stream("progress")]
    assert progress == ["before", "after"]
    assert store.read("plan-w")["status"] == "done"
    assert store.backend.timers("plan-w") == []
    listed = [h.key for h in stepstone.durable.list_runs(store, None)]
    assert any(k.endswith(":ops") for k in listed)  # the step's own journal, a record
    assert "plan-w" in listed


def test_waits_are_refused_where_they_cannot_be_durable(store: Store) -> None:
    # guarantee 520
    @step(name="inner")
    async def inner() -> None:
        await stepstone.recv("x", timeout=0)

    @workflow(name="refuses")
    async def refuses() -> None:
        await inner()

    with pytest.raises(UserError, match="inside a workflow's @step is refused"):
        refuses.using(store=store, key="ref").run_sync()

    async def outside() -> None:
        await stepstone.recv("x")

    with pytest.raises(UserError, match="works inside a durable run"):
        asyncio.run(outside())
    with pytest.raises(UserError, match="works inside a durable run"):
        stepstone.set_event("stage", 1)

    async def plain_sleep() -> float:
        start = time.monotonic()
        await stepstone.sleep(0.05)  # outside a durable run: asyncio.sleep
        return time.monotonic() - start

    assert asyncio.run(plain_sleep()) >= 0.04


def test_a_cancel_reaches_a_sleeping_inline_run_at_once(store: Store) -> None:
    # guarantee 513
    async def go() -> float:
        run = asyncio.create_task(napper.using(store=store, key="long-nap").run(3600.0))
        deadline = time.monotonic() + 10
        while not store.backend.timers("long-nap") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        start = time.monotonic()
        await asyncio.to_thread(cancel_run, store, "long-nap", reason="not needed")
        with pytest.raises(RunCancelledError):
            await run
        return time.monotonic() - start

    # at once: the cancel wakes the sleep (it would look again only a second later)
    assert asyncio.run(go()) < 0.9
    head = stepstone.durable.run_head(store, "long-nap")
    assert head is not None and head.status == "failed"


def test_a_graph_node_receives_on_its_correlation_id(store: Store) -> None:
    # guarantee 519
    from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer

    class S(State):
        got: str = ""

    async def ask(state: S) -> dict[str, str]:
        answer = await stepstone.recv("answer", timeout=30)
        stepstone.set_event("node", "answered")
        return {"got": str(answer)}

    graph = (
        GraphBuilder(S)
        .add_node("ask", ask)
        .add_edge("ask", END)
        .set_entry("ask")
        .with_checkpointer(StoreCheckpointer(store))
        .compile()
    )
    stepstone.send(store, "chat-7", "answer", "forty-two")
    final = graph.invoke(S(), correlation_id="chat-7")
    assert final.got == "forty-two"
    assert RunHandle(store, key="chat-7").get_event("node", timeout=0) == "answered"
