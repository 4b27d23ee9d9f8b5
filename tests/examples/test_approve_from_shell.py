"""examples/approve_from_shell.py: a paused tool call approved with `stepstone approve` in
another process, then applied by the Plan's resume."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_cli import stepstone
from tests.examples._run import run_example

WIDE = {"COLUMNS": "200"}


def test_pause_approve_from_the_shell_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "refunds.sqlite")
    out = run_example("approve_from_shell.py", db, tmp_path=tmp_path, env=WIDE, timeout=120)
    assert out.stdout.splitlines() == [
        "paused: refund({'order': 'o-42', 'amount': 30}) waits; approve it with "
        f"`stepstone approve refunds call_0_0 --db {db}`"
    ]
    approve = stepstone("approve", "refunds", "call_0_0", "--db", db, "--json")
    assert approve.returncode == 0, approve.stderr
    approved = approve.stdout
    assert '"decision": true' in approved and '"tool": "refund"' in approved
    out = run_example("approve_from_shell.py", db, tmp_path=tmp_path, env=WIDE, timeout=120)
    assert out.stdout.splitlines() == [
        "  refund: 30 EUR paid back on o-42",
        "done: Done: refunded 30 EUR on o-42.",
    ]


def test_without_a_file_it_tells_the_whole_story(tmp_path: Path) -> None:
    out = run_example("approve_from_shell.py", tmp_path=tmp_path, env=WIDE, timeout=120).stdout
    assert "paused: refund(" in out and "approved refund call call_0_0" in out
    assert out.rstrip().endswith("done: Done: refunded 30 EUR on o-42.")
