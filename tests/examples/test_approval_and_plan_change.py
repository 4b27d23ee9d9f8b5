"""examples/approval_and_plan_change.py runs as users run it."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import run_example


def test_approval_and_plan_change_example(tmp_path: Path) -> None:
    # guarantee 124, 128, 129, 130
    proc = run_example(
        "approval_and_plan_change.py",
        str(tmp_path / "quotes.sqlite"),
        tmp_path=tmp_path,
        timeout=120,
    )
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
    # Run without an argument, it cleans up after itself: run_example checks that its
    # working directory and its TMPDIR are left empty.
    run_example("approval_and_plan_change.py", tmp_path=tmp_path, timeout=120)
