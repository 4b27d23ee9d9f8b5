"""examples/durable_agent.py and the code blocks of docs/agents.md run as written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs._blocks import blocks
from tests.docs._one_interpreter import Ran, Script, run_steps
from tests.examples._run import example_lines

ROOT = Path(__file__).resolve().parents[2]


def test_example_crash_and_approval_stories(tmp_path: Path) -> None:
    # guarantee 160, 161, 178
    assert example_lines("durable_agent.py", tmp_path=tmp_path, timeout=180) == [
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


def _agents_blocks() -> list[str]:
    return [b.code for b in blocks(ROOT / "docs" / "agents.md") if b.runs]


@pytest.fixture(scope="module")
def agents_blocks_run(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Ran]]:
    """Each python block of docs/agents.md run once, alone, as a script (one interpreter for
    them all, each block its own ``__main__``), its temp dirs in a directory of its own:
    the block and how it ended."""
    tmp_path = tmp_path_factory.mktemp("agents_md")
    blocks = _agents_blocks()
    ran = run_steps(
        [Script(code=block, name=f"docs/agents.md block {i}") for i, block in enumerate(blocks)],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the blocks' temp dirs go here
        timeout=300,
    )
    return list(zip(blocks, ran, strict=True))


def test_docs_code_blocks_run(
    agents_blocks_run: list[tuple[str, Ran]],
) -> None:
    assert len(agents_blocks_run) == 6
    for block, proc in agents_blocks_run:
        assert proc.status == 0, (block, proc.stderr)
    assert agents_blocks_run[2][1].stdout.splitlines() == [
        "completed Q4 revenue grew 12% to 1.2M EUR.",
        "completed",
        "run_terminal",
        "['run_started', 'step_started', 'pre_llm', 'post_llm']",
    ]
    ids = next(proc for block, proc in agents_blocks_run if "bill-1" in block)
    assert ids.stdout.splitlines() == ["[('bill-1', 't-7', 'done')]", "t-7"]  # guarantee 400
    settled = next(proc for block, proc in agents_blocks_run if "settle" in block)
    assert settled.stdout.splitlines() == [  # guarantee 405
        "EffectInDoubtError",
        "['call_0_0']",
        "completed moved x1 (ledger entry 7781)",
    ]


def test_docs_opening_block_prints_what_it_says(
    agents_blocks_run: list[tuple[str, Ran]],
) -> None:
    # the page's first example (once the README's): a durable run that pays once
    block, proc = agents_blocks_run[0]
    assert block == _agents_blocks()[0]
    assert proc.status == 0, proc.stderr
    assert proc.stdout.strip() == "completed Charged 120 EUR."
