"""examples/operate_runs.py runs as users run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "operate_runs.py"


def test_operate_runs_example(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "runs.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("4 runs: nightly-11-22=failed, ")
    assert out[1] == "nightly-11-22 failed at load: ValueError: negative row count -1"
    assert out[2] == "11-20 vs 11-21 differ at row 0: '11-20: 5 rows' vs '11-21: 4 rows'"
    assert out[3] == "forked nightly-11-21 at extract: nightly-11-21-rerun resumes at 'load'"
    assert out[4] == "prune --dry-run would delete: ['nightly-11-19']"
    assert out[5] == "pruned: ['nightly-11-19']"
    assert out[6] == (
        "runs left: ['nightly-11-20', 'nightly-11-21', 'nightly-11-21-rerun', 'nightly-11-22']"
    )
    assert out[7].startswith("vacuum: ")
