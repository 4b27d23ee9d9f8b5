"""examples/approval_pause.py: PlanPaused across processes, then the resume."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_pause_poll_approve_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "refunds.sqlite")
    paused = (
        "paused: Plan paused at step 'wait_for_approval': waiting for a manager to approve "
        "order-7 (retryable=True)"
    )

    def run(*args: str) -> list[str]:
        return example_lines("approval_pause.py", *args, tmp_path=tmp_path, timeout=120)

    assert run(db) == ["  propose: drafting a refund for order-7", paused]
    assert run(db) == [paused]  # polling: propose does not run again
    assert run(db, "--approve") == ["approved order-7", "done: paid: refund 120 EUR for order-7"]
