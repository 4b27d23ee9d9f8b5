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


def test_readme_replan_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # guarantee 71, 72
    readme = DOC.parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), re.DOTALL)
    (block,) = [b for b in blocks if "ReplanEngine(" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md ReplanEngine block", "exec"), {"__name__": "readme_replan"})
