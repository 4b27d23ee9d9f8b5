"""Envelope, sentinels, JSON codec and signed pickle."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from stepstone import (
    Envelope,
    ErrorInfo,
    PlanPaused,
    SerializationError,
    SignedPickle,
    UnserializableValueWarning,
    from_parallel,
    from_parallel_all,
    from_prev,
    from_start,
    from_step,
)
from stepstone.core import Sentinel
from stepstone.core._serialization import (
    dumps,
    from_typed_json,
    json_equal,
    loads,
    to_json_value,
    to_typed_json,
    untag,
)
from stepstone.exceptions import ConcurrentPlanRunError, MissingExtraError, PlanCompileError


class Item(BaseModel):
    name: str
    qty: int


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values)
def test_json_values_round_trip(value: Any) -> None:
    assert loads(dumps(to_json_value(value))) == value
    assert from_typed_json(loads(dumps(to_typed_json(value)))) == value
    assert json_equal(value, loads(dumps(value)))


@given(st.text(), st.integers())
def test_models_round_trip_typed(name: str, qty: int) -> None:
    item = Item(name=name, qty=qty)
    typed = loads(dumps(to_typed_json({"x": [item]})))
    assert from_typed_json(typed) == {"x": [item]}
    assert untag(typed) == {"x": [{"name": name, "qty": qty}]}
    assert to_json_value(item) == {"name": name, "qty": qty}


def test_unjsonable_values_warn_with_path_or_raise_when_strict() -> None:
    value = {"rows": [1, {"fh": object()}]}
    with pytest.warns(UnserializableValueWarning, match=r"out\['rows'\]\[1\]\['fh'\]"):
        out = to_json_value(value, where="out")
    assert isinstance(out["rows"][1]["fh"], str)
    with pytest.raises(SerializationError, match=r"out\['rows'\]\[1\]\['fh'\] is a object"):
        to_json_value(value, where="out", strict=True)
    with pytest.warns(UnserializableValueWarning):
        assert to_json_value(float("nan")) == "nan"


def test_envelope_basics() -> None:
    env = Envelope.from_task("summarise", context="q3")
    assert (env.task, env.payload, env.context, env.ok) == ("summarise", "summarise", "q3", True)
    assert Envelope(payload=Item(name="a", qty=1)).text() == '{"name":"a","qty":1}'
    assert Envelope(payload={"a": 1}).text() == '{"a": 1}'
    assert Envelope().text() == ""
    err = Envelope.error_envelope(ValueError("bad"))
    assert not err.ok and err.error == ErrorInfo(type="ValueError", message="bad", retryable=False)
    paused = Envelope.error_envelope(PlanPaused("later"))
    assert paused.error == ErrorInfo(type="PlanPaused", message="later", retryable=True)
    back = Envelope.from_dict(
        Envelope(task="t", payload=Item(name="b", qty=2), metadata={"k": 1}, error=None).to_dict()
    )
    assert back.payload == Item(name="b", qty=2) and back.metadata == {"k": 1}


def test_sentinels() -> None:
    assert repr(from_prev) == "from_prev" and repr(from_step("a")) == "from_step('a')"
    for s in (from_prev, from_start, from_step("a"), from_parallel("b"), from_parallel_all("c")):
        assert Sentinel.from_dict(s.to_dict()) == s
    with pytest.raises(TypeError, match="from_step"):
        from_step("")
    with pytest.raises(ValueError, match="unknown sentinel"):
        Sentinel.from_dict({"sentinel": "sideways"})


def test_signed_pickle_refuses_unsigned_and_tampered() -> None:
    codec = SignedPickle(key="k" * 32)
    blob = codec.dumps({"state": [1, 2]})
    assert codec.loads(blob) == {"state": [1, 2]}
    with pytest.raises(SerializationError, match="unsigned"):
        codec.loads(pickle.dumps({"state": [1, 2]}))
    tampered = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    with pytest.raises(SerializationError, match="does not match"):
        codec.loads(tampered)
    with pytest.raises(SerializationError, match="does not match"):
        SignedPickle(key="z" * 32).loads(blob)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SignedPickle(key="short")


def test_errors_pickle_and_have_the_right_bases() -> None:
    for exc in (
        MissingExtraError("psycopg", "postgres"),
        ConcurrentPlanRunError("k busy"),
        PlanCompileError("bad plan"),
    ):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
    assert "pip install stepstone[postgres]" in str(MissingExtraError("psycopg", "postgres"))
    assert issubclass(ConcurrentPlanRunError, RuntimeError)
    assert not issubclass(PlanCompileError, ValueError)
