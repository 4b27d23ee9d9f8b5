"""A checkout workflow whose process is killed halfway, then resumed: nothing runs twice.

``checkout`` charges a card, reserves stock and scores fraud together (``asyncio.gather``),
refunds through a child workflow, and ships. The script runs it in a child process that
kills itself (SIGKILL) while shipping, after the charge was committed; then it runs the
same key again in this process. The resumed run replays the charge, the reservation, the
score and the refund from the journal, runs the shipment again (it was cut short: in doubt,
run again with the same idempotency key), and returns. Every step appends its name to a
log, so the output shows which steps ran, and how often.

Usage: python examples/durable_checkout.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import stepstone
from stepstone import Store, step, workflow


def _ran(name: str) -> None:
    with open(os.environ["CHECKOUT_LOG"], "a", encoding="utf-8") as fh:
        fh.write(name + "\n")


@step(in_doubt="fail")  # a charge is never made twice by a resume: settled by hand
async def charge(order_id: str, cents: int) -> str:
    _ran("charge")
    return f"receipt-{order_id}-{cents}"


@step
def reserve(order_id: str) -> int:
    _ran("reserve")
    return 3


@step
async def score(order_id: str) -> float:
    _ran("score")
    return 0.02


@step
async def credit(order_id: str, cents: int) -> str:
    _ran("credit")
    return f"credit-{order_id}-{cents}"


@workflow
async def refund_shipping(order_id: str) -> str:
    return await credit(order_id, 499)


@step(retries=2, retry_delay=0.1)
async def ship(order_id: str) -> str:
    _ran("ship")
    key = stepstone.step_context().idempotency_key  # the carrier deduplicates on it
    if os.environ.get("CHECKOUT_DIE") == "ship":
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies mid-shipment
    return f"parcel for {order_id} ({len(key)}-char idempotency key)"


@workflow(key="order-{order_id}")
async def checkout(order_id: str) -> dict[str, object]:
    receipt = await charge(order_id, 1299)
    stock, fraud = await asyncio.gather(reserve(order_id), score(order_id))
    refund = await refund_shipping(order_id)
    parcel = await ship(order_id)
    return {"receipt": receipt, "stock": stock, "fraud": fraud, "refund": refund, "parcel": parcel}


def run(db: Path) -> dict[str, object]:
    with Store(db=db) as store:
        return checkout.using(store=store).run_sync("o-42")


def main() -> None:
    if len(sys.argv) > 1:  # the child process: run until it is killed
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        db, log = Path(tmp) / "shop.sqlite", Path(tmp) / "steps.log"
        os.environ["CHECKOUT_LOG"] = str(log)
        env = {**os.environ, "CHECKOUT_DIE": "ship"}
        child = subprocess.run([sys.executable, __file__, str(db)], env=env, check=False)
        print(f"first process: killed by signal {-child.returncode} while shipping")
        result = run(db)
        print("result:", result)
        counts = Counter(log.read_text().split())
        for name in ("charge", "reserve", "score", "credit", "ship"):
            print(f"{name}: ran {counts[name]} time(s)")
        with Store(db=db) as store:
            view = store.read("order-o-42")
            (child_key,) = [s["key"] for s in view["steps"] if s["op"] == "workflow"]
            print(
                f"run {view['status']}: {len(view['steps'])} steps, child run {child_key} "
                f"{store.read(child_key)['status']}"
            )


if __name__ == "__main__":
    main()
