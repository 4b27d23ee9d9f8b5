"""The type-tagged JSON encoding round-trips through real JSON text; its plain form is what
to_json_value gives; version 1 data keeps loading."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from typing import Any

import pytest

from stepstone.core._serialization import (
    ENCODING_VERSION,
    compact_encoder,
    dumps,
    from_typed_json,
    to_json_value,
    to_typed_json,
    untag,
)
from stepstone.exceptions import SerializationError, UnserializableValueWarning
from tests.engines.plan.test_resume_values import Label, rich_value, same


def round_trip(value: Any) -> Any:
    return from_typed_json(json.loads(dumps(to_typed_json(value))))


def test_rich_values_round_trip_with_their_types() -> None:
    # guarantee 124
    value = rich_value()
    value.pop("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = round_trip(value)
    same(value, back)
    assert math.isinf(round_trip(float("-inf"))) and math.isnan(round_trip(float("nan")))


def test_plain_form_equals_to_json_value_and_has_no_tags() -> None:
    # guarantee 125
    value = rich_value()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnserializableValueWarning)
        plain = to_json_value(value)
        assert untag(json.loads(dumps(to_typed_json(value)))) == plain
    text = dumps(plain)
    assert '"cls"' not in text and '$stepstone": "' not in text.replace(
        '"$stepstone":"datetime","v":"not a tag: user data"', ""
    )


def test_user_dicts_that_look_like_tags_stay_user_data() -> None:
    # guarantee 125
    tricky = {"$stepstone": "bytes", "v": "AAA="}
    assert round_trip(tricky) == tricky
    assert round_trip({"$stepstone_model": "x:Y", "data": 1}) == {
        "$stepstone_model": "x:Y",
        "data": 1,
    }


def test_unimportable_classes_load_as_their_data() -> None:
    # guarantee 124
    data = to_typed_json(Label(name="n", score=1.0))
    data["cls"] = "no_such_module:Label"
    assert from_typed_json(data) == {"name": "n", "score": 1.0}
    unknown = {"$stepstone": "from-the-future", "v": [1, 2]}
    assert from_typed_json(unknown) == [1, 2]


def test_version_1_data_loads_and_models_come_back() -> None:
    # guarantee 127
    v1 = {
        "m": {
            "$stepstone_model": "tests.engines.plan.test_resume_values:Label",
            "data": {"name": "a", "score": 2},
        },
        "when": "2026-01-01T00:00:00",
        "$stepstone": "x",
        "v": 1,
    }
    back = from_typed_json(v1, version=1)
    assert back["m"] == Label(name="a", score=2.0) and back["when"] == "2026-01-01T00:00:00"
    assert back["$stepstone"] == "x"  # no version-2 decoding of version-1 data
    assert ENCODING_VERSION == 2


class Opaque:
    pass


@dataclasses.dataclass
class Box:
    x: Any


def test_other_values_warn_or_raise_naming_where() -> None:
    # guarantee 126
    with pytest.warns(UnserializableValueWarning, match=r"out\['a'\]\[1\]\.x is a Opaque"):
        to_typed_json({"a": [0, Box(Opaque())]}, where="out")
    with pytest.raises(SerializationError, match=r"out key .* is a Opaque"):
        to_typed_json({Opaque(): 1}, where="out", strict=True)


@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("allow_nan", [True, False])
def test_the_compact_encoder_writes_what_json_writes(ensure_ascii: bool, allow_nan: bool) -> None:
    # The encoder behind dumps and the SQL stores' head meta builds its C encoder once; its
    # text must stay byte for byte the standard library's, error for error.
    fast = compact_encoder(ensure_ascii=ensure_ascii, allow_nan=allow_nan)
    plain = json.JSONEncoder(
        ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=allow_nan
    ).encode
    values: list[Any] = [
        None,
        True,
        0,
        -7,
        2**70,
        1.5,
        1e300,
        -0.0,
        "",
        "x" * 1000,
        'é ☃ \udcff \x00 " \\',
        [],
        {},
        [1, [2, [3, {"a": None}]]],
        {"k": {"é": [1.25, "v", False]}, "2": 3},
        {1: "a", 2.5: "b", False: "c", None: "d"},
    ]
    for value in values:
        assert fast(value) == plain(value)
    for bad in (float("nan"), [float("inf")], {"x": -math.inf}):
        if allow_nan:
            assert fast(bad) == plain(bad)
        else:
            with pytest.raises(ValueError):
                plain(bad)
            with pytest.raises(ValueError):
                fast(bad)
    for odd in (object(), {"k": {1, 2}}, [b"bytes"]):
        with pytest.raises(TypeError, match="is not JSON serializable"):
            fast(odd)
