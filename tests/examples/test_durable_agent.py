"""examples/durable_agent.py and the code blocks of docs/agents.md run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "durable_agent.py"


def test_example_crash_and_approval_stories(tmp_path: Path) -> None:
    # guarantee 160, 161, 178
    env = {**os.environ, "STEPSTONE_BLOCK_MODEL_REQUESTS": "1"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "agents.sqlite")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "1. crash in the middle of the tool loop",
        "   first process killed: True",
        "   resumed: completed, 3 effects replayed",
        "   answer: Charged 120 EUR and sent the receipt.",
        "   ledger:",
        "     model asked for turn 0",
        "     charged 120 (idempotency key bill-ada:tool:0:0)",
        "     model asked for turn 1",
        "     receipt sent to ada@example.com",
        "     model asked for turn 2",
        "2. a pause for approval, approved from another process",
        "   paused: paused, waiting for refund({'order': 'o-42', 'amount': 30})",
        "   approved: completed, Refund of 30 EUR issued.",
    ]


def test_docs_code_blocks_run(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 6
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        proc = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # the blocks' temp dirs go here
            check=False,
        )
        assert proc.returncode == 0, (block, proc.stderr)
    out = subprocess.run(
        [sys.executable, str(tmp_path / "block2.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=True,
    ).stdout.splitlines()
    assert out == [
        "completed Q4 revenue grew 12% to 1.2M EUR.",
        "completed",
        "run_terminal",
        "['run_started', 'step_started', 'pre_llm', 'post_llm']",
    ]
    ids = subprocess.run(
        [
            sys.executable,
            str(tmp_path / f"block{next(i for i, b in enumerate(blocks) if 'bill-1' in b)}.py"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=True,
    ).stdout.splitlines()
    assert ids == ["[('bill-1', 't-7', 'done')]", "t-7"]  # guarantee 400
    settled = subprocess.run(
        [
            sys.executable,
            str(tmp_path / f"block{next(i for i, b in enumerate(blocks) if 'settle' in b)}.py"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=True,
    ).stdout.splitlines()
    assert settled == [  # guarantee 405
        "EffectInDoubtError",
        "['call_0_0']",
        "completed moved x1 (ledger entry 7781)",
    ]


def test_docs_opening_block_prints_what_it_says(tmp_path: Path) -> None:
    # the page's first example (once the README's): a durable run that pays once
    text = (ROOT / "docs" / "agents.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    script = tmp_path / "opening_block.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "completed Charged 120 EUR."
