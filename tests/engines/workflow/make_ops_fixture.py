"""Workflow runs journaled in the first operation journal format, frozen as a fixture.

``write_runs(db)`` runs the workflows below into a fresh SQLite store:

* ``done``: a finished run: an async step, a sync step, two steps under
  ``asyncio.gather``, a child workflow (its own run, ``done/<position>``), a
  ``stepstone.patched`` check, an event, a stream value and a durable sleep;
* ``stopped``: a run whose process went away (``KeyboardInterrupt``) after its first
  step and a gather of two steps, before its last step;
* ``failed``: a run that failed: its second step raised, so the run ended failed;
* ``in-doubt``: a run whose process died inside a step (an intent with no outcome).

``tests/engines/workflow/fixtures/ops_journal_v1.sqlite.gz`` holds the store the stepstone
of the first operation journal format wrote for them; ``test_ops_format.py`` opens a copy
with today's code and resumes them. To write it again (never over a frozen format, only
to freeze a new one under a new name)::

    python -m tests.engines.workflow.make_ops_fixture OUT.sqlite.gz
"""

from __future__ import annotations

import asyncio
import gzip
import sys
import tempfile
from pathlib import Path
from typing import Any

import stepstone
from stepstone import Store, step, workflow

#: Every step call that ran in this process, as ``(name, argument)``.
CALLS: list[tuple[str, Any]] = []
#: What the runs should break on while the fixture is written (empty: nothing breaks).
BREAK: set[str] = set()

#: What each run returns once it has finished.
RESULTS: dict[str, Any] = {
    "done": {
        "receipt": "receipt-o-1-1299",
        "score": 0.25,
        "stock": [3, 4],
        "refund": "receipt-o-1--100",
        "tax": 130,
    },
    "stopped": ["receipt-o-2-1", 0.25, 3, "receipt-o-2-2"],
    "failed": ["receipt-o-3-1", "receipt-o-3-2"],
    "in-doubt": "shipped o-4",
}


@step
async def fx_charge(order_id: str, cents: int) -> str:
    CALLS.append(("fx_charge", cents))
    if "charge-2" in BREAK and cents == 2 and order_id == "o-3":
        raise ValueError("card declined")
    await asyncio.sleep(0)
    return f"receipt-{order_id}-{cents}"


@step
def fx_score(order_id: str) -> float:
    CALLS.append(("fx_score", order_id))
    return 0.25


@step
async def fx_reserve(order_id: str, sku: int) -> int:
    CALLS.append(("fx_reserve", sku))
    await asyncio.sleep(0)
    return sku


@step
def fx_tax(cents: int) -> int:
    CALLS.append(("fx_tax", cents))
    return cents // 10


@step
async def fx_ship(order_id: str) -> str:
    CALLS.append(("fx_ship", order_id))
    if "ship" in BREAK:
        raise KeyboardInterrupt  # the process dies while the call is under way
    return f"shipped {order_id}"


@workflow
async def fx_refund(order_id: str) -> str:
    return await fx_charge(order_id, -100)


@workflow
async def fx_checkout(order_id: str) -> dict[str, Any]:
    receipt = await fx_charge(order_id, 1299)
    score = await fx_score(order_id)
    stock = list(await asyncio.gather(fx_reserve(order_id, 3), fx_reserve(order_id, 4)))
    refund = await fx_refund(order_id)
    tax = await fx_tax(1300) if stepstone.patched("fx-tax") else 0
    stepstone.set_event("stage", "charged")
    await stepstone.write_stream("progress", {"order": order_id, "done": 1})
    await stepstone.sleep(0.01)
    return {"receipt": receipt, "score": score, "stock": stock, "refund": refund, "tax": tax}


@workflow
async def fx_interrupted(order_id: str) -> list[Any]:
    out: list[Any] = [await fx_charge(order_id, 1)]
    out.extend(await asyncio.gather(fx_score(order_id), fx_reserve(order_id, 3)))
    if "stop" in BREAK:
        raise KeyboardInterrupt  # the process goes away between two steps
    out.append(await fx_charge(order_id, 2))
    return out


@workflow
async def fx_failing(order_id: str) -> list[str]:
    return [await fx_charge(order_id, 1), await fx_charge(order_id, 2)]


@workflow
async def fx_shipping(order_id: str) -> str:
    await fx_charge(order_id, 7)
    return await fx_ship(order_id)


def write_runs(db: Path) -> None:
    """Run every scenario into the SQLite store ``db``."""
    with Store(db=db) as store:
        assert fx_checkout.using(store=store, key="done").run_sync("o-1") == RESULTS["done"]
        BREAK.add("stop")
        try:
            fx_interrupted.using(store=store, key="stopped").run_sync("o-2")
        except KeyboardInterrupt:
            pass
        BREAK.add("charge-2")
        try:
            fx_failing.using(store=store, key="failed").run_sync("o-3")
        except ValueError:
            pass
        BREAK.add("ship")
        try:
            fx_shipping.using(store=store, key="in-doubt").run_sync("o-4")
        except KeyboardInterrupt:
            pass
        BREAK.clear()


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ops.sqlite"
        write_runs(db)
        leftovers = sorted(p.name for p in Path(tmp).iterdir() if p != db)
        assert not leftovers, f"the store left {leftovers} next to its file"
        out.write_bytes(gzip.compress(db.read_bytes(), mtime=0))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
