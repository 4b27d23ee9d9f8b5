"""Workflows: runs by key, replay, positions, determinism, patches, retries, in-doubt
policies, values, sync steps, child runs (guarantees 470-483)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

import stepstone
from stepstone import (
    ConcurrentRunError,
    EffectInDoubtError,
    NonDeterministicWorkflowError,
    SerializationError,
    Store,
    UserError,
    step,
    workflow,
)
from stepstone.durable import read_run
from stepstone.graph import END, GraphBuilder, State

CALLS: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    CALLS.clear()
    FAIL.clear()
    yield
    CALLS.clear()
    FAIL.clear()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        with Store(db=tmp_path / "wf.sqlite") as s:
            yield s
        return
    with Store(url=request.getfixturevalue("pg_url")) as s:
        for key in s.keys():
            s.delete(key)
        yield s


FAIL: dict[str, Any] = {}


@step
async def charge(order_id: str, cents: int) -> str:
    ctx = stepstone.step_context()
    CALLS.append(("charge", order_id, cents, ctx.attempt, ctx.idempotency_key))
    if FAIL.get("charge"):
        raise FAIL["charge"]
    return f"receipt-{order_id}-{cents}"


@step
def score(order_id: str) -> float:
    CALLS.append(("score", order_id))
    return 0.25


@step
async def reserve(order_id: str) -> int:
    CALLS.append(("reserve", order_id))
    await asyncio.sleep(0)
    return 3


@workflow
async def refund_flow(order_id: str) -> str:
    return await charge(order_id, -100)


@workflow
async def checkout(order_id: str) -> dict[str, Any]:
    receipt = await charge(order_id, 1299)
    fraud, stock = await asyncio.gather(score(order_id), reserve(order_id))
    refund = await refund_flow(order_id)
    return {"receipt": receipt, "fraud": fraud, "stock": stock, "refund": refund}


EXPECTED = {
    "receipt": "receipt-o-42-1299",
    "fraud": 0.25,
    "stock": 3,
    "refund": "receipt-o-42--100",
}


def test_run_returns_the_value_and_a_finished_key_runs_nothing_again(store: Store) -> None:
    # guarantee 470
    assert checkout.using(store=store, key="o-42").run_sync("o-42") == EXPECTED
    names = [c[0] for c in CALLS]
    assert names[0] == "charge" and sorted(names[1:3]) == ["reserve", "score"]
    assert names[3] == "charge"
    CALLS.clear()
    assert checkout.using(store=store, key="o-42").run_sync("o-42") == EXPECTED
    assert CALLS == []
    view = store.read("o-42")
    assert view["status"] == "done" and view["workflow"] == "checkout"
    assert view["result"] == EXPECTED


async def test_run_is_awaitable_and_concurrent_steps_get_positions_in_call_order(
    store: Store,
) -> None:
    # guarantee 473
    assert await checkout.using(store=store, key="o-1").run("o-42") == EXPECTED
    steps = store.read("o-1")["steps"]
    assert [(s["position"], s["name"]) for s in steps] == [
        ("0", "charge"),
        ("1.0.0", "score"),
        ("1.1.0", "reserve"),
        ("1", "refund_flow"),
    ]
    assert steps[3]["key"] == "o-1/1"  # the child run's key: <parent>/<position>
    assert store.read("o-1/1")["status"] == "done"


@workflow
async def grouped(order_id: str) -> list[str]:
    first = await charge(order_id, 1)
    async with asyncio.TaskGroup() as group:
        two = group.create_task(charge(order_id, 2))
        three = group.create_task(charge(order_id, 3))
    if FAIL.get("stop_after_group"):
        raise KeyboardInterrupt  # the process goes away after the group
    return [first, two.result(), three.result(), await charge(order_id, 4)]


def test_a_task_group_numbers_its_steps_like_gather_and_replays_them(store: Store) -> None:
    # guarantee 473: steps started in a TaskGroup are numbered under a branch of their parent,
    # in the order the tasks were created; a replay gives the same positions and runs none
    FAIL["stop_after_group"] = True
    with pytest.raises(KeyboardInterrupt):
        grouped.using(store=store, key="tg").run_sync("a")
    assert sorted(c[2] for c in CALLS) == [1, 2, 3]
    steps = store.read("tg")["steps"]
    assert [(s["position"], s["args"]) for s in steps] == [
        ("0", ["a", 1]),
        ("1.0.0", ["a", 2]),
        ("1.1.0", ["a", 3]),
    ]
    FAIL.clear()
    CALLS.clear()
    assert grouped.using(store=store, key="tg").run_sync("a") == [
        "receipt-a-1",
        "receipt-a-2",
        "receipt-a-3",
        "receipt-a-4",
    ]
    assert [c[2] for c in CALLS] == [4]  # the grouped steps were replayed, not run
    assert [s["position"] for s in store.read("tg")["steps"]] == ["0", "1.0.0", "1.1.0", "1"]


@workflow
async def parent_of_interrupted(order_id: str) -> list[str]:
    return [await charge(order_id, 0), *await interrupted(order_id)]


def test_a_child_that_did_not_finish_resumes_on_its_own_under_its_key(store: Store) -> None:
    # guarantee 478: the child is a run of its own; resumed under "<parent>/<position>"
    # without its parent, it replays its committed step; the parent then replays the child
    FAIL["stop_after_first"] = True
    with pytest.raises(KeyboardInterrupt):
        parent_of_interrupted.using(store=store, key="p").run_sync("a")
    assert store.read("p/1")["status"] == "running"
    FAIL.clear()
    CALLS.clear()
    child = interrupted.using(store=store, key="p/1").run_sync("a")
    assert child == ["receipt-a-1", "receipt-a-2"] and [c[2] for c in CALLS] == [2]
    CALLS.clear()
    assert parent_of_interrupted.using(store=store, key="p").run_sync("a") == [
        "receipt-a-0",
        *child,
    ]
    assert CALLS == []  # neither the parent's step nor the child's ran again
    assert store.read("p")["status"] == "done"


@workflow
async def interrupted(order_id: str) -> list[str]:
    out = [await charge(order_id, 1)]
    if FAIL.get("stop_after_first"):
        raise KeyboardInterrupt  # the process goes away between two steps
    out.append(await charge(order_id, 2))
    return out


def test_a_resumed_run_replays_committed_steps_and_runs_the_rest(store: Store) -> None:
    # guarantee 471
    FAIL["stop_after_first"] = True
    with pytest.raises(KeyboardInterrupt):
        interrupted.using(store=store, key="k").run_sync("a")
    assert [c[2] for c in CALLS] == [1]
    head = store.read("k")
    assert head["status"] == "running" and [s["status"] for s in head["steps"]] == ["done"]
    FAIL.clear()
    CALLS.clear()
    assert interrupted.using(store=store, key="k").run_sync("a") == [
        "receipt-a-1",
        "receipt-a-2",
    ]
    assert [c[2] for c in CALLS] == [2]  # step 1 was replayed, not run


@step
async def wait_for(event_name: str) -> str:
    await EVENTS[event_name].wait()
    return event_name


EVENTS: dict[str, asyncio.Event] = {}


@workflow
async def waits(name: str) -> str:
    return await wait_for(name)


async def test_a_live_run_is_never_stolen(store: Store) -> None:
    # guarantee 472
    EVENTS["go"] = asyncio.Event()
    first = asyncio.create_task(waits.using(store=store, key="live").run("go"))
    while store.read("live") is None or not store.read("live")["steps"]:
        await asyncio.sleep(0.01)
    with pytest.raises(ConcurrentRunError, match="live"):
        await waits.using(store=store, key="live").run("go")
    EVENTS["go"].set()
    assert await first == "go"


# -- determinism ----------------------------------------------------------------------------
@step
async def other_step(order_id: str) -> str:
    return "other"


@workflow(name="changing")
async def changing_v1(order_id: str) -> str:
    a = await charge(order_id, 1)
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    return a + await charge(order_id, 2)


@workflow(name="changing")
async def changing_v2(order_id: str) -> str:
    a = await other_step(order_id)
    return a + await charge(order_id, 2)


@workflow(name="changing")
async def changing_args(order_id: str) -> str:
    a = await charge(order_id, 999)
    return a + await charge(order_id, 2)


def _half_run(store: Store, key: str) -> None:
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        changing_v1.using(store=store, key=key).run_sync("o")
    FAIL.clear()


def test_another_step_at_a_recorded_position_is_a_determinism_error(store: Store) -> None:
    # guarantee 474
    _half_run(store, "d")
    with pytest.raises(NonDeterministicWorkflowError) as info:
        changing_v2.using(store=store, key="d").run_sync("o")
    text = str(info.value)
    assert "position 0" in text and "'other_step'" in text and "'charge'" in text
    assert "stepstone.patched" in text and "new key" in text
    view = store.read("d")
    assert view["status"] == "failed"
    assert view["error"]["type"].endswith("NonDeterministicWorkflowError")


def test_other_arguments_at_a_recorded_position_are_a_determinism_error(store: Store) -> None:
    # guarantee 474
    _half_run(store, "d2")
    with pytest.raises(NonDeterministicWorkflowError, match="other arguments"):
        changing_args.using(store=store, key="d2").run_sync("o")


@step(name="charge", args_may_change=True)
async def charge_loose(order_id: str, cents: int) -> str:
    return "never run on replay"


@workflow(name="changing")
async def changing_loose(order_id: str) -> str:
    a = await charge_loose(order_id, 999)
    return a + await charge(order_id, 2)


def test_a_step_marked_args_may_change_replays_with_other_arguments(store: Store) -> None:
    # guarantee 474
    _half_run(store, "d3")
    assert changing_loose.using(store=store, key="d3").run_sync("o") == ("receipt-o-1receipt-o-2")


# -- patches --------------------------------------------------------------------------------
@workflow(name="taxes")
async def taxes_v1(order_id: str) -> list[str]:
    out = [await charge(order_id, 1)]
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    out.append(await charge(order_id, 2))
    return out


@workflow(name="taxes")
async def taxes_v2(order_id: str) -> list[str]:
    out = [await charge(order_id, 1)]
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    if stepstone.patched("tax-v2"):
        out.append(await charge(order_id, 7))
    out.append(await charge(order_id, 2))
    return out


@workflow(name="taxes")
async def taxes_v3(order_id: str) -> list[str]:
    out = [await charge(order_id, 1)]
    stepstone.deprecate_patch("tax-v2")
    out.append(await charge(order_id, 7))
    out.append(await charge(order_id, 2))
    return out


def test_patched_takes_the_new_path_only_for_runs_that_reach_it_first(store: Store) -> None:
    # guarantee 475
    FAIL["stop"] = True  # an old run had passed the point where the patch goes
    with pytest.raises(KeyboardInterrupt):
        taxes_v1.using(store=store, key="old").run_sync("o")
    FAIL.clear()
    # ...stopped after step 1 (the patch point is between it and step 2): it resumes
    # on the new code and gets True, since its journal holds nothing at that position
    assert taxes_v2.using(store=store, key="old").run_sync("o") == [
        "receipt-o-1",
        "receipt-o-7",
        "receipt-o-2",
    ]
    # a new run takes the new path, and its replay too
    CALLS.clear()
    assert taxes_v2.using(store=store, key="new").run_sync("o") == [
        "receipt-o-1",
        "receipt-o-7",
        "receipt-o-2",
    ]
    # deprecate_patch keeps runs that recorded the patch replaying
    CALLS.clear()
    assert taxes_v3.using(store=store, key="new").run_sync("o") == [
        "receipt-o-1",
        "receipt-o-7",
        "receipt-o-2",
    ]
    assert CALLS == []


@workflow(name="taxes_mid")
async def taxes_mid_v1(order_id: str) -> list[str]:
    out = [await charge(order_id, 1), await charge(order_id, 2)]
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    out.append(await charge(order_id, 3))
    return out


@workflow(name="taxes_mid")
async def taxes_mid_v2(order_id: str) -> list[str]:
    out = [await charge(order_id, 1)]
    if stepstone.patched("tax-v2"):
        out.append(await charge(order_id, 7))
    out.append(await charge(order_id, 2))
    out.append(await charge(order_id, 3))
    return out


def test_patched_is_false_for_a_run_that_had_passed_the_point(store: Store) -> None:
    # guarantee 475
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        taxes_mid_v1.using(store=store, key="mid").run_sync("o")
    FAIL.clear()
    CALLS.clear()
    assert taxes_mid_v2.using(store=store, key="mid").run_sync("o") == [
        "receipt-o-1",
        "receipt-o-2",
        "receipt-o-3",
    ]
    assert [c[2] for c in CALLS] == [3]  # the two recorded steps replayed, no step 7
    CALLS.clear()
    assert taxes_mid_v2.using(store=store, key="fresh").run_sync("o") == [
        "receipt-o-1",
        "receipt-o-7",
        "receipt-o-2",
        "receipt-o-3",
    ]


# -- retries --------------------------------------------------------------------------------
@step(retries=2, retry_delay=0.001)
async def flaky(n: int) -> int:
    attempt = stepstone.step_context().attempt
    CALLS.append(("flaky", attempt))
    if attempt <= FAIL.get("flaky_failures", 0):
        raise ConnectionError(f"attempt {attempt} failed")
    return n * 10


@workflow
async def retrying(n: int) -> Any:
    try:
        return await flaky(n)
    except ConnectionError as exc:
        return f"gave up: {exc}"


def test_retries_record_each_attempt_and_the_last_error_reaches_the_workflow(
    store: Store,
) -> None:
    # guarantee 476
    FAIL["flaky_failures"] = 2
    assert retrying.using(store=store, key="r1").run_sync(4) == 40
    assert CALLS == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    step_view = store.read("r1")["steps"][0]
    assert step_view["attempts"] == 3
    assert [a["error"]["message"] for a in step_view["failed_attempts"]] == [
        "attempt 1 failed",
        "attempt 2 failed",
    ]
    CALLS.clear()
    FAIL["flaky_failures"] = 5
    assert retrying.using(store=store, key="r2").run_sync(4) == "gave up: attempt 3 failed"
    assert len(CALLS) == 3
    # the caught error is recorded: a replay raises it again, and the run ends the same
    CALLS.clear()
    assert retrying.using(store=store, key="r2").run_sync(4) == "gave up: attempt 3 failed"
    assert CALLS == []


@step(retries=3, retry_delay=0.04, max_retry_delay=0.1)
async def slow_to_work(n: int) -> int:
    CALLS.append(("slow_to_work", time.monotonic()))
    if len(CALLS) < 4:
        raise ConnectionError("not yet")
    return n


@workflow
async def backing_off(n: int) -> int:
    return await slow_to_work(n)


def test_retry_delays_double_from_retry_delay_up_to_the_cap(store: Store) -> None:
    # guarantee 476: waits of S, 2S, then the cap, each jittered down by at most half (a
    # constant S would let the second wait be as short as S/2)
    assert backing_off.using(store=store, key="b").run_sync(7) == 7
    times = [c[1] for c in CALLS]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(gaps) == 3
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.05
    assert [a["attempt"] for a in store.read("b")["steps"][0]["failed_attempts"]] == [1, 2, 3]


@workflow
async def failing(order_id: str) -> str:
    return await charge(order_id, 5)


def test_a_failed_run_resumes_and_runs_the_step_that_failed_again(store: Store) -> None:
    # guarantee 480
    FAIL["charge"] = ValueError("card declined")
    with pytest.raises(ValueError, match="card declined"):
        failing.using(store=store, key="f").run_sync("o")
    view = store.read("f")
    assert view["status"] == "failed"
    assert view["error"]["message"] == "card declined" and view["error"]["step"] == "0 charge"
    FAIL.clear()
    CALLS.clear()
    assert failing.using(store=store, key="f").run_sync("o") == "receipt-o-5"
    assert [c[3] for c in CALLS] == [2]  # its second attempt
    assert store.read("f")["status"] == "done"


def test_a_replayed_error_keeps_its_type(store: Store) -> None:
    # guarantee 476
    FAIL["charge"] = KeyError("missing")

    @workflow(name="catches")
    async def catches(order_id: str) -> str:
        try:
            return await charge(order_id, 1)
        except KeyError as exc:
            return f"caught {type(exc).__name__} {exc}"

    assert catches.using(store=store, key="c").run_sync("o") == "caught KeyError 'missing'"
    FAIL.clear()
    CALLS.clear()
    assert catches.using(store=store, key="c").run_sync("o") == "caught KeyError 'missing'"
    assert CALLS == []


# -- in doubt -------------------------------------------------------------------------------
@step(in_doubt="fail")
async def pay_once(order_id: str) -> str:
    CALLS.append(("pay_once", stepstone.step_context().attempt))
    if FAIL.get("die_in_step"):
        raise KeyboardInterrupt  # the process dies while the call is under way
    return "paid"


@step
async def pay_again(order_id: str) -> str:
    ctx = stepstone.step_context()
    CALLS.append(("pay_again", ctx.attempt, ctx.idempotency_key))
    if FAIL.get("die_in_step"):
        raise KeyboardInterrupt
    return "paid"


@workflow
async def pays(order_id: str, policy: str) -> str:
    return await (pay_once(order_id) if policy == "fail" else pay_again(order_id))


def test_a_step_in_doubt_runs_again_with_the_same_idempotency_key(store: Store) -> None:
    # guarantee 477
    FAIL["die_in_step"] = True
    with pytest.raises(KeyboardInterrupt):
        pays.using(store=store, key="p").run_sync("o", "rerun")
    FAIL.clear()
    assert pays.using(store=store, key="p").run_sync("o", "rerun") == "paid"
    (_, a1, key1), (_, a2, key2) = CALLS
    assert (a1, a2) == (1, 2) and key1 == key2


def test_a_step_in_doubt_that_declares_fail_is_not_run_again(store: Store) -> None:
    # guarantee 477
    FAIL["die_in_step"] = True
    with pytest.raises(KeyboardInterrupt):
        pays.using(store=store, key="p2").run_sync("o", "fail")
    FAIL.clear()
    with pytest.raises(EffectInDoubtError, match="in_doubt='fail'") as info:
        pays.using(store=store, key="p2").run_sync("o", "fail")
    assert "pay_once" in str(info.value) and "position 0" in str(info.value)
    assert CALLS == [("pay_once", 1)]
    assert store.read("p2")["status"] == "failed"
    # a resume refuses again (the error is not one a resume runs again)
    with pytest.raises(EffectInDoubtError):
        pays.using(store=store, key="p2").run_sync("o", "fail")
    assert len(CALLS) == 1


# -- values ---------------------------------------------------------------------------------
class Order(BaseModel):
    id: str
    cents: int


@dataclasses.dataclass(frozen=True)
class Slot:
    at: datetime.datetime
    seats: frozenset[int]


@step
async def book(order: Order, when: datetime.datetime) -> Slot:
    CALLS.append(("book", order.id))
    return Slot(at=when, seats=frozenset({1, 2}))


@workflow
async def booking(order: Order, when: datetime.datetime) -> tuple[Slot, Order]:
    slot = await book(order, when)
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    return slot, order


def test_values_come_back_as_themselves_on_replay(store: Store) -> None:
    # guarantee 479
    when = datetime.datetime(2026, 5, 1, 9, 30, tzinfo=datetime.UTC)
    order = Order(id="o-9", cents=100)
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        booking.using(store=store, key="v").run_sync(order, when)
    FAIL.clear()
    CALLS.clear()
    slot, back = booking.using(store=store, key="v").run_sync(order, when)
    assert CALLS == []  # replayed
    assert slot == Slot(at=when, seats=frozenset({1, 2})) and isinstance(slot, Slot)
    assert back == order and isinstance(back, Order)
    again = booking.using(store=store, key="v").run_sync(order, when)  # the recorded result
    assert again == (slot, order) and isinstance(again[0].at, datetime.datetime)


class Live:
    """An object the codec cannot hold."""


@step
async def takes_live(order_id: str, client: Any) -> str:
    CALLS.append(("takes_live",))
    return "ran"


@workflow
async def passes_live(order_id: str) -> str:
    return await takes_live(order_id, client=Live())


def test_a_value_the_codec_cannot_hold_names_the_step_and_argument(store: Store) -> None:
    # guarantee 479
    with pytest.raises(SerializationError) as info:
        passes_live.using(store=store, key="x").run_sync("o")
    assert "step" in str(info.value) and "'takes_live'" in str(info.value)
    assert "'client'" in str(info.value)
    assert CALLS == []
    with pytest.raises(SerializationError, match="argument 'order_id'"):
        passes_live.using(store=store, key="y").run_sync(Live())  # type: ignore[arg-type]


# -- plain calls, sync steps, context -------------------------------------------------------
def test_steps_and_workflows_outside_a_workflow_are_plain_calls() -> None:
    # guarantee 481
    assert score("o") == 0.25  # a sync step: its value
    assert asyncio.run(charge("o", 1)) == "receipt-o-1"
    ctx = stepstone.step_context()
    assert ctx.key is None and ctx.attempt == 1 and len(ctx.idempotency_key) == 32
    assert asyncio.run(refund_flow("o")) == "receipt-o--100"  # no store: the plain function


def test_step_context_inside_a_step(store: Store) -> None:
    # guarantee 481
    failing.using(store=store, key="ctx").run_sync("o")
    (_, _, _, attempt, key) = CALLS[0]
    assert attempt == 1
    head = read_run(store, "ctx")
    assert head is not None
    origin = head[0].meta["origin"]
    assert key == f"ctx:{origin}:0:charge"


@step
def sync_thread(n: int) -> str:
    import threading
    import time

    time.sleep(0.002)  # not a quick function: it stays off the loop's thread
    return threading.current_thread().name


@workflow
async def threads(n: int) -> list[str]:
    return list(await asyncio.gather(*(sync_thread(i) for i in range(n))))


async def test_sync_steps_run_off_the_event_loop(store: Store) -> None:
    # guarantee 482
    names = await threads.using(store=store, key="t").run(3)
    assert all(name != "MainThread" for name in names)
    assert [s["status"] for s in store.read("t")["steps"]] == ["done"] * 3


# -- keys -----------------------------------------------------------------------------------
@workflow(key="order-{order_id}")
async def keyed(order_id: str, note: str = "") -> str:
    return await charge(order_id, 1)


def test_a_key_template_is_filled_from_the_arguments(store: Store) -> None:
    # guarantee 470
    assert keyed.using(store=store).run_sync("o-5") == "receipt-o-5-1"
    assert store.read("order-o-5")["status"] == "done"
    # an unfinished run under a key resumes only with its own arguments
    FAIL["charge"] = ValueError("x")
    with pytest.raises(ValueError, match="x"):
        keyed.using(store=store, key="k2").run_sync("a")
    FAIL.clear()
    with pytest.raises(UserError, match="other arguments"):
        keyed.using(store=store, key="k2").run_sync("b")


def test_a_key_holding_another_workflow_is_refused(store: Store) -> None:
    failing.using(store=store, key="same").run_sync("o")
    with pytest.raises(UserError, match="workflow 'failing', not 'checkout'"):
        checkout.using(store=store, key="same").run_sync("o")


def test_a_workflow_without_a_store_says_how_to_give_one() -> None:
    with pytest.raises(UserError, match="using\\(store="):
        checkout.run_sync("o")


def test_decorators_refuse_what_they_cannot_make_durable() -> None:
    with pytest.raises(TypeError, match="async def"):
        workflow(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_doubt"):
        step(in_doubt="maybe")(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retries"):
        step(retries=-1)(lambda: None)


# -- commits --------------------------------------------------------------------------------
@step
def nth(i: int) -> int:
    return i


@workflow
async def sequence(n: int) -> int:
    return sum([await nth(i) for i in range(n)])


def test_one_commit_per_step(store: Store) -> None:
    # guarantee 483: a step's outcome rides with the next step's intent
    assert sequence.using(store=store, key="seq").run_sync(10) == 45
    found = read_run(store, "seq")
    assert found is not None
    head, rows = found
    # the claim writes version 1; then one commit per step (the first step's intent, each
    # outcome with the next intent), and the last outcome with the result
    assert head.version == 1 + 10 + 1
    # one journal row per commit: the step records it holds, then the result
    assert [r.kind for r in rows] == ["start"] + ["ops"] * 11 + ["result"]
    assert [[k, p] for k, p, _ in json.loads(rows[2].data)] == [["outcome", "0"], ["intent", "1"]]
    assert json.loads(rows[-1].data) == {"value": 45}


# -- agents inside workflows ------------------------------------------------------------------
TOOL_RUNS: list[str] = []


def lookup(city: str) -> str:
    """Look a city's weather up."""
    TOOL_RUNS.append(city)
    return f"{city}: sunny"


