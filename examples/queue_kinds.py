"""A graph and a replanning agent through the work queue, then the queue pruned.

    python examples/queue_kinds.py

Both are submitted with the same API as a Plan (``graph.submit(state, ...)``,
``agent.submit(task, ...)``) to a SQLite queue in a temporary directory, run by a worker
until the queue is idle, and read back through their handles. ``prune_queue`` then
deletes the finished entries, which frees their dedupe keys.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from stepstone import (
    Agent,
    PlanRound,
    ReplanEngine,
    ReplanTask,
    Store,
    Tool,
    Worker,
    prune_queue,
)
from stepstone.graph import END, GraphBuilder, State


class Claim(State):
    """An insurance claim moving through the graph."""

    claim_id: str = ""
    amount: int = 0
    decision: str = ""


def assess(state: Claim) -> dict[str, Any]:
    return {"amount": state.amount + 50}  # handling fee


def decide(state: Claim) -> dict[str, Any]:
    return {"decision": "approve" if state.amount < 1000 else "review"}


graph = (
    GraphBuilder(Claim)
    .add_node("assess", assess)
    .add_node("decide", decide)
    .add_edge("assess", "decide")
    .add_edge("decide", END)
    .set_entry("assess")
    .compile()
)


def lookup(claim_id: str) -> dict[str, Any]:
    """Look a claim up."""
    return {"claim_id": claim_id, "amount": 420}


def planner(task: str, history: list[dict[str, Any]], round: int) -> PlanRound:
    if round == 1:
        return PlanRound(
            reasoning="look the claim up first",
            tasks=[ReplanTask(tool="lookup", kwargs={"claim_id": "c-7"})],
        )
    amount = history[-1]["tasks"][0]["result"]["amount"]
    return PlanRound(reasoning="enough", done=True, final_answer=f"claim c-7: {amount} EUR")


agent = Agent(engine=ReplanEngine(), tools=[Tool.from_function(planner, name="planner"), lookup])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, Store(db=Path(tmp) / "queue.sqlite") as store:
        graph_run = graph.submit(Claim(claim_id="c-1", amount=700), store=store, queue="claims")
        agent_run = agent.submit("what is claim c-7 worth?", store=store, queue="claims")
        Worker(store, queues=["claims"], poll_interval=0.05).run(until_idle=True)
        print("graph:", graph_run.result(timeout=30).payload)
        print("agent:", agent_run.result(timeout=30).payload)
        print("pruned:", prune_queue(store, 0))


if __name__ == "__main__":
    main()
