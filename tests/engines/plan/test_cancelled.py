"""A cancelled Plan run reads `failed` with a RunCancelledError, and still resumes
(guarantee 608)."""

from __future__ import annotations

from pathlib import Path

from stepstone import Agent, Plan, PlanPaused, Step, Store
from stepstone.durable import cancel_run

ROOT = Path(__file__).resolve().parents[3]


def test_a_cancelled_run_is_failed_with_run_cancelled_error_and_resumes() -> None:
    # guarantee 608
    store = Store()
    ready: set[str] = set()

    def hold(order: str) -> str:
        if order not in ready:
            raise PlanPaused("waiting for stock")
        return f"shipped {order}"

    def plan() -> Plan:
        return Plan(Step(hold), store=store, checkpoint_key="ship", resume=True)

    env = Agent(engine=plan())("o-1")
    assert env.error is not None and env.error.type == "PlanPaused"
    cancel_run(store, "ship", reason="customer withdrew")
    state = store.read("ship")
    assert state["status"] == "failed"
    assert state["error"]["type"] == "RunCancelledError"
    assert "customer withdrew" in state["error"]["message"]
    ready.add("o-1")
    assert Agent(engine=plan())("o-1").payload == "shipped o-1"
    assert store.read("ship")["status"] == "done"


def test_the_plan_docs_say_why_a_cancelled_run_is_failed() -> None:
    # guarantee 608
    text = (ROOT / "docs" / "plans.md").read_text(encoding="utf-8")
    assert "## Cancelled runs are `failed`" in text
    assert "a cancelled run resumes" in text and "RunCancelledError" in text
