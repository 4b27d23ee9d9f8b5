"""Running an example as its users run it: ``python -W error examples/NAME`` in a scratch
directory, its output lines returned (the exit code must be 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_lines(name: str, cwd: Path, timeout: float = 300) -> list[str]:
    """The stdout lines of ``examples/<name>`` run in ``cwd``, warnings as errors."""
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()
