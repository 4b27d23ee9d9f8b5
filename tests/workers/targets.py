"""Plans the worker tests submit by import path (``tests.workers.targets:<name>``).

The task is JSON: ``{"log": path, "name": run name, "sleep": seconds per step}``. Every
step appends ``"<name> <step> <pid>"`` to the log (fsynced) before it returns, so a test
can count how often each step of each run executed, and by which process.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from stepstone import Agent, Plan, Step

STEPS = 10


def _config(payload: Any) -> dict[str, Any]:
    return json.loads(payload) if isinstance(payload, str) else dict(payload)


def _logged(i: int) -> Any:
    def step(payload: Any) -> dict[str, Any]:
        cfg = _config(payload)
        time.sleep(float(cfg.get("sleep", 0.0)))
        with open(cfg["log"], "a", encoding="utf-8") as fh:
            fh.write(f"{cfg['name']} {i} {os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
        return cfg

    step.__name__ = f"s{i:02d}"
    return step


def _boom(payload: Any) -> dict[str, Any]:
    raise ValueError(f"bad input for run {_config(payload)['name']}")


def _die(payload: Any) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


plan = Plan(*[Step(_logged(i)) for i in range(STEPS)], max_iterations=STEPS + 1)
long_plan = Plan(*[Step(_logged(i)) for i in range(40)], max_iterations=41)
failing_plan = Plan(Step(_logged(0)), Step(_boom, name="boom"), Step(_logged(2)))
poison_plan = Plan(Step(_die, name="die"), Step(_logged(1)))
not_an_engine = 42


def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


tool_agent = Agent(engine=Plan(Step("shout")), tools=[shout])


def make_plan() -> Plan:
    """A factory target: the worker calls it to get the engine."""
    return Plan(Step(_logged(0)), Step(_logged(1)))


def task(log: str, name: str, sleep: float = 0.0) -> str:
    return json.dumps({"log": log, "name": name, "sleep": sleep})


def executions(log: str) -> dict[tuple[str, int], list[int]]:
    """``{(run name, step): [pid of each execution]}`` from a log."""
    out: dict[tuple[str, int], list[int]] = {}
    try:
        with open(log, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        name, step, pid = line.split()
        out.setdefault((name, int(step)), []).append(int(pid))
    return out
