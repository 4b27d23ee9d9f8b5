"""examples/custom_run_view.py: an engine of one's own on the kernel, with its own view."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_run_view.py"


def test_custom_run_view_example(tmp_path: Path) -> None:
    # guarantee 313: store.read shows the countdown through the view its engine registered
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "c.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "lease: 6 s, renewed every 2 s",
        "first try: crashed before tick 1",
        "after the crash: {'status': 'running', 'ticks': [2], 'left': 2}",
        "second try: resumed: done",  # guarantee 122: released, so taken over at once
        "after the resume: {'status': 'done', 'ticks': [2, 1, 0], 'left': 0}",
        "third try: already done",
    ]
