"""A resumed step sees exactly the values a straight run would hand it: typed outputs
restored from the journal (bands, routes, pauses), plain JSON in the Store."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import pathlib
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import (
    Agent,
    Envelope,
    Plan,
    PlanPaused,
    Step,
    Store,
    UnserializableValueWarning,
    from_parallel_all,
    from_step,
)
from stepstone.exceptions import SerializationError


class Label(BaseModel):
    name: str
    score: float


class Inner(BaseModel):
    when: datetime.datetime
    tags: list[str]


class Outer(BaseModel):
    inner: Inner
    label: Label


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: decimal.Decimal


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    S = 1
    L = 3


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(db=tmp_path / "values.sqlite")
    yield s
    s.close()


def run(plan: Plan, task: str = "go") -> Envelope[Any]:
    return Agent(engine=plan)(task)


def rich_value() -> dict[str, Any]:
    when = datetime.datetime(2026, 4, 30, 12, 30, 5, 123456, tzinfo=datetime.UTC)
    return {
        "when": when,
        "naive": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "day": datetime.date(2026, 4, 30),
        "at": datetime.time(9, 15, 0),
        "took": datetime.timedelta(days=1, seconds=5, microseconds=7),
        "price": decimal.Decimal("19.990"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "blob": b"\x00\xffraw",
        "buf": bytearray(b"\x01\x02"),
        "path": pathlib.Path("/data/in.csv"),
        "color": Color.BLUE,
        "size": Size.L,
        "set": {3, 1, 2},
        "frozen": frozenset({"a"}),
        "pair": (1, "two", (3.5, None)),
        "point": Point(1, decimal.Decimal("2.50")),
        "model": Outer(inner=Inner(when=when, tags=["x"]), label=Label(name="a", score=0.5)),
        "int_keys": {1: "one", 2: "two"},
        "tricky": {"$stepstone": "datetime", "v": "not a tag: user data"},
        "nan": float("inf"),
        "nested": [{"deep": (Color.RED, {decimal.Decimal("1.5")})}],
    }


def same(a: Any, b: Any) -> None:
    """Equal, and of the same type all the way down."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


def _rich_plan(store: Store | None, seen: list[Any], gate: dict[str, str]) -> Plan:
    def produce(payload: Any) -> dict[str, Any]:
        return rich_value()

    def consume(payload: Any) -> str:
        seen.append(payload)
        if gate.get("consume") == "fail":
            raise RuntimeError("consume broke")
        if gate.get("consume") == "pause":
            raise PlanPaused("waiting")
        return "ok"

    kw: dict[str, Any] = (
        {"store": store, "checkpoint_key": "rich-run", "resume": True} if store else {}
    )
    return Plan(Step(produce, writes="rich"), Step(consume), **kw)


@pytest.mark.parametrize("stop", ["fail", "pause"])
def test_resumed_step_gets_the_same_types_as_a_straight_run(store: Store, stop: str) -> None:
    # guarantee 124
    straight: list[Any] = []
    assert run(_rich_plan(None, straight, {})).ok
    seen: list[Any] = []
    gate = {"consume": stop}
    assert not run(_rich_plan(store, seen, gate)).ok
    gate.clear()
    env = run(_rich_plan(store, seen, gate))
    assert env.ok, env.error
    assert len(seen) == 2
    same(straight[0], seen[1])  # after the resume: from the journal
    same(straight[0], seen[0])  # in the run that stopped: in memory


def test_store_keeps_plain_json_for_writes(store: Store) -> None:
    # guarantee 125
    seen: list[Any] = []
    assert run(_rich_plan(store, seen, {})).ok
    raw = store.read("rich")
    assert raw["when"] == "2026-04-30T12:30:05.123456+00:00"
    assert raw["price"] == "19.990" and raw["blob"] == "AP9yYXc="
    assert raw["model"]["label"] == {"name": "a", "score": 0.5}
    assert raw["set"] == [1, 2, 3] and raw["pair"] == [1, "two", [3.5, None]]
    assert raw["int_keys"] == {"1": "one", "2": "two"}
    assert raw["tricky"] == {"$stepstone": "datetime", "v": "not a tag: user data"}
    entry = store.read("rich-run")["history"][0]["envelope"]
    assert entry["payload"] == raw  # the checkpoint view is plain JSON too


class Opaque:
    def __str__(self) -> str:
        return "opaque!"


def test_other_values_warn_with_a_store_and_never_without(store: Store) -> None:
    # guarantee 126
    def make(payload: Any) -> dict[str, Any]:
        return {"o": Opaque()}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run(Plan(Step(make), Step(lambda p: "b", name="b"))).ok  # no store: no warning
    plan = Plan(Step(make), Step(lambda p: "b", name="b"), store=store, checkpoint_key="w")
    with pytest.warns(UnserializableValueWarning, match=r"step 'make'.*Opaque"):
        assert run(plan).ok


def test_a_value_that_contains_itself_fails_its_step_by_name(store: Store) -> None:
    # guarantee 126: before, a raw RecursionError escaped agent(...) on every resume
    calls: list[str] = []

    def loop(payload: Any) -> list[Any]:
        calls.append("loop")
        cycle: list[Any] = [1]
        cycle.append(cycle)
        return cycle

    plan = Plan(Step(loop), Step(lambda p: "b", name="b"), store=store, checkpoint_key="c")
    env = run(plan)
    assert env.error is not None and env.error.type == "SerializationError"
    assert "step 'loop' output" in env.error.message and "contains itself" in env.error.message
    assert store.read("c")["status"] == "failed" and calls == ["loop"]
    with pytest.raises(SerializationError, match=r"store\['k'\] cannot be stored"):
        store.write("k", _cyclic())


