"""examples/approve_from_shell.py: a paused tool call approved with `stepstone approve` in
another process, then applied by the Plan's resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "approve_from_shell.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_pause_approve_from_the_shell_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "refunds.sqlite")
    out = _run(sys.executable, str(EXAMPLE), db).stdout.splitlines()
    assert out == [
        "paused: refund({'order': 'o-42', 'amount': 30}) waits; approve it with "
        f"`stepstone approve refunds call_0_0 --db {db}`"
    ]
    cli = [sys.executable, "-m", "stepstone.cli"]
    approved = _run(*cli, "approve", "refunds", "call_0_0", "--db", db, "--json").stdout
    assert '"decision": true' in approved and '"tool": "refund"' in approved
    out = _run(sys.executable, str(EXAMPLE), db).stdout.splitlines()
    assert out == [
        "  refund: 30 EUR paid back on o-42",
        "done: Done: refunded 30 EUR on o-42.",
    ]


def test_without_a_file_it_tells_the_whole_story() -> None:
    out = _run(sys.executable, str(EXAMPLE)).stdout
    assert "paused: refund(" in out and "approved refund call call_0_0" in out
    assert out.rstrip().endswith("done: Done: refunded 30 EUR on o-42.")
