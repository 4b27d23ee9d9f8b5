"""Targets the time-and-messages tests queue by import path (``tests.messages.targets:...``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from stepstone import Plan, RunParked, Step


def _noted(payload: Any) -> str:
    return f"ran on {payload!r}"


noop_plan = Plan(Step(_noted, name="noted"))


def _wait_once(payload: Any) -> str:
    """Parks its run the first time (until ``wake_in`` seconds from now), then returns."""
    cfg = json.loads(payload) if isinstance(payload, str) else dict(payload)
    marker = Path(cfg["marker"])
    if not marker.exists():
        marker.write_text("parked")
        raise RunParked(cfg["key"], time.time() + float(cfg["wake_in"]))
    return "woke"


parking_plan = Plan(Step(_wait_once, name="wait"))
