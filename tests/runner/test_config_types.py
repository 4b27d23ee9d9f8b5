"""RunnerConfig refuses options of the wrong type when it is built, naming the option, the
value and the fix (a flag given as text would otherwise read as True)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stepstone import ConfigurationError, ConfigurationTypeError, RunnerConfig


@pytest.mark.parametrize(
    ("option", "value", "fix"),
    [
        ("checkpoint_async_writes", "no", "RunnerConfig(checkpoint_async_writes=False)"),
        ("checkpoint_async_writes", "yes", "RunnerConfig(checkpoint_async_writes=True)"),
        ("checkpoint_async_writes", 0, "RunnerConfig(checkpoint_async_writes=False)"),
        ("checkpoint_async_writes", None, "True or False"),
        ("checkpoint_coalesce_runtime_state", "false", "coalesce_runtime_state=False)"),
    ],
)
def test_a_flag_must_be_a_bool(option: str, value: Any, fix: str) -> None:
    # guarantee 220
    with pytest.raises(ConfigurationTypeError) as info:
        RunnerConfig(**{option: value})
    message = str(info.value)
    assert message.startswith(f"RunnerConfig({option}=...) must be True or False, got {value!r}")
    assert fix in message
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("option", "value", "fix"),
    [
        ("checkpoint_flush_timeout_s", "5", "RunnerConfig(checkpoint_flush_timeout_s=5)"),
        ("checkpoint_flush_timeout_s", "2.5", "RunnerConfig(checkpoint_flush_timeout_s=2.5)"),
        ("checkpoint_flush_timeout_s", None, "RunnerConfig(checkpoint_flush_timeout_s=10.0)"),
        ("checkpoint_flush_timeout_s", True, "RunnerConfig(checkpoint_flush_timeout_s=10.0)"),
        ("checkpoint_queue_maxsize", "100", "RunnerConfig(checkpoint_queue_maxsize=100)"),
        ("checkpoint_queue_maxsize", 10.0, "RunnerConfig(checkpoint_queue_maxsize=1024)"),
        ("checkpoint_flush_interval_s", "0.1", "RunnerConfig(checkpoint_flush_interval_s=0.1)"),
    ],
)
def test_a_number_given_as_text_or_of_the_wrong_kind(option: str, value: Any, fix: str) -> None:
    # guarantee 220
    with pytest.raises(ConfigurationTypeError) as info:
        RunnerConfig(**{option: value})
    message = str(info.value)
    what = "an int" if option == "checkpoint_queue_maxsize" else "a number"
    assert message.startswith(f"RunnerConfig({option}=...) must be {what}, got {value!r}")
    assert f"pass the number itself, e.g. {fix}" in message


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("checkpoint_flush_timeout_s", 0, "> 0"),
        ("checkpoint_flush_timeout_s", math.nan, "> 0"),
        ("checkpoint_queue_maxsize", 0, ">= 1"),
        ("checkpoint_flush_interval_s", -1, ">= 0"),
        ("checkpoint_flush_interval_s", math.nan, ">= 0"),
    ],
)
def test_a_number_out_of_range(option: str, value: Any, bound: str) -> None:
    # guarantee 220
    with pytest.raises(ConfigurationError, match=rf"must be {bound}, got {value!r}") as info:
        RunnerConfig(**{option: value})
    assert not isinstance(info.value, TypeError)


def test_numbers_and_flags_of_the_right_kind_are_kept() -> None:
    # guarantee 220
    config = RunnerConfig(
        checkpoint_async_writes=False,
        checkpoint_coalesce_runtime_state=False,
        checkpoint_flush_timeout_s=3,
        checkpoint_queue_maxsize=8,
        checkpoint_flush_interval_s=0,
    )
    assert config.checkpoint_flush_timeout_s == 3 and config.checkpoint_queue_maxsize == 8
    assert RunnerConfig(checkpoint_flush_timeout_s=math.inf).checkpoint_flush_timeout_s == math.inf
