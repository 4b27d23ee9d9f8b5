"""A Plan that pauses for a human approval with PlanPaused, and resumes once it lands.

Each run of this script is one process, as a cron job or a worker would run it:

    python examples/approval_pause.py refunds.sqlite            # proposes, then pauses
    python examples/approval_pause.py refunds.sqlite            # still waiting: pauses again
    python examples/approval_pause.py refunds.sqlite --approve  # approves; the run finishes

The paused run's checkpoint has ``status="paused"`` and ``next_step="wait_for_approval"``;
the caller gets an error envelope with ``error.type == "PlanPaused"`` and
``error.retryable`` True. ``propose`` runs once, however many times the script polls.
Without a file, the three runs happen in one process, in a temporary directory.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from stepstone import Agent, Plan, PlanPaused, Step, Store

ORDER = "order-7"


def build(store: Store) -> Agent:
    def propose(order: str) -> str:
        print(f"  propose: drafting a refund for {order}")
        return f"refund 120 EUR for {order}"

    def wait_for_approval(proposal: str) -> str:
        if not store.read(f"approvals:{ORDER}"):
            raise PlanPaused(f"waiting for a manager to approve {ORDER}")
        return proposal

    def pay(proposal: str) -> str:
        return f"paid: {proposal}"

    return Agent(
        engine=Plan(
            Step(propose, writes="proposal"),
            Step(wait_for_approval),
            Step(pay, writes="receipt"),
            store=store,
            checkpoint_key=f"refund-{ORDER}",
            resume=True,
        )
    )


def run(path: Path, *, approve: bool) -> None:
    with Store(db=path) as store:
        if approve:
            store.write(f"approvals:{ORDER}", True)
            print(f"approved {ORDER}")
        env = build(store)(ORDER)
        if env.ok:
            print(f"done: {env.payload}")
            return
        assert env.error is not None
        state = store.read(f"refund-{ORDER}")
        print(f"{state['status']}: {env.error.message} (retryable={env.error.retryable})")


def main(argv: list[str]) -> None:
    approve = "--approve" in argv
    args = [a for a in argv if a != "--approve"]
    if args:
        run(Path(args[0]), approve=approve)
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        path = Path(tmp) / "refunds.sqlite"
        run(path, approve=False)
        run(path, approve=False)
        run(path, approve=True)


if __name__ == "__main__":
    main(sys.argv[1:])
