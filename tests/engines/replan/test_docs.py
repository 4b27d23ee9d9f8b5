"""Every Python block of docs/replan.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "replan.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_doc_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_block_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # guarantee 71, 73, 74, 191, 192
    monkeypatch.chdir(tmp_path)
    code = compile(BLOCKS[index], f"docs/replan.md block {index}", "exec")
    exec(code, {"__name__": f"replan_doc_{index}"})


def test_opening_block_is_a_durable_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # guarantee 71, 72: the page's first example (once the README's) is a durable replan run
    assert "ReplanEngine(store=" in BLOCKS[0] and "resume=True" in BLOCKS[0]
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # run again: the done run answers the same from its record
        exec(compile(BLOCKS[0], "docs/replan.md block 0", "exec"), {"__name__": "replan_doc_0"})
