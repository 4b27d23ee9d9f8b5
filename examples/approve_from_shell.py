"""A tool call waits for a person; the person approves it from the shell; the run resumes.

Each run of this script is one process, as a cron job or a worker would run it:

    python examples/approve_from_shell.py refunds.sqlite     # the agent asks to refund: paused
    stepstone approve refunds call_0_0 --db refunds.sqlite   # a person approves (or --deny WHY)
    python examples/approve_from_shell.py refunds.sqlite     # the resume runs the refund

The LLM step of the Plan pauses on a ``requires_approval`` tool; ``stepstone approve``
records the decision in the store, and the next ``Plan(resume=True)`` applies it without
``approvals=``. Without a file, the three steps run here, in a temporary directory (the
approval through the real ``stepstone`` command, in its own process).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepstone import Agent, Plan, Step, Store, tool
from stepstone.testing import FunctionModel, call


@tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    print(f"  refund: {amount} EUR paid back on {order}")
    return f"refunded {amount} EUR on {order}"


def reply(request: Any) -> Any:
    """A scripted model: ask for the refund, then report the tool's answer."""
    if request.turn == 0:
        return call("refund", order="o-42", amount=30)
    (result,) = request.messages[-1].tool_results
    return f"Done: {result.content}."


def run(path: Path) -> None:
    support = Agent(model=FunctionModel(reply), tools=[refund], name="support")
    with Store(db=path) as store:
        plan = Plan(
            Step(str.strip, name="clean"),
            Step(support, name="support"),
            store=store,
            checkpoint_key="refunds",
            resume=True,
        )
        env = Agent(engine=plan)(" customer asks for a refund of o-42 ")
    if env.ok:
        print(f"done: {env.payload}")
        return
    for pending in env.metadata.get("pending_approvals", []):
        print(
            f"paused: {pending['tool']}({pending['arguments']}) waits; approve it with "
            f"`stepstone approve refunds {pending['call_id']} --db {path}`"
        )


def main(argv: list[str]) -> None:
    if argv:
        run(Path(argv[0]))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        path = Path(tmp) / "refunds.sqlite"
        run(path)
        cli = [sys.executable, "-m", "stepstone.cli"]  # the `stepstone` command
        approve = [*cli, "approve", "refunds", "call_0_0", "--db", str(path)]
        print("$ stepstone approve refunds call_0_0")
        subprocess.run(approve, check=True)
        run(path)


if __name__ == "__main__":
    main(sys.argv[1:])
