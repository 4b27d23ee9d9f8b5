"""examples/approval_pause.py: PlanPaused across processes, then the resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "approval_pause.py"


def _run(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_pause_poll_approve_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "refunds.sqlite")
    paused = (
        "paused: Plan paused at step 'wait_for_approval': waiting for a manager to approve "
        "order-7 (retryable=True)"
    )
    assert _run(db) == ["  propose: drafting a refund for order-7", paused]
    assert _run(db) == [paused]  # polling: propose does not run again
    assert _run(db, "--approve") == ["approved order-7", "done: paid: refund 120 EUR for order-7"]
