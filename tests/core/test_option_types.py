"""Options of the wrong type are refused where they are given, naming the option, the value
and the fix: ``tool(...)`` and ``Tool``."""

from __future__ import annotations

from typing import Any

import pytest

from stepstone import ConfigurationError, ConfigurationTypeError, Tool, tool


def lookup(order: str) -> str:
    """Look an order up."""
    return order


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("yes", "requires_approval=True"),
        ("no", "requires_approval=False"),
        (0, "=False"),
        (1, "=True"),
        (None, "True or False"),
        ([True], "True or False"),
    ],
)
def test_requires_approval_must_be_a_bool(value: Any, fix: str) -> None:
    # guarantee 221
    with pytest.raises(ConfigurationTypeError) as info:
        tool(requires_approval=value)  # refused before any function is given
    message = str(info.value)
    assert "requires_approval must be True or False" in message
    assert repr(value) in message and fix in message
    with pytest.raises(ConfigurationTypeError, match="tool 'lookup': requires_approval must"):
        Tool.from_function(lookup, requires_approval=value)
    with pytest.raises(ConfigurationTypeError, match="tool 'x': requires_approval must"):
        Tool(name="x", requires_approval=value)
    assert tool(requires_approval=True)(lookup).requires_approval is True


@pytest.mark.parametrize(
    ("value", "error", "fix"),
    [
        ("maybe", ConfigurationError, "in_doubt='rerun' (the default)"),
        ("FAIL", ConfigurationError, "in_doubt='fail'"),
        (" ask", ConfigurationError, "in_doubt='ask'"),
        (None, ConfigurationTypeError, "pass one of them as text"),
        (True, ConfigurationTypeError, "pass one of them as text"),
    ],
)
def test_in_doubt_must_be_one_of_the_three_policies(
    value: Any, error: type[Exception], fix: str
) -> None:
    # guarantee 221
    with pytest.raises(error) as info:
        tool(in_doubt=value)
    message = str(info.value)
    assert type(info.value) is error and isinstance(info.value, ValueError)
    assert "in_doubt must be 'rerun', 'fail' or 'ask'" in message
    assert repr(value) in message and fix in message
    with pytest.raises(error, match="tool 'lookup': in_doubt must be"):
        Tool.from_function(lookup, in_doubt=value)


NAME = "name must be a non-empty str or None (the function's name), got "


@pytest.mark.parametrize(
    ("options", "error", "what"),
    [
        ({"name": 5}, ConfigurationTypeError, NAME + "5"),
        ({"name": " "}, ConfigurationError, NAME + "' '"),
        ({"description": 3}, ConfigurationTypeError, "description must be a str or None"),
    ],
)
def test_name_and_description_must_be_text(
    options: dict[str, Any], error: type[Exception], what: str
) -> None:
    # guarantee 221
    with pytest.raises(error) as info:
        tool(**options)
    assert str(info.value).startswith("tool(...): " + what)
    with pytest.raises(error, match=r"^Tool\.from_function\(\.\.\.\): "):
        Tool.from_function(lookup, **options)
    named = tool(name="find", description="Find an order.")(lookup)
    assert (named.name, named.description) == ("find", "Find an order.")
