"""The code blocks of docs/llm.md marked ``# runs offline`` run, and print what they say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from stepstone.testing import block_model_requests

DOC = Path(__file__).resolve().parents[3] / "docs" / "llm.md"
BLOCKS = [
    b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "# runs offline" in b
]


def expected_output(block: str) -> list[str]:
    """The ``# value`` comments after print(...) lines (first word of each)."""
    out = []
    for line in block.splitlines():
        m = re.match(r"\s*print\(.*\)\s+# (.+)$", line)
        if m:
            out.append(m.group(1).split(":")[0].strip())
    return out


def test_there_are_offline_blocks() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_doc_block_runs(block: str) -> None:
    printed = io.StringIO()
    with block_model_requests(), contextlib.redirect_stdout(printed):
        exec(compile(block, str(DOC), "exec"), {"__name__": "__doc_block__"})
    lines = [line.strip() for line in printed.getvalue().splitlines()]
    for want, got in zip(expected_output(block), lines, strict=False):
        assert got.startswith(want), (want, got)
