"""examples/handle_errors.py run as a user runs it: errors handled by their meaning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "handle_errors.py"


def test_handle_errors_example(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "errors.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert (
        out[0] == "misuse (ConfigurationError, a ValueError: True): max_turns must be >= 1, got 0"
    )
    assert out[1].startswith(
        "busy (ConcurrentPlanRunError: True): checkpoint_key 'nightly-load' is owned by live run "
    )
    assert out[2] == "first run finished: 'loaded rows'"
    assert len(out) == 3
