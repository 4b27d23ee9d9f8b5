"""Real runs to operate on: Plans committed to a real store (no fakes)."""

from __future__ import annotations

from typing import Any

from stepstone import Agent, Plan, Step, Store


def done_run(store: Store, key: str, payload: str = "x") -> None:
    """A finished two-step plan run under ``key``."""
    plan = Plan(
        Step(lambda p: payload, name="extract", writes=f"{key}.raw"),
        Step(lambda p: f"{p}!", name="load"),
        store=store,
        checkpoint_key=key,
    )
    Agent(engine=plan)("go")


def failed_run(store: Store, key: str) -> None:
    """A plan run that failed at its second step with ValueError('bad row 7')."""

    def broken(payload: Any) -> str:
        raise ValueError("bad row 7")

    plan = Plan(
        Step(lambda p: "rows", name="extract"),
        Step(broken, name="validate"),
        store=store,
        checkpoint_key=key,
    )
    Agent(engine=plan)("go")
