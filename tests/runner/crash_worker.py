"""A durable agent run in its own process, for the SIGKILL crash tests.

Usage: crash_worker.py MODE STORE LOG  (MODE: runner | plan | graph; STORE: a SQLite path
or a postgresql:// URL). Every model call and every tool call appends a line to LOG
(``model <turn> <pid>``, ``start <call> <pid>``, ``done <call> <pid>``) with an fsync, so
the parent can kill the process at a chosen line and count side effects afterwards.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from stepstone import Agent, Plan, Runner, RunnerConfig, Step, Store, ToolContext, tool
from stepstone.graph import State
from stepstone.providers import ModelRequest
from stepstone.testing import FunctionModel, Reply, call

TURNS = 5


class Answer(State):
    """The graph's state."""

    answer: str = ""


RUN_ID = "crash-run"


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build(log: str) -> Agent:
    pid = os.getpid()

    @tool
    def effect(name: str, ctx: ToolContext) -> str:
        """Perform one side effect."""
        _log(log, f"start {name} {pid} {ctx.idempotency_key}")
        time.sleep(0.01)
        _log(log, f"done {name} {pid}")
        return f"ok {name}"

    def script(request: ModelRequest) -> Any:
        _log(log, f"model {request.turn} {pid}")
        if request.turn < TURNS:
            t = request.turn
            return Reply(tool_calls=[call("effect", name=f"t{t}a"), call("effect", name=f"t{t}b")])
        return "all done"

    return Agent(name="crashy", model=FunctionModel(script), tools=[effect])


async def main(mode: str, where: str, log: str) -> None:
    store = Store(url=where) if "://" in where else Store(db=where, lease_seconds=5)
    agent = build(log)
    if mode.startswith("runner"):
        config = RunnerConfig(checkpoint_async_writes=mode == "runner-async")
        runner = Runner(store=store, config=config)
        result = await runner.run(
            agent, user_message="do the effects", run_id=RUN_ID, thread_id="t"
        )
        assert result.state == "completed", result
        print("DONE", result.final_text, flush=True)
    elif mode == "plan":
        plan = Plan(
            Step(agent, task="do the effects"),
            store=store,
            checkpoint_key="crash-plan",
            resume=True,
        )
        env = await Agent(engine=plan).run("go")
        assert env.ok, env.error
        print("DONE", env.payload, flush=True)
    else:
        from stepstone.graph import END, CheckpointFilter, GraphBuilder, StoreCheckpointer

        cp = StoreCheckpointer(store)

        async def ask(state: Answer) -> dict[str, Any]:
            env = await agent.run("do the effects")
            assert env.ok, env.error
            return {"answer": env.payload}

        graph = (
            GraphBuilder(Answer)
            .add_node("ask", ask)
            .add_edge("ask", END)
            .set_entry("ask")
            .with_checkpointer(cp)
            .compile()
        )
        attempts = cp.list(CheckpointFilter(correlation_id="crash"))
        if not attempts:
            out = await graph.ainvoke(Answer(), correlation_id="crash")
        else:
            out = await graph.ainvoke(resume_invocation=attempts[-1].invocation_id)
        print("DONE", out.answer, flush=True)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