def test_an_agent_in_a_workflow_body_is_journaled_and_replayed(store: Store) -> None:
    # guarantee 488
    from stepstone import Agent, LLMEngine
    from stepstone.testing import FakeModel, call

    model = FakeModel([call("lookup", city="Paris"), "Paris is sunny"])
    agent = Agent(name="weather", engine=LLMEngine(model), tools=[lookup])

    @workflow(name="forecast")
    async def forecast(city: str) -> str:
        env = await agent.run(f"weather in {city}?")
        text = await charge(str(env.payload), 1)
        if FAIL.get("stop"):
            raise KeyboardInterrupt
        return text

    TOOL_RUNS.clear()
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        forecast.using(store=store, key="w").run_sync("Paris")
    FAIL.clear()
    assert len(model.requests) == 2 and TOOL_RUNS == ["Paris"]
    CALLS.clear()
    assert forecast.using(store=store, key="w").run_sync("Paris") == ("receipt-Paris is sunny-1")
    assert len(model.requests) == 2 and TOOL_RUNS == ["Paris"]  # nothing asked or run again
    assert CALLS == []
    ops = store.read("w")["steps"]
    assert [(o["position"], o["op"]) for o in ops] == [("0", "agent"), ("1", "step")]
    loop_key = ops[0]["key"]
    assert store.read(loop_key) is not None  # the agent's own run, under the loop's key


