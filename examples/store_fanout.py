"""Reading a fan-out's results back from the Store: items(), keys(), compare_and_swap.

Three backtests run at once with ``on_concurrent="fork"``: each run gets its own checkpoint
``backtest:<run_uid>`` and its ``writes=`` values under ``backtest:<run_uid>:<writes>``.
``store.items(prefix=...)`` then yields ``(key, value)`` pairs of both kinds; ``kind=``
keeps one. A counter shows ``compare_and_swap``, and a read-only Store inspects the file the
way ``stepstone runs`` does.

Usage: python examples/store_fanout.py [DB]   (default: a temporary directory)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from stepstone import Plan, Step, Store
from stepstone.exceptions import StoreError

PRICES = {"AAPL": (190, 195), "GOOG": (140, 145), "MSFT": (410, 420)}


def score(ticker: str) -> dict[str, Any]:
    entry, exit_ = PRICES[ticker]
    return {"ticker": ticker, "return_pct": round(100 * (exit_ - entry) / entry, 2)}


def count_run(store: Store) -> int:
    """Add one to the ``runs-seen`` counter, safely across processes."""
    while True:
        current = store.read("runs-seen")
        if store.compare_and_swap("runs-seen", current, (current or 0) + 1):
            return int((current or 0) + 1)


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        run(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        run(Path(tmp) / "pipeline.sqlite")


def run(path: Path) -> None:
    with Store(db=path) as store:
        plan = Plan(
            Step(score, writes="score"),
            store=store,
            checkpoint_key="backtest",
            on_concurrent="fork",
        )
        plan.prune_forks()  # forget an earlier run's finished forks (same DB given twice)
        results = plan.run_many(list(PRICES))
        assert all(env.ok for env in results)

        # Each fork's writes= value is a plain value under "backtest:<run_uid>:score".
        scores = [v for k, v in store.items(prefix="backtest:", kind="value")]
        for value in sorted(scores, key=lambda v: v["ticker"]):
            print(f"{value['ticker']}: {value['return_pct']:+.2f}%")

        # Each fork's checkpoint, in the shape store.read() gives it.
        checkpoints = store.items(prefix="backtest:", kind="checkpoint")
        done = all(state["status"] == "done" for _, state in checkpoints)
        print(f"checkpoints: {len(checkpoints)}, all done: {done}")
        print(f"everything under backtest: {len(store.items(prefix='backtest:'))} pairs")

        print(f"runs seen: {count_run(store)}")

    with Store(db=path, read_only=True) as ro:
        print(f"read-only view: {len(ro.keys(prefix='backtest:'))} keys")
        try:
            ro.write("x", 1)
        except StoreError as exc:
            print(f"read-only store refused a write: {type(exc).__name__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
