"""Every Python block of docs/workers.md runs, in order, in one namespace."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "workers.md"


def test_workers_doc_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    # the blocks' module: workers import the plan from it by name
    module = types.ModuleType("docs_workers")
    monkeypatch.setitem(sys.modules, "docs_workers", module)
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), module.__dict__)
    assert module.handle.result(timeout=5).payload["risk"] == "low"
    assert module.graph_run.result(timeout=5).payload == {"order": "order-011", "risk": "low"}
    assert module.replan_run.result(timeout=5).payload == "risk: low"
    assert os.path.exists(tmp_path / "orders.sqlite")
    module.store.close()
