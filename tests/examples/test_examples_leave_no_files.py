"""Every example, run with no store argument, cleans up after itself (guarantee 150).

Most examples' own tests run them that way, through ``run_example``, which checks it; this
file runs the others, once each.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.examples._run import EXAMPLES, example_lines

HERE = Path(__file__).resolve().parent
OFFLINE = {"etl_llm_agents.py", "research_and_write.py"}
_RUNNERS = {"run_example", "example_lines"}


@functools.cache  # read at collection and by the check below: parsed once
def _run_by_their_tests() -> dict[str, str]:
    """The examples a test file here runs through ``run_example`` (or ``example_lines``) with
    literal arguments only, so with no store file: example -> test file."""
    found: dict[str, str] = {}
    for test_file in sorted(HERE.glob("test_*.py")):
        for node in ast.walk(ast.parse(test_file.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _RUNNERS
                and node.args
                and all(isinstance(arg, ast.Constant) for arg in node.args)
                and isinstance(node.args[0].value, str)
            ):
                found.setdefault(node.args[0].value, test_file.name)
    return found


def _examples() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py"))


def _not_run_by_their_tests() -> list[str]:
    return sorted(set(_examples()) - set(_run_by_their_tests()))


@pytest.mark.parametrize("name", _not_run_by_their_tests())
def test_example_leaves_no_temp_dir_and_no_file(tmp_path: Path, name: str) -> None:
    # guarantee 150: run_example checks that its working directory and TMPDIR stay empty
    example_lines(name, *(["--offline"] if name in OFFLINE else []), tmp_path=tmp_path)


def test_every_example_is_checked_once() -> None:
    # guarantee 150: each example runs without a store file either in its own test or above
    by_tests = _run_by_their_tests()
    assert set(by_tests) <= set(_examples()), sorted(set(by_tests) - set(_examples()))
    assert sorted({*by_tests, *_not_run_by_their_tests()}) == _examples()
    assert len(by_tests) >= 15, by_tests  # the parser still finds the calls
