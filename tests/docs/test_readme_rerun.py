"""README's crash/resume example prints what its comments say, however often it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs._blocks import ROOT, blocks


def test_the_readme_example_prints_the_same_every_time(tmp_path: Path) -> None:
    # guarantee 401: a second execution must not find the first one's done run (it then
    # did not crash and printed the kv): the example makes a new store file each time.
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
    assert outputs[0] == [
        "extract runs",  # once: run 2 resumes at load, it does not re-run extract
        "load",  # run 1 died in load: the checkpoint's next step
        "True loaded 3 rows",  # run 2: the last step's output
        "loaded 3 rows",  # run 3: done, the last output beside the cached kv
    ]
