"""Tool schemas from type hints and docstrings (Tool and the tool decorator)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from stepstone import Agent, LLMEngine, Tool, tool
from stepstone.testing import FakeModel, call


class Address(BaseModel):
    street: str
    city: str


async def ship(
    order_id: int,
    address: Address,
    speed: Literal["standard", "express"] = "standard",
    title: str | None = None,
) -> str:
    """Ship an order.

    Args:
        order_id: The order number.
        address: Where to send it.
        speed: Delivery speed.
        title: A property literally named "title" must survive.
    """
    return f"{order_id} to {address.city} ({speed})"


def test_schema_from_hints_docstring_and_nested_models() -> None:
    t = Tool.from_function(ship)
    assert t.description == "Ship an order."
    params = t.parameters
    assert params["required"] == ["order_id", "address"]
    props = params["properties"]
    assert set(props) == {"order_id", "address", "speed", "title"}
    assert props["order_id"] == {"type": "integer", "description": "The order number."}
    assert props["speed"]["enum"] == ["standard", "express"]
    assert props["speed"]["default"] == "standard"
    assert "title" not in props["order_id"]  # auto titles are dropped
    address_schema = params["$defs"]["Address"]
    assert "title" not in address_schema["properties"]["street"]
    assert t.is_async


async def test_nested_model_arguments_are_validated_into_models() -> None:
    model = FakeModel(
        [call("ship", order_id="12", address={"street": "1 Main", "city": "Oslo"}), "sent"]
    )
    env = await Agent(engine=LLMEngine(model), tools=[ship]).run("ship it")
    assert env.payload == "sent"
    result = model.requests[1].messages[-1].tool_results[0]
    assert (result.content, result.is_error) == ("12 to Oslo (standard)", False)


def test_decorator_and_overrides() -> None:
    @tool(name="sum2", description="Sum two numbers.")
    def add(a: float, b: float = 0.0) -> float:
        return a + b

    assert isinstance(add, Tool)
    assert (add.name, add.description) == ("sum2", "Sum two numbers.")
    assert add.parameters["required"] == ["a"]


async def test_agent_tool_requires_task() -> None:
    inner = Agent(engine=LLMEngine(FakeModel(["x"])), name="helper")
    model = FakeModel([call("helper"), "done"])
    env = await Agent(engine=LLMEngine(model), tools=[inner]).run("q")
    assert env.payload == "done"
    result = model.requests[1].messages[-1].tool_results[0]
    assert result.is_error and "missing required argument(s) ['task']" in result.content


def rest_style(city: str, days: int = 1) -> str:
    """Forecast for a city.
    :param city: The city name,
        as written locally.
    :param days: How many days ahead.
    """
    return city


def numpy_style(city: str) -> str:
    """Forecast for a city.

    Parameters
    ----------
    city : str
        The city name.
    """
    return city


def test_docstring_styles_besides_google() -> None:  # guarantee 217
    rest = Tool.from_function(rest_style)
    assert rest.description == "Forecast for a city."
    props = rest.parameters["properties"]
    assert props["city"]["description"] == "The city name, as written locally."
    assert props["days"]["description"] == "How many days ahead."
    numpy = Tool.from_function(numpy_style)
    assert numpy.description == "Forecast for a city."
    assert numpy.parameters["properties"]["city"]["description"] == "The city name."
