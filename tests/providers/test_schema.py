"""The strict-mode transformation of output schemas (OpenAI ``strict: true``)."""

from __future__ import annotations

from pydantic import BaseModel, TypeAdapter

from stepstone.providers._schema import strict_schema


class Address(BaseModel):
    city: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    nickname: str = ""
    home: Address


def test_every_property_required_and_objects_closed() -> None:  # guarantee 210
    schema = Person.model_json_schema()
    strict = strict_schema(schema)
    assert strict is not None
    assert strict["required"] == ["name", "nickname", "home"]
    assert strict["additionalProperties"] is False
    address = strict["$defs"]["Address"]
    assert address["required"] == ["city", "zip"] and address["additionalProperties"] is False
    assert "required" not in schema["$defs"]["Address"] or schema["$defs"]["Address"][
        "required"
    ] == ["city"]  # the caller's schema is not modified
    # a strict answer still validates against the model
    assert (
        Person.model_validate(
            {"name": "Ada", "nickname": "", "home": {"city": "London", "zip": None}}
        ).home.city
        == "London"
    )


def test_schemas_strict_mode_cannot_express_are_sent_non_strict() -> None:
    # guarantee 410
    assert strict_schema(TypeAdapter(dict[str, float]).json_schema()) is None
    assert strict_schema(TypeAdapter(list[int]).json_schema()) is None  # root must be an object
