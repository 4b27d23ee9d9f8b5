"""Sync step, node and tool functions that wrap an async library with
``asyncio.get_event_loop().run_until_complete(...)`` (pydantic-ai's ``Agent.run_sync``
does) work wherever they run: inline on a sync call's loop, on the loop's thread once
proven quick, in a worker thread, in a graph node, as a tool (guarantee 408)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Tool
from stepstone.graph import END, GraphBuilder, State
from stepstone.testing import FunctionModel, call


async def _fetch(ticker: str) -> str:
    await asyncio.sleep(0)  # an async client's request
    return f"{ticker}: 101.5"


def two_lines(ticker: str) -> str:
    """The sync wrapper a library builds on the thread's event loop."""
    loop = asyncio.get_event_loop()
    return loop.run_until_complete(_fetch(ticker))


def _pydantic_ai_step() -> Any:
    import pydantic_ai  # the dev extra installs it
    from pydantic_ai.models.test import TestModel

    agent = pydantic_ai.Agent(TestModel(custom_output_text="summary of"))

    def summarize(text: str) -> str:
        return f"{agent.run_sync(text).output} {text}"

    return summarize


@pytest.fixture(params=["two_lines", "pydantic_ai"])
def wrapper(request: pytest.FixtureRequest) -> Any:
    return two_lines if request.param == "two_lines" else _pydantic_ai_step()


def _expected(wrapper: Any, value: str) -> str:
    return f"{value}: 101.5" if wrapper is two_lines else f"summary of {value}"


def test_a_step_on_the_calling_thread(wrapper: Any) -> None:
    # guarantee 408: before, "This event loop is already running"
    env = Agent(engine=Plan(Step(wrapper, name="s")))("ACME")
    assert env.ok, env.error
    assert env.payload == _expected(wrapper, "ACME")


def test_steps_in_worker_threads_and_on_a_shared_loop(wrapper: Any) -> None:
    # guarantee 408: run_many shares the loop, so the steps go to worker threads, and to
    # the loop's thread once they prove quick
    names = [f"T{i}" for i in range(12)]
    results = Plan(Step(wrapper, name="s")).run_many(names, concurrency=4)
    assert [r.payload for r in results] == [_expected(wrapper, n) for n in names]


def test_a_band_of_steps(wrapper: Any) -> None:
    # guarantee 408
    plan = Plan(
        Step(wrapper, name="a", parallel=True),
        Step(wrapper, name="b", parallel=True),
    )
    env = Agent(engine=plan)("ACME")
    assert env.ok, env.error
    assert env.payload == {"a": _expected(wrapper, "ACME"), "b": _expected(wrapper, "ACME")}


def test_a_step_of_a_run_awaited_on_your_own_loop(wrapper: Any) -> None:
    # guarantee 408: the loop's default executor runs the step, as asyncio.to_thread would
    async def main() -> list[Any]:
        plan = Plan(Step(wrapper, name="s"))
        return await asyncio.gather(*(Agent(engine=plan).run(t) for t in ("A", "B")))

    envs = asyncio.run(main())
    assert [e.payload for e in envs] == [_expected(wrapper, "A"), _expected(wrapper, "B")]


class Quote(State):
    ticker: str
    quote: str = ""


def test_a_graph_node(wrapper: Any) -> None:
    # guarantee 408
    def node(state: Quote) -> dict[str, str]:
        return {"quote": wrapper(state.ticker)}

    graph = GraphBuilder(Quote).add_node("q", node).add_edge("q", END).set_entry("q").compile()
    assert graph.invoke(Quote(ticker="ACME")).quote == _expected(wrapper, "ACME")


def test_a_sync_tool_of_an_llm_agent(wrapper: Any) -> None:
    # guarantee 408
    replies = {0: call("look", ticker="ACME"), 1: "done"}
    seen: list[str] = []

    def look(ticker: str) -> str:
        """Look a ticker up."""
        seen.append(wrapper(ticker))
        return seen[-1]

    agent = Agent(model=FunctionModel(lambda r: replies[r.turn]), tools=[Tool.from_function(look)])
    assert agent("go").payload == "done"
    assert seen == [_expected(wrapper, "ACME")]


def _fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts /proc/self/fd")
def test_the_thread_keeps_its_loops_to_itself_and_closes_them() -> None:
    # guarantee 408: outside the step the thread's current loop is as it was; the idle loop
    # the step saw is closed when the thread ends
    seen: dict[str, Any] = {}

    def step(ticker: str) -> str:
        seen["loop"] = asyncio.get_event_loop()
        seen["running"] = seen["loop"].is_running()
        return two_lines(ticker)

    def work() -> None:
        assert Agent(engine=Plan(Step(step)))("ACME").ok
        with pytest.raises(RuntimeError, match="no current event loop"):
            asyncio.get_event_loop()  # none set in this thread, as before the call

    before = _fds()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen["running"] is False and seen["loop"].is_closed()
    assert _fds() == before


def test_a_forked_child_leaves_its_parents_idle_loop_alone() -> None:
    # guarantee 408: the child's copy shares the epoll instance and self-pipe; closing it
    # the usual way would leave the parent's idle loop deaf to its threads' results
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        from stepstone import Agent, Plan, Step

        async def hop(x):
            return await asyncio.to_thread(lambda: x + "!")  # wakes the loop by its self-pipe

        def wraps(x):
            return asyncio.get_event_loop().run_until_complete(hop(x))

        agent = Agent(engine=Plan(Step(wraps)))
        assert agent("a").payload == "a!"
        pid = os.fork()
        if pid == 0:
            code = 0 if agent("b").payload == "b!" else 3
            sys.stdout.flush()
            sys.exit(code)
        _, status = os.waitpid(pid, 0)
        for i in range(40):  # would hang had the child unregistered the self-pipe
            assert agent(str(i)).payload == f"{i}!"
        print("child exit", os.waitstatus_to_exitcode(status), "parent ok", flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-W", "ignore::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == ["child exit 0 parent ok"]
