"""examples/quick_steps.py: cheap sync steps of concurrent runs move to the loop's thread."""

from __future__ import annotations

import re
from pathlib import Path

from tests.examples._run import example_lines


def test_quick_steps_example(tmp_path: Path) -> None:
    # guarantee 341
    lines = example_lines("quick_steps.py", tmp_path=tmp_path)
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
