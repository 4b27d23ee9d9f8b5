"""The kernel's operation journal as other engines and integrations use it: ``journaled``
records an operation of the current durable run, with replay, notes kept for re-runs, and
records committed with the outcome (guarantee 490)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store, workflow
from stepstone.durable._messages import events
from stepstone.durable._operations import Call, Outcome, current_journal, journaled
from stepstone.store._extras import ExtraWrites

SEEN: list[tuple[str, int, Any]] = []
STOP: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    SEEN.clear()
    STOP.clear()
    yield


async def _probe(call: Call) -> Outcome:
    SEEN.append((call.position, call.attempt, call.note))
    if "inside" in STOP:
        raise KeyboardInterrupt  # the process dies during the operation
    extras = ExtraWrites(events=(("stage", '"probed"'),))
    return Outcome(data={"woke": 42}, extras=extras)


@workflow
async def uses_the_primitive(n: int) -> Any:
    assert current_journal() is not None
    first = await journaled("probe", "wake", {"n": n}, _probe, note={"wake_at": 1000 + n})
    if "after" in STOP:
        raise KeyboardInterrupt
    return first


def test_an_operation_is_recorded_replayed_and_commits_its_extras(tmp_path: Path) -> None:
    # guarantee 490
    with Store(db=tmp_path / "ops.sqlite") as store:
        STOP.append("after")
        with pytest.raises(KeyboardInterrupt):
            uses_the_primitive.using(store=store, key="p").run_sync(1)
        assert events(store, "p") == {"stage": "probed"}  # committed with the outcome
        STOP.clear()
        assert uses_the_primitive.using(store=store, key="p").run_sync(1) == {"woke": 42}
        assert SEEN == [("0", 1, {"wake_at": 1001})]  # replayed: run once
        (op,) = store.read("p")["steps"]
        assert (op["op"], op["name"], op["value"]) == ("probe", "wake", {"woke": 42})


def test_a_rerun_after_a_crash_sees_the_first_attempts_note(tmp_path: Path) -> None:
    # guarantee 490
    with Store(db=tmp_path / "ops.sqlite") as store:
        STOP.append("inside")
        with pytest.raises(KeyboardInterrupt):
            uses_the_primitive.using(store=store, key="q").run_sync(2)
        STOP.clear()

        @workflow(name="uses_the_primitive")
        async def later(n: int) -> Any:  # the same workflow, asking for another note now
            return await journaled("probe", "wake", {"n": n}, _probe, note={"wake_at": 9})

        assert later.using(store=store, key="q").run_sync(2) == {"woke": 42}
        assert SEEN == [("0", 1, {"wake_at": 1002}), ("0", 2, {"wake_at": 1002})]


async def test_outside_a_durable_run_an_operation_is_a_plain_call() -> None:
    # guarantee 490
    assert current_journal() is None
    assert await journaled("probe", "wake", {}, _probe) == {"woke": 42}
    with pytest.raises(RuntimeError, match="only be called inside a workflow"):
        await journaled("probe", "wake", {}, _probe, outside="refuse")
