"""An LLM loop journals its turns the same way wherever it runs: alone (``Runner``), in a
durable Plan step, in a node of a durable graph or in a workflow's body."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Runner, RunnerConfig, Step, Store, tool, workflow
from stepstone.durable._journal_format import ENTRIES_KIND
from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer
from stepstone.providers import ModelRequest
from stepstone.testing import FunctionModel, Reply, call


class Answer(State):
    """The graph's state."""

    answer: str = ""


def _agent(turns: int) -> Agent:
    """An agent that runs one tool returning 200 bytes a turn for ``turns`` turns."""

    @tool
    async def lookup(n: int) -> str:
        """Look a number up."""
        return "r" * 200

    def script(request: ModelRequest) -> Any:
        if request.turn < turns:
            return Reply(tool_calls=[call("lookup", n=request.turn)])
        return "done"

    return Agent(name="looker", model=FunctionModel(script), tools=[lookup], max_turns=turns + 2)


async def _run(where: str, store: Store, turns: int) -> None:
    agent = _agent(turns)
    if where == "runner":
        config = RunnerConfig(checkpoint_async_writes=False)
        result = await Runner(store=store, config=config).run(agent, user_message="go", run_id="r")
        assert result.state == "completed", result.error
    elif where == "plan":
        plan = Plan(Step(agent, task="go"), store=store, checkpoint_key="p")
        env = await Agent(engine=plan).run("go")
        assert env.ok, env.error
    elif where == "graph":

        async def ask(state: Answer) -> dict[str, Any]:
            env = await agent.run("go")
            assert env.ok, env.error
            return {"answer": env.payload}

        graph = (
            GraphBuilder(Answer)
            .add_node("ask", ask)
            .add_edge("ask", END)
            .set_entry("ask")
            .with_checkpointer(StoreCheckpointer(store))
            .compile()
        )
        out = await graph.ainvoke(Answer(), correlation_id="g")
        assert out.answer == "done"
    else:

        @workflow
        async def asks() -> str:
            env = await agent.run("go")
            assert env.ok, env.error
            return str(env.payload)

        assert await asks.using(store=store, key="w").run() == "done"


def _loop_rows(store: Store) -> list[Any]:
    """The journal rows of the one agent loop run in ``store``."""
    loops = [h.key for h in store.backend.run_list(None) if h.kind == "agent"]
    assert len(loops) == 1, loops
    return store.backend.run_journal(loops[0])


async def _per_turn(tmp_path: Path, where: str) -> tuple[int, float]:
    """Rows and journal bytes a turn costs in ``where``: those of a 25-turn loop less
    those of a 5-turn one, per turn."""
    rows: dict[int, list[Any]] = {}
    for turns in (5, 25):
        with Store(db=tmp_path / f"{where}-{turns}.sqlite") as store:
            await _run(where, store, turns)
            rows[turns] = _loop_rows(store)
    assert {row.kind for r in rows.values() for row in r} == {ENTRIES_KIND}
    grew = sum(len(r.data) for r in rows[25]) - sum(len(r.data) for r in rows[5])
    return len(rows[25]) - len(rows[5]), grew / 20


@pytest.mark.parametrize("where", ["plan", "graph", "workflow"])
async def test_an_llm_loop_commits_two_entries_rows_a_turn_wherever_it_runs(
    tmp_path: Path, where: str
) -> None:
    # guarantee 454
    rows, grew = await _per_turn(tmp_path, where)
    alone_rows, alone = await _per_turn(tmp_path, "runner")
    assert rows == alone_rows == 2 * 20  # twenty more turns: forty more rows
    assert alone <= 2000, alone  # ~1.5 KB a turn
    assert abs(grew - alone) <= 0.01 * alone, (grew, alone)  # (times may take a digit more)
