"""Every example, run with no arguments, cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OFFLINE = {"etl_llm_agents.py", "research_and_write.py"}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_leaves_no_temp_dir_and_no_file(tmp_path: Path, name: str) -> None:
    # guarantee 150
    tmp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *(["--offline"] if name in OFFLINE else [])],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**env, "TMPDIR": str(tmp), "STEPSTONE_BLOCK_MODEL_REQUESTS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []
