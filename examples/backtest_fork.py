"""Concurrent fan-out with ``on_concurrent="fork"``.

Each run of the same backtest plan claims its own checkpoint key
``backtest:<run_uid>``, and its ``writes=`` go under that key too, so runs never collide.
``prune_forks()`` removes the finished forks afterwards.

    python examples/backtest_fork.py [path/to/pipeline.sqlite]
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stepstone import Agent, Plan, Step, Store

PRICES = {
    "AAPL": [190, 192, 188, 195],
    "GOOG": [140, 138, 141, 145],
    "MSFT": [410, 405, 415, 420],
    "AMZN": [180, 182, 179, 185],
}


def load_data(ticker: str) -> dict[str, object]:
    """Load the price series of a ticker."""
    return {"ticker": ticker, "prices": PRICES[ticker]}


def run_strategy(data: dict[str, object]) -> dict[str, object]:
    """Buy-and-hold: emit a trade log."""
    prices = data["prices"]
    assert isinstance(prices, list)
    return {"ticker": data["ticker"], "entry": prices[0], "exit": prices[-1]}


def score_run(trades: dict[str, object]) -> str:
    """Return of the trade, in percent."""
    entry, exit_ = trades["entry"], trades["exit"]
    assert isinstance(entry, int) and isinstance(exit_, int)
    return f"{trades['ticker']}: {100 * (exit_ - entry) / entry:+.2f}%"


def main(db: str | None = None) -> None:
    """Run on the SQLite file ``db``, or in a temporary directory removed afterwards."""
    if db:
        run(Path(db))
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        run(Path(tmp) / "pipeline.sqlite")


def run(path: Path) -> None:
    store = Store(db=path)
    plan = Plan(
        Step(load_data, name="load", writes="prices"),
        Step(run_strategy, name="run", writes="trades"),
        Step(score_run, name="score"),
        store=store,
        checkpoint_key="backtest",
        on_concurrent="fork",  # each run gets its own keyspace
    )
    backtest = Agent(engine=plan, tools=[load_data, run_strategy, score_run])
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(backtest, ["AAPL", "GOOG", "MSFT", "AMZN"]))
    for env in results:
        key = env.metadata["checkpoint_key"]
        print(f"{env.payload:<16} checkpoint {key}  trades at {key}:trades")
    print(f"fork checkpoints: {len([k for k in store.keys('backtest:') if k.count(':') == 1])}")
    print(f"pruned {plan.prune_forks()} finished forks; keys left: {store.keys()}")
    store.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
