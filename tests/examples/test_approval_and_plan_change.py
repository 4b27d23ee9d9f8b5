"""examples/approval_and_plan_change.py runs as users run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "approval_and_plan_change.py"


def test_approval_and_plan_change_example(tmp_path: Path) -> None:
    # guarantee 124, 128, 129, 130
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "quotes.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[:5] == [
        f"poll {i}: PlanPaused (Plan paused at step 'approve': quote for ACME waits for a manager)"
        for i in range(1, 6)
    ]
    assert out[5] == "approved: sent ACME: 2499.80 (two seats), valid 30 Jun 2026"
    assert out[6] == "stored: {'customer': 'ACME', 'total': '1249.90', 'valid_until': '2026-06-30'}"
    assert out[7].startswith("changed plan refused: checkpoint 'quote-acme' was written by a")
    assert "steps removed: 'approve'" in out[7]
    assert out[8] == "restarted: sent ACME: 2499.80 (two seats), valid 30 Jun 2026"
    # Run without an argument, it cleans up after itself.
    again = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "quotes.sqlite"] or all(
        p.name.startswith("quotes.sqlite") for p in tmp_path.iterdir()
    )
