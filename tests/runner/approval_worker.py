"""Approval across processes: ``start DB`` runs until the pause; ``approve DB CALL_ID``
resumes with the call approved. Prints the result as JSON."""

from __future__ import annotations

import json
import sys

from stepstone import Agent, Runner, Store, tool
from stepstone.testing import FunctionModel, call


@tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order (a person approves each refund)."""
    with open(sys.argv[2] + ".refunds", "a") as f:
        f.write(f"{order}:{amount}\n")
    return f"refunded {amount} on {order}"


def main() -> None:
    mode, db = sys.argv[1], sys.argv[2]
    # Answers by turn: a resumed run does not ask again for committed turns.
    replies = {0: call("refund", order="o-7", amount=30), 1: "Refund done."}
    model = FunctionModel(lambda request: replies[request.turn])
    agent = Agent(name="support", model=model, tools=[refund])
    with Store(db=db) as store:
        runner = Runner(store=store)
        if mode == "start":
            result = runner.run_sync(agent, user_message="refund o-7", run_id="rf", thread_id="t")
        else:
            result = runner.resume_sync(
                agent, run_id="rf", thread_id="t", approvals={sys.argv[3]: True}
            )
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
