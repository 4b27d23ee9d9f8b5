"""examples/kept_connections.py: a thread's sync calls share one connection to the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kept_connections.py"


def test_kept_connections_example(tmp_path: Path) -> None:
    # guarantee 334, guarantee 337, guarantee 338
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "main thread: 50 calls over 1 connection",
        "4 threads x 25 calls: 4 more connections",
        "after the server dropped the idle connection: connection #6",
        "after provider.close(): connection #7",
    ]
