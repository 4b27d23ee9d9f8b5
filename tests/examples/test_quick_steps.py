"""examples/quick_steps.py: cheap sync steps of concurrent runs move to the loop's thread."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quick_steps.py"


def test_quick_steps_example(tmp_path: Path) -> None:
    # guarantee 341
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "300 runs, first: Customer 0 (US): 0.6"
    counts = {}
    for line in lines[1:5]:
        found = re.fullmatch(
            r"(\w+): (\d+) calls on the loop's thread, (\d+) in worker threads", line
        )
        assert found, line
        counts[found[1]] = (int(found[2]), int(found[3]))
    assert counts["lookup"] == (0, 300)  # 2 ms a call: never on the loop's thread
    for step in ("parse", "normalize", "score"):
        on_loop, in_thread = counts[step]
        assert on_loop + in_thread == 300 and in_thread >= 3 and on_loop > 0, (step, counts)
    assert lines[5] == "durable runs done: 300"
