"""A Plan that waits for approval, hands typed values across the resume, and refuses to
resume under a changed plan unless told how.

Run: python examples/approval_and_plan_change.py [path/to/store.sqlite]
"""

from __future__ import annotations

import datetime
import decimal
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepstone import Agent, Plan, PlanPaused, StaleCheckpointError, Step, Store

APPROVED: set[str] = set()


def quote(task: str) -> dict[str, Any]:
    return {
        "customer": task,
        "total": decimal.Decimal("1249.90"),
        "valid_until": datetime.date(2026, 6, 30),
    }


def approve(quote: dict[str, Any]) -> dict[str, Any]:
    if quote["customer"] not in APPROVED:
        raise PlanPaused(f"quote for {quote['customer']} waits for a manager")
    return quote


def send(quote: dict[str, Any]) -> str:
    # After the resume, the values are still a Decimal and a date, as in a straight run.
    total: decimal.Decimal = quote["total"]
    until: datetime.date = quote["valid_until"]
    return f"sent {quote['customer']}: {total * 2} (two seats), valid {until:%d %b %Y}"


def plan(store: Store, *steps: Step, **options: Any) -> Plan:
    return Plan(
        *(steps or (Step(quote, writes="quote"), Step(approve), Step(send, writes="sent"))),
        store=store,
        checkpoint_key="quote-acme",
        resume=True,
        max_iterations=2,  # caps routing loops only: polling a pause never uses it up
        **options,
    )


def main(db: Path) -> None:
    with Store(db=db) as store:
        for poll in range(1, 6):
            env = Agent(engine=plan(store))("ACME")
            assert env.error is not None
            print(f"poll {poll}: {env.error.type} ({env.error.message})")
        APPROVED.add("ACME")
        env = Agent(engine=plan(store))("ACME")
        print(f"approved: {env.payload}")
        print(f"stored: {store.read('quote')}")

        changed = (Step(quote, writes="quote"), Step(send, writes="sent"))
        try:
            Agent(engine=plan(store, *changed))("ACME")
        except StaleCheckpointError as exc:
            print(f"changed plan refused: {str(exc).split(' It ')[0]}")
        env = Agent(engine=plan(store, *changed, on_plan_change="restart"))("ACME")
        print(f"restarted: {env.payload}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "quotes.sqlite")
