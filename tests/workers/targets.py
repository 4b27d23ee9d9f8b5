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

from stepstone import Agent, LLMEngine, Plan, PlanRound, ReplanEngine, ReplanTask, Step, Tool
from stepstone.graph import END, GraphBuilder, State
from stepstone.providers import OpenAIProvider

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


def _flaky(payload: Any) -> dict[str, Any]:
    """Fails while the file ``<log>.down`` exists (a dependency that is down)."""
    cfg = _config(payload)
    if os.path.exists(cfg["log"] + ".down"):
        raise ConnectionError("the warehouse is down")
    return cfg


def _die(payload: Any) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def _padded(i: int) -> Any:
    """A logged step whose output carries 64 KB, so a run's commits grow the store file."""
    logged = _logged(i)

    def step(payload: Any) -> dict[str, Any]:
        return {**logged(payload), "pad": "x" * 65536}

    step.__name__ = f"s{i:02d}"
    return step


def _gated(payload: Any) -> dict[str, Any]:
    """Creates ``<log>.started``, then waits (up to a minute) for ``<log>.go``."""
    cfg = _config(payload)
    open(cfg["log"] + ".started", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(cfg["log"] + ".go") and time.monotonic() < deadline:
        time.sleep(0.02)
    return _logged(1)(payload)


plan = Plan(*[Step(_logged(i)) for i in range(STEPS)], max_iterations=STEPS + 1)
gated_plan = Plan(Step(_logged(0)), Step(_gated, name="gated"))
big_plan = Plan(*[Step(_padded(i)) for i in range(STEPS)], max_iterations=STEPS + 1)
long_plan = Plan(*[Step(_logged(i)) for i in range(40)], max_iterations=41)
failing_plan = Plan(Step(_logged(0)), Step(_boom, name="boom"), Step(_logged(2)))
flaky_plan = Plan(Step(_logged(0)), Step(_flaky, name="flaky"), Step(_logged(2)))
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


# -- other kinds of targets: a graph, an agent over a ReplanEngine, an LLM agent ----------
class Tally(State):
    """A graph's state: a log path, a run name and how far it got."""

    log: str = ""
    name: str = ""
    total: int = 0


def _graph_node(i: int) -> Any:
    def node(state: Tally) -> dict[str, Any]:
        _logged(i)({"log": state.log, "name": state.name})
        return {"total": state.total + i}

    node.__name__ = f"n{i}"
    return node


def _tally_graph() -> Any:
    builder = GraphBuilder(Tally)
    for i in range(3):
        builder = builder.add_node(f"n{i}", _graph_node(i))
        builder = builder.add_edge(f"n{i}", f"n{i + 1}" if i < 2 else END)
    return builder.set_entry("n0").compile()


graph = _tally_graph()


def _die_once(state: Tally) -> dict[str, Any]:
    """Kill this process the first time (a marker file beside the log remembers it)."""
    marker = state.log + ".died"
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    _logged(1)({"log": state.log, "name": state.name})
    return {"total": state.total + 1}


crash_graph = (
    GraphBuilder(Tally)
    .add_node("n0", _graph_node(0))
    .add_node("n1", _die_once)
    .add_node("n2", _graph_node(2))
    .add_edge("n0", "n1")
    .add_edge("n1", "n2")
    .add_edge("n2", END)
    .set_entry("n0")
    .compile()
)


def _replan_planner(task: str, history: list[dict[str, Any]], round: int) -> PlanRound:
    if round == 1:
        return PlanRound(
            reasoning="count", tasks=[ReplanTask(tool="shout", kwargs={"text": "queued"})]
        )
    return PlanRound(
        reasoning="done", done=True, final_answer=f"{history[-1]['tasks'][0]['result']}!"
    )


replan_agent = Agent(
    engine=ReplanEngine(), tools=[Tool.from_function(_replan_planner, name="planner"), shout]
)

#: The loopback server's OpenAI base URL, set by the test that queues ``llm_agent``.
LOOPBACK_URL = os.environ.get("STEPSTONE_TEST_LOOPBACK_URL", "")


def llm_agent() -> Agent:
    """A factory target: an LLM agent talking to the test's loopback server."""
    provider = OpenAIProvider(api_key="test", base_url=LOOPBACK_URL)
    return Agent(
        name="support",
        engine=LLMEngine("gpt-4o-mini", provider=provider, max_retries=0),
        tools=[shout],
    )
