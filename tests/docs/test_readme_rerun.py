"""README's crash/resume example prints what its comments say, however often it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs._blocks import ROOT, blocks


def test_the_readme_example_prints_the_same_every_time(tmp_path: Path) -> None:
    # guarantee 401: its store file stays behind between executions. Before, the second
    # execution found the run done, so "Run 1" did not crash and "Run 2" printed the kv.
    example = next(b for b in blocks(ROOT / "README.md") if b.runs)
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    outputs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout.splitlines())
    assert outputs[0] == outputs[1]
    lines = outputs[0]
    assert lines[0] == "loaded 2 rows"  # run 2: the last step's output
    assert lines[1].startswith("{'raw': ") and "'loaded': 'loaded 2 rows'" in lines[1]
    assert lines[2] == "loaded 2 rows"  # run 3: the last output beside the cached kv
    assert lines[3].startswith("done None ")
