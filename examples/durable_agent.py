"""Durable agent runs: a crash in the middle of the tool loop, and a pause for approval.

Runs offline (scripted models answer by turn, as a real model would answer the same
conversation). Each part uses separate processes, as a real deployment would:

1. An agent charges a card, then its process is killed (SIGKILL) while it sends the
   receipt. A new process resumes the run: the charge is replayed from the journal, not
   made again; the receipt is sent; the model is not asked again for the committed turn.
2. An agent wants to refund an order; the refund tool requires approval, so the run
   pauses. Another process approves the call and the run completes.

    python examples/durable_agent.py [DB_PATH]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from stepstone import Agent, Runner, RunnerConfig, Store, ToolContext, tool
from stepstone.providers import ModelRequest
from stepstone.testing import FunctionModel, call


def ledger_path(db: str) -> Path:
    return Path(db + ".ledger")


def record(db: str, line: str) -> None:
    with open(ledger_path(db), "a") as f:
        f.write(line + "\n")


def billing_agent(db: str, *, die_in_receipt: bool) -> Agent:
    @tool(in_doubt="fail")  # never charge twice by accident: an unknown outcome stops the run
    def charge_card(amount: int, ctx: ToolContext) -> str:
        """Charge the customer's card."""
        record(db, f"charged {amount} (idempotency key {ctx.idempotency_key})")
        return f"charged {amount} EUR"

    @tool
    def send_receipt(email: str) -> str:
        """Email the receipt (safe to repeat)."""
        if die_in_receipt:
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies here
        record(db, f"receipt sent to {email}")
        return "sent"

    replies = {
        0: call("charge_card", amount=120),
        1: call("send_receipt", email="ada@example.com"),
        2: "Charged 120 EUR and sent the receipt.",
    }

    def model(request: ModelRequest) -> object:
        record(db, f"model asked for turn {request.turn}")
        return replies[request.turn]

    return Agent(name="billing", model=FunctionModel(model), tools=[charge_card, send_receipt])


def support_agent() -> Agent:
    @tool(requires_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order (a person approves every refund)."""
        return f"refunded {amount} EUR on {order}"

    replies = {0: call("refund", order="o-42", amount=30), 1: "Refund of 30 EUR issued."}
    model = FunctionModel(lambda request: replies[request.turn])
    return Agent(name="support", model=model, tools=[refund])


def child(step: str, db: str, *args: str) -> None:
    """One process of the story."""
    config = RunnerConfig(checkpoint_async_writes=False)
    with Store(db=db) as store:
        runner = Runner(store=store, config=config)
        if step == "bill":
            agent = billing_agent(db, die_in_receipt=True)
            runner.run_sync(
                agent, user_message="Bill Ada 120 EUR", run_id="bill-ada", thread_id="ada"
            )
        elif step == "bill-resume":
            agent = billing_agent(db, die_in_receipt=False)
            result = runner.resume_sync(agent, run_id="bill-ada", thread_id="ada")
            print(f"resumed: {result.state}, {result.replayed_effect_count} effects replayed")
            print(f"answer: {result.final_text}")
        elif step == "refund":
            result = runner.run_sync(
                support_agent(), user_message="Refund o-42", run_id="refund-o42", thread_id="bob"
            )
            [pending] = result.pending_approvals
            print(f"paused: {result.state}, waiting for {pending['tool']}({pending['arguments']})")
            print(pending["call_id"])
        elif step == "approve":
            result = runner.resume_sync(
                support_agent(), run_id="refund-o42", thread_id="bob", approvals={args[0]: True}
            )
            print(f"approved: {result.state}, {result.final_text}")


def run(step: str, db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, __file__, "--child", step, db, *args],
        capture_output=True,
        text=True,
        check=False,
    )


def main(db: str) -> None:
    print("1. crash in the middle of the tool loop")
    crashed = run("bill", db)
    print(f"   first process killed: {crashed.returncode == -signal.SIGKILL}")
    resumed = run("bill-resume", db)
    for line in resumed.stdout.splitlines():
        print("   " + line)
    print("   ledger:")
    for line in ledger_path(db).read_text().splitlines():
        print("     " + line)
    print("2. a pause for approval, approved from another process")
    paused = run("refund", db)
    status, call_id = paused.stdout.splitlines()
    print("   " + status)
    approved = run("approve", db, call_id)
    print("   " + approved.stdout.strip())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
    elif len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
            main(str(Path(tmp) / "agents.sqlite"))