# -- plans inside workflows ---------------------------------------------------------------------
PLAN_RUNS: list[str] = []


def _plan_step(payload: Any) -> str:
    PLAN_RUNS.append(str(payload))
    return f"planned {payload}"


def test_a_plan_in_a_workflow_body_is_a_child_run_found_again_on_resume(store: Store) -> None:
    # guarantee 489
    from stepstone import Agent, Plan, Step

    planner = Agent(engine=Plan(Step(_plan_step, name="prepare")))

    @workflow(name="with_plan")
    async def with_plan(order_id: str) -> str:
        env = await planner.run(order_id)
        text = await charge(str(env.payload), 1)
        if FAIL.get("stop"):
            raise KeyboardInterrupt
        return text

    PLAN_RUNS.clear()
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):
        with_plan.using(store=store, key="wp").run_sync("o-8")
    FAIL.clear()
    CALLS.clear()
    assert with_plan.using(store=store, key="wp").run_sync("o-8") == "receipt-planned o-8-1"
    assert PLAN_RUNS == ["o-8"] and CALLS == []  # the plan's step and the charge replayed
    ops = store.read("wp")["steps"]
    assert [(o["position"], o["op"]) for o in ops] == [("0", "plan"), ("1", "step")]
    assert ops[0]["key"] == "wp/0" and store.read("wp/0")["status"] == "done"


