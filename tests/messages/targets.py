"""Targets the time-and-messages tests queue by import path (``tests.messages.targets:...``)."""

from __future__ import annotations

from typing import Any

from stepstone import Plan, Step


def _noted(payload: Any) -> str:
    return f"ran on {payload!r}"


noop_plan = Plan(Step(_noted, name="noted"))
