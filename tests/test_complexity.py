"""The code stays small enough to hold in your head: a budget of complex and long functions.

ruff's C901 (McCabe complexity) at max-complexity 10, with ``noqa`` comments ignored, may find
at most ``C901_BUDGET`` functions across ``src/``; at most ``LONG_BUDGET`` functions may span
more than ``MAX_LINES`` lines. Both numbers may only go down: split a function by
responsibility (well-named helpers, table-driven dispatch, early returns) rather than raise
a budget.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

MAX_COMPLEXITY = 10
C901_BUDGET = 6
MAX_LINES = 80
LONG_BUDGET = 2


def _complex_functions() -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--select",
            "C901",
            "--config",
            f"lint.mccabe.max-complexity={MAX_COMPLEXITY}",
            "--ignore-noqa",
            "--output-format",
            "json",
            "--exit-zero",
            str(SRC),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    found = json.loads(proc.stdout)
    return sorted(
        f"{Path(item['filename']).relative_to(SRC)}:{item['location']['row']}: {item['message']}"
        for item in found
    )


def _long_functions() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    where = f"{path.relative_to(SRC)}:{node.lineno}"
                    found.append(f"{where}: {node.name} ({lines} lines)")
    return found


def test_complex_functions_stay_within_the_budget() -> None:
    found = _complex_functions()
    assert len(found) <= C901_BUDGET, (
        f"{len(found)} functions exceed McCabe complexity {MAX_COMPLEXITY} "
        f"(budget {C901_BUDGET}); split the new ones rather than raise the budget:\n"
        + "\n".join(found)
    )


def test_long_functions_stay_within_the_budget() -> None:
    found = _long_functions()
    assert len(found) <= LONG_BUDGET, (
        f"{len(found)} functions span more than {MAX_LINES} lines (budget {LONG_BUDGET}); "
        "split the new ones rather than raise the budget:\n" + "\n".join(found)
    )