# -- graphs inside workflows --------------------------------------------------------------------
class Ticket(State):
    n: int = 0
    trail: list[str] = Field(default_factory=list)


def _triage(state: Ticket) -> dict[str, Any]:
    PLAN_RUNS.append("triage")
    return {"n": state.n + 1, "trail": [*state.trail, "triage"]}


async def _answer(state: Ticket) -> dict[str, Any]:
    PLAN_RUNS.append("answer")
    if FAIL.get("in_answer"):
        raise KeyboardInterrupt  # the process goes away inside the graph's second node
    receipt = await charge("in-node", state.n)  # a step in a node is a plain call
    return {"n": state.n * 10, "trail": [*state.trail, receipt]}


TICKETS = (
    GraphBuilder(Ticket)
    .add_node("triage", _triage)
    .add_node("answer", _answer)
    .add_edge("triage", "answer")
    .add_edge("answer", END)
    .set_entry("triage")
    .compile()
)


@workflow(name="with_graph")
async def with_graph(n: int) -> int:
    final = await TICKETS.ainvoke(Ticket(n=n))
    after = await charge("after", final.n)
    if FAIL.get("stop"):
        raise KeyboardInterrupt
    return len(after) + final.n


def test_a_graph_in_a_workflow_body_is_one_operation_replayed_on_resume(store: Store) -> None:
    # guarantee 492: before, the graph was a plain call: a resumed workflow ran its nodes again
    PLAN_RUNS.clear()
    FAIL["in_answer"] = True
    with pytest.raises(KeyboardInterrupt):  # cut short inside the graph: it runs again
        with_graph.using(store=store, key="wg").run_sync(1)
    FAIL.clear()
    FAIL["stop"] = True
    with pytest.raises(KeyboardInterrupt):  # cut short after the graph: it is replayed
        with_graph.using(store=store, key="wg").run_sync(1)
    assert PLAN_RUNS == ["triage", "answer", "triage", "answer"]
    FAIL.clear()
    CALLS.clear()
    assert with_graph.using(store=store, key="wg").run_sync(1) == len("receipt-after-20") + 20
    assert PLAN_RUNS == ["triage", "answer", "triage", "answer"] and CALLS == []
    ops = store.read("wg")["steps"]
    assert [(o["position"], o["op"], o["name"]) for o in ops] == [
        ("0", "graph", "graph Ticket"),
        ("1", "step", "charge"),
    ]
    assert ops[0]["value"] == {"n": 20, "trail": ["triage", "receipt-in-node-2"]}
    assert ops[0]["attempts"] == 2  # the first attempt was cut short, the second finished


