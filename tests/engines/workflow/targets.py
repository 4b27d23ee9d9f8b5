"""Workflows the worker tests submit by import path (``tests.engines.workflow.targets:...``).

Each step appends ``<label> <pid>`` to the log file named in its arguments (fsynced), so a
test counts how often each step ran and in which process.
"""

from __future__ import annotations

import os
import signal
import time

import stepstone
from stepstone import step, workflow


def _append(log: str, label: str) -> None:
    with open(log, "a", encoding="ascii") as fh:
        fh.write(f"{label} {os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())


@step
def logged(log: str, label: str, pause: float) -> str:
    time.sleep(pause)
    _append(log, label)
    return label


@workflow
async def batch(log: str, n: int, pause: float = 0.0) -> list[str]:
    return [await logged(log, f"s{i}", pause) for i in range(n)]


@step
def explode(log: str) -> str:
    _append(log, "explode")
    raise LookupError("the warehouse has no such item")


@workflow
async def broken(log: str) -> str:
    return await explode(log)


@step
def die_once(log: str) -> str:
    marker = log + ".died"
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    _append(log, "die_once")
    return f"survived {stepstone.step_context().attempt}"


@workflow
async def dies_once(log: str) -> list[str]:
    first = await logged(log, "before", 0.0)
    return [first, await die_once(log), await logged(log, "after", 0.0)]


def counts(log: str) -> dict[str, list[int]]:
    """The pids that ran each label, in order."""
    out: dict[str, list[int]] = {}
    if not os.path.exists(log):
        return out
    with open(log, encoding="ascii") as fh:
        for line in fh:
            label, pid = line.split()
            out.setdefault(label, []).append(int(pid))
    return out
