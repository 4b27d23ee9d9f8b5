"""examples/store_fanout.py: a fan-out's results read back with items(), kind= and CAS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "store_fanout.py"


def test_store_fanout_example(tmp_path: Path) -> None:
    # guarantee 152
    db = tmp_path / "pipeline.sqlite"
    outs = []
    for _ in range(2):  # the same file twice: the counter goes on, the forks start over
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), str(db)], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.splitlines())
    assert outs[0][:3] == ["AAPL: +2.63%", "GOOG: +3.57%", "MSFT: +2.44%"]
    assert "checkpoints: 3, all done: True" in outs[0]
    assert "everything under backtest: 6 pairs" in outs[0]
    assert "runs seen: 1" in outs[0] and "runs seen: 2" in outs[1]
    assert outs[1][-2:] == ["read-only view: 6 keys", "read-only store refused a write: StoreError"]
