"""examples/store_fanout.py: a fan-out's results read back with items(), kind= and CAS."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_store_fanout_example(tmp_path: Path) -> None:
    # guarantee 152
    db = str(tmp_path / "pipeline.sqlite")
    # the same file twice: the counter goes on, the forks start over
    outs = [example_lines("store_fanout.py", db, tmp_path=tmp_path, timeout=120) for _ in range(2)]
    assert outs[0][:3] == ["AAPL: +2.63%", "GOOG: +3.57%", "MSFT: +2.44%"]
    assert "checkpoints: 3, all done: True" in outs[0]
    assert "everything under backtest: 6 pairs" in outs[0]
    assert "runs seen: 1" in outs[0] and "runs seen: 2" in outs[1]
    assert outs[1][-2:] == ["read-only view: 6 keys", "read-only store refused a write: StoreError"]
