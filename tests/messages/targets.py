"""Targets the time-and-messages tests queue by import path (``tests.messages.targets:...``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import stepstone
from stepstone import Plan, RunParked, Step, step, workflow


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


# -- workflows, Plans and graphs that wait, receive and write (tests/messages) -------------
@step
async def noted(log: str, label: str) -> str:
    """A step that writes a stream value (carrying its attempt) and logs its label."""
    await stepstone.write_stream("steps", label)
    with open(log, "a", encoding="ascii") as fh:
        fh.write(label + "\n")
    return label


@workflow
async def approval(log: str, wait: float, reminder: float) -> str:
    """Asks for an approval, reminds once, and gives up after a second wait."""
    stepstone.set_event("stage", "asked")
    await noted(log, "asked")
    answer = await stepstone.recv("approval", timeout=wait)
    if answer is None:
        stepstone.set_event("stage", "reminded")
        await noted(log, "reminded")
        answer = await stepstone.recv("approval", timeout=reminder)
    if answer is None:
        stepstone.set_event("stage", "expired")
        return "expired"
    stepstone.set_event("stage", "answered")
    return f"approved by {answer['by']}" if answer["ok"] else "refused"


@step(name="now")
def now() -> float:
    return time.time()


@workflow
async def napper(seconds: float) -> float:
    """Sleeps durably; returns how long after its start (journaled) it woke."""
    start = await now()
    await stepstone.sleep(seconds)
    return time.time() - start


@workflow
async def writer(n: int, pause: float) -> int:
    """Writes ``n`` numbered values to the stream ``numbers`` from its body."""
    for i in range(n):
        await stepstone.write_stream("numbers", i)
        if pause:
            await asyncio.sleep(pause)
    return n


@workflow
async def inbox(count: int) -> list[object]:
    """Receives ``count`` messages on ``in``, in order."""
    return [await stepstone.recv("in") for _ in range(count)]


async def _waiting_step(payload: Any) -> str:
    stepstone.set_event("step", "started")
    await stepstone.write_stream("progress", "before")
    answer = await stepstone.recv("go", timeout=30)
    await stepstone.sleep(0.2)
    await stepstone.write_stream("progress", "after")
    return f"go={answer}"


waiting_plan = Plan(Step(_noted, name="first"), Step(_waiting_step, name="wait"))


@workflow
async def greet(name: str, punct: str = "!") -> str:
    """A scheduled workflow's arguments come with every run."""
    return f"hello {name}{punct}"
