"""The bytes a durable Plan step commits: its journal row is exactly the compact JSON of
``{"iteration", "envelope" (the output, tagged, without task and context), "band"?,
"writes"?}`` and its ``writes=`` value exactly that of the plain value, whatever the
payload (the engine encodes the payload once and reuses its text where it can)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import Agent, Envelope, Plan, Step, Store
from stepstone.core._envelope import ErrorInfo
from stepstone.core._serialization import dumps, to_json_value
from stepstone.durable import read_run
from stepstone.durable._kernel import Encoded, claim_run
from stepstone.engines.plan._checkpoint import step_row
from stepstone.exceptions import SerializationError


class Model(BaseModel):
    a: int
    b: str = "é"


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    tags: list[Any]


PAYLOADS: list[Any] = [
    "x" * 1000,
    "",
    'é \u2028 "quoted" \\ back',
    0,
    -7,
    2.5,
    True,
    None,
    [1, "a", None, [2.5]],
    {"a": 1, "b": {"c": [1, 2]}},
    {"$stepstone": "looks like a tag", "v": 1},
    {1: "int key", (2, 3): "tuple key"},
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    decimal.Decimal("1.10"),
    uuid.UUID(int=5),
    Model(a=1),
    Colour.RED,
    Point(1, [Model(a=2), (1, 2)]),
    (1, 2),
    frozenset({3}),
    b"\x00\xff",
    float("nan"),
    {"nested": {"model": Model(a=3), "tuple": (1,), "when": datetime.date(2020, 1, 1)}},
]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    s = Store() if request.param == "memory" else Store(db=tmp_path / "rows.sqlite")
    yield s
    s.close()


def _expected_row(iteration: int, out: Envelope[Any], writes: str | None) -> str:
    env = out.to_dict()
    env.pop("task", None)
    env.pop("context", None)
    data: dict[str, Any] = {"iteration": iteration, "envelope": env}
    if writes is not None:
        data["writes"] = writes
    return dumps(data)


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_step_rows_and_writes_values_are_the_compact_json_of_their_data(
    store: Store, payload: Any
) -> None:
    # guarantees 39, 41, 125: one transaction holds the row and the value, the value is the
    # plain JSON the checkpoint's kv shows, the row keeps the type tags for a resume
    def produce(_: Any) -> Any:
        return payload

    def keep(x: Any) -> Any:
        return x

    plan = Plan(
        Step(produce, writes="out"),
        Step(keep),  # no writes=: a row without a value
        store=store,
        checkpoint_key="rows",
    )
    env = Agent(engine=plan)("go")  # (no value here warns: each one has a type tag)
    assert env.ok, env.error
    found = read_run(store, "rows")
    assert found is not None
    head, rows = found
    steps = [row for row in rows if row.kind == "step"]
    assert [row.name for row in steps] == ["produce", "keep"]
    first = Envelope(payload=payload)
    assert steps[0].data == _expected_row(1, first, "out")
    assert steps[1].data == _expected_row(2, Envelope(payload=env.payload), None)
    assert store.backend.kv_get("out") == dumps(to_json_value(payload, warn=False))
    assert head.status == "done"


def test_a_band_branch_row_names_its_band(store: Store) -> None:
    # guarantee 11: branch rows carry their band; the band row applies them
    def left(_: Any) -> dict[str, Any]:
        return {"side": "left", "when": datetime.date(2026, 1, 1)}

    def right(_: Any) -> str:
        return "right"

    plan = Plan(
        Step(left, writes="l", parallel=True),
        Step(right, writes="r", parallel=True),
        store=store,
        checkpoint_key="band",
    )
    assert Agent(engine=plan)("go").ok
    found = read_run(store, "band")
    assert found is not None
    by_name = {row.name: row for row in found[1] if row.kind == "step"}
    for name, fn, key in (("left", left, "l"), ("right", right, "r")):
        env = Envelope(payload=fn(None)).to_dict()
        del env["task"]
        data = {"iteration": 1, "envelope": env, "band": "left", "writes": key}
        assert by_name[name].data == dumps(data)
        assert store.backend.kv_get(key) == dumps(to_json_value(fn(None)))


def test_the_kernel_commits_encoded_text_as_it_is(store: Store) -> None:
    claim = claim_run(store, "enc", kind="enc-test", resume=False, first_step="a")
    assert claim.run is not None
    try:
        claim.run.commit_sync(
            status="running",
            next_step="b",
            rows=[("step", "a", Encoded('{"spaced": [1, 2]}')), ("step", "a2", {"plain": 1})],
            writes=[("enc:v", Encoded('"text as given"')), ("enc:w", [1, 2])],
        )
        rows = claim.run.journal()
        assert [row.data for row in rows] == ['{"spaced": [1, 2]}', '{"plain":1}']
        assert store.backend.kv_get("enc:v") == '"text as given"'
        assert store.backend.kv_get("enc:w") == "[1,2]"
        with pytest.raises(SerializationError, match=r"writes\['enc:x'\] is not JSON-ready"):
            claim.run.commit_sync(status="running", next_step="c", writes=[("enc:x", {1j})])
        with pytest.raises(SerializationError, match=r"journal row step 'z' is not JSON-ready"):
            claim.run.commit_sync(status="running", next_step="c", rows=[("step", "z", object())])
        assert len(claim.run.journal()) == 2  # nothing of the refused commits was written
    finally:
        claim.run.release()


@pytest.mark.parametrize("payload", PAYLOADS[:12] + PAYLOADS[-3:], ids=lambda p: type(p).__name__)
def test_every_shape_of_step_row_is_the_compact_json_of_its_dict(payload: Any) -> None:
    # guarantees 39, 125: with or without metadata, an error, a band or writes=
    error = ErrorInfo(type="ValueError", message="bad é", retryable=True)
    for metadata in (
        {},
        {"step": "s", "idempotency_key": "k:s:3", "when": datetime.date(2020, 1, 1)},
    ):
        for err in (None, error):
            env = Envelope(
                task="t", context="c", payload=payload, metadata=dict(metadata), error=err
            )
            for band in (None, "b1"):
                for writes in (None, "k:w"):
                    for iteration in (1, 12345):
                        row, value = step_row(
                            "s", env, iteration=iteration, band=band, writes=writes, strict=False
                        )
                        data = env.to_dict()
                        del data["task"], data["context"]
                        expected: dict[str, Any] = {"iteration": iteration, "envelope": data}
                        if band is not None:
                            expected["band"] = band
                        if writes is not None:
                            expected["writes"] = writes
                        assert row[:2] == ("step", "s")
                        assert isinstance(row[2], Encoded) and row[2].text == dumps(expected)
                        if writes is None:
                            assert value is None
                        else:
                            assert isinstance(value, Encoded)
                            assert value.text == dumps(to_json_value(payload, warn=False))