def _cyclic() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


# -- restore paths with typed outputs (bands, routes, pauses) ----------------------------


def _band_plan(store: Store, gate: dict[str, Any], seen: list[Any]) -> Plan:
    def classify(payload: Any) -> Label:
        return Label(name="cat", score=0.9)

    def locate(payload: Any) -> Point:
        if gate.get("locate") == "fail":
            raise RuntimeError("locate broke")
        if gate.get("locate") == "die":
            raise KeyboardInterrupt  # the process dies inside the band
        if gate.get("locate") == "pause":
            raise PlanPaused("locate waits for a map")
        return Point(3, decimal.Decimal("4.25"))

    def report(payload: Any) -> str:
        seen.append(payload)
        return "done"

    return Plan(
        Step(classify, output=Label, writes="label", parallel=True),
        Step(locate, writes="where", parallel=True),
        Step(report, task=from_parallel_all("classify")),
        store=store,
        checkpoint_key="band",
        resume=True,
    )


@pytest.mark.parametrize("how", ["fail", "die", "pause"])
def test_band_with_pydantic_writes_resumes_after_a_sibling_stops(store: Store, how: str) -> None:
    # guarantee 123
    seen: list[Any] = []
    gate = {"locate": how}
    if how == "die":
        with pytest.raises(KeyboardInterrupt):
            run(_band_plan(store, gate, seen))
    else:
        env = run(_band_plan(store, gate, seen))
        expected = "RuntimeError" if how == "fail" else "PlanPaused"
        assert not env.ok and env.error is not None and env.error.type == expected
        assert store.read("band")["error"]["step"] == "locate"  # the branch that stopped
    gate.clear()
    for _ in range(2):  # resumable, and again once done
        env = run(_band_plan(store, gate, seen))
        assert env.ok, env.error
    assert store.read("label") == {"name": "cat", "score": 0.9}
    assert store.read("where") == {"x": 3, "y": "4.25"}
    assert seen == [
        {"classify": Label(name="cat", score=0.9), "locate": Point(3, decimal.Decimal("4.25"))}
    ]
    assert isinstance(seen[0]["classify"], Label) and isinstance(seen[0]["locate"], Point)


def test_route_target_and_pause_restore_typed_outputs(store: Store) -> None:
    # guarantee 123
    gate = {"approve": "pause"}
    seen: list[Any] = []

    def draft(payload: Any) -> Outer:
        when = datetime.datetime(2026, 5, 1, tzinfo=datetime.UTC)
        return Outer(inner=Inner(when=when, tags=["t"]), label=Label(name="d", score=1.0))

    def fix(payload: Outer) -> Outer:
        return payload.model_copy(update={"label": Label(name="fixed", score=2.0)})

    def approve(payload: Any) -> str:
        seen.append(payload)
        if gate.get("approve") == "pause":
            raise PlanPaused("needs a human")
        return "approved"

    def skipped(payload: Any) -> str:
        raise AssertionError("the route jumps over this step")

    def plan() -> Plan:
        return Plan(
            Step(draft, output=Outer, routes={"fix": lambda e: e.payload.label.name == "d"}),
            Step(skipped),
            Step(fix, input=Outer, output=Outer, name="fix"),
            Step(approve, task=from_step("fix"), name="approve"),
            store=store,
            checkpoint_key="route",
            resume=True,
        )

    env = run(plan())
    assert not env.ok and env.error is not None and env.error.type == "PlanPaused"
    gate.clear()
    env = run(plan())
    assert env.ok, env.error
    assert len(seen) == 2 and seen[0] == seen[1]
    assert isinstance(seen[1], Outer) and seen[1].label.name == "fixed"
    assert seen[1].inner.when.tzinfo is not None


FIXTURE = Path(__file__).with_name("fixtures") / "plan_journal_encoding1.json"


def test_journal_of_the_untagged_encoding_still_resumes(store: Store) -> None:
    # guarantee 127
    import json

    from stepstone.store import Claim, JournalRow, RunHead

    frozen = json.loads(FIXTURE.read_text())
    head = RunHead(**frozen["head"])
    rows = [JournalRow(*r) for r in frozen["rows"]]
    store.backend.run_transact(head.key, lambda h, kv: Claim(head=head, rows=rows))
    for key, value in frozen["kv"].items():
        store.write(key, value)
    seen: list[Any] = []

    def produce(payload: Any) -> Any:
        raise AssertionError("completed in the old run: not run again")

    def consume(payload: Any) -> str:
        seen.append(payload)
        return "consumed"

    plan = Plan(
        Step(produce, writes="old-out"),
        Step(consume),
        store=store,
        checkpoint_key="old-run",
        resume=True,
    )
    assert run(plan).ok
    # Models were tagged before too and come back typed; the rest was stored as text.
    assert seen == [
        {
            "label": Label(name="old", score=0.25),
            "when": "2026-04-30T08:00:00+00:00",
            "price": "9.50",
            "n": 3,
        }
    ]
    state = store.read("old-run")
    assert state["status"] == "done" and state["completed_steps"] == ["produce", "consume"]
    assert state["history"][0]["envelope"]["payload"]["label"] == {"name": "old", "score": 0.25}
