"""The integrations import only the frameworks' public modules and names: no module or
name with a leading underscore from pydantic-ai, the Agents SDK, openai or mcp (issue
text: built on ``pydantic_ai.durable_exec``, no private imports) (guarantee 530)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "stepstone" / "integrations"
FRAMEWORKS = ("pydantic_ai", "pydantic_core", "agents", "openai", "mcp", "fastmcp")


def _private_imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] not in FRAMEWORKS:
                continue
            names = [a.name for a in node.names]
            if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
                found.append(f"{path.name}:{node.lineno} from {node.module} import {names}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in FRAMEWORKS and any(p.startswith("_") for p in parts):
                    found.append(f"{path.name}:{node.lineno} import {alias.name}")
    return found


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: p.name)
def test_the_integrations_use_only_public_framework_names(path: Path) -> None:
    # guarantee 530
    assert _private_imports(path) == []


def test_the_check_finds_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from pydantic_ai._agent_graph import sleep_func\nimport agents._run\n")
    assert len(_private_imports(bad)) == 2