def test_a_step_in_doubt_is_settled_by_hand_and_the_run_goes_on(store: Store) -> None:
    # guarantee 491
    from stepstone.durable._operations import settle_operation

    for key, happened in (("s1", True), ("s2", False)):
        CALLS.clear()
        FAIL["die_in_step"] = True
        with pytest.raises(KeyboardInterrupt):
            pays.using(store=store, key=key).run_sync("o", "fail")
        FAIL.clear()
        with pytest.raises(EffectInDoubtError):
            pays.using(store=store, key=key).run_sync("o", "fail")
        head = settle_operation(store, key, "pay_once", happened=happened, value="paid by hand")
        assert head.status == "paused"
        result = pays.using(store=store, key=key).run_sync("o", "fail")
        if happened:  # its recorded result is replayed: the call is not made again
            assert result == "paid by hand" and CALLS == [("pay_once", 1)]
        else:  # it did not happen: the resume makes the call
            assert result == "paid" and CALLS == [("pay_once", 1), ("pay_once", 1)]
        with pytest.raises(UserError, match="not in doubt"):
            settle_operation(store, key, "0", happened=True)


LEAKED: list[asyncio.Task[Any]] = []
RUN_ENDED: list[asyncio.Event] = []


@workflow
async def leaks(order_id: str) -> str:
    async def later() -> str:
        await RUN_ENDED[0].wait()
        return await charge(order_id, 9)  # after the run ended

    LEAKED.append(asyncio.create_task(later()))
    return await charge(order_id, 1)


async def test_a_step_called_after_its_run_ended_is_refused(store: Store) -> None:
    # guarantee 483: nothing is written into a run that ended
    LEAKED.clear()
    RUN_ENDED[:] = [asyncio.Event()]
    assert await leaks.using(store=store, key="leak").run("o") == "receipt-o-1"
    RUN_ENDED[0].set()
    with pytest.raises(RuntimeError, match="has ended"):
        await LEAKED[0]
    assert store.read("leak")["status"] == "done" and len(store.read("leak")["steps"]) == 1


def test_stepstone_settle_lists_and_settles_a_workflow_step_in_doubt(tmp_path: Path) -> None:
    # guarantee 491: the generic settle (Python and `stepstone settle`) reaches workflow steps
    from typer.testing import CliRunner

    from stepstone.cli import app
    from stepstone.durable import in_doubt_effects

    db = tmp_path / "settle.sqlite"
    with Store(db=db) as store:
        FAIL["die_in_step"] = True
        with pytest.raises(KeyboardInterrupt):
            pays.using(store=store, key="cli").run_sync("o", "fail")
        FAIL.clear()
        with pytest.raises(EffectInDoubtError):
            pays.using(store=store, key="cli").run_sync("o", "fail")
        (doubt,) = in_doubt_effects(store, "cli")
        assert (doubt["position"], doubt["name"]) == ("0", "pay_once")
    cli = CliRunner(env={"COLUMNS": "200"})
    shown = cli.invoke(app, ["show", "cli", "--db", str(db)])
    assert shown.exit_code == 0 and "EffectInDoubtError" in shown.output
    assert "at None" not in shown.output  # guarantee 493: a failure that names no step
    argv = ["settle", "cli", "0", "--happened", "--result", "paid by hand", "--db", str(db)]
    out = cli.invoke(app, argv)
    assert out.exit_code == 0, out.output
    assert "cli: pay_once call 0 settled as happened" in " ".join(out.output.split())  # 493
    with Store(db=db) as store:
        CALLS.clear()
        assert pays.using(store=store, key="cli").run_sync("o", "fail") == "paid by hand"
        assert CALLS == []
