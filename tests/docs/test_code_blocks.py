"""Every python code block of README.md and docs/*.md runs, offline (see ``_blocks.py``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._blocks import _FENCE, ROOT, Block, blocks, doc_files
from tests.docs._one_interpreter import run_steps

_NO_RUN_BUDGET = 3  # blocks marked `python no-run` in all the docs together: keep them rare


def _needs_postgres(path: Path) -> bool:
    return any(b.runs and "postgresql://" in b.code for b in blocks(path))


def _has_python(path: Path) -> bool:
    return any(b.is_python for b in blocks(path))


def _params() -> list[object]:
    """The pages with a python block (a page without one has nothing for a runner to do)."""
    return [
        pytest.param(p, id=p.name, marks=[pytest.mark.postgres] if _needs_postgres(p) else [])
        for p in doc_files()
        if _has_python(p)
    ]


@pytest.mark.parametrize("path", _params())
def test_every_python_block_runs(
    path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # guarantee 153
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = str(ROOT)
    if _needs_postgres(path):
        env["STEPSTONE_DOCS_PG_URL"] = request.getfixturevalue("pg_url")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.docs._runner", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_blocks_are_marked_and_no_run_is_rare() -> None:
    # guarantee 153
    no_run = []
    for path in doc_files():
        for block in blocks(path):
            if block.is_python:
                assert block.info in ("python", "python no-run"), block.where
                no_run += [block.where] if not block.runs else []
    assert len(no_run) <= _NO_RUN_BUDGET, no_run


def test_the_fence_parser_sees_every_block() -> None:
    text = "a\n```python\nx = 1\n```\n\n```python no-run\ny(\n```\n```\nplain\n```\n"
    found = [(m["info"].strip(), m["code"]) for m in _FENCE.finditer(text)]
    assert found == [("python", "x = 1\n"), ("python no-run", "y(\n"), ("", "plain\n")]


def _command_lines(page: Path) -> list[str]:
    """The `stepstone ...` lines of the page's shell blocks, in order, comments cut off."""
    return [
        line.split("#", 1)[0].strip()
        for block in blocks(page)
        if block.info == "sh"
        for line in block.code.splitlines()
        if line.startswith("stepstone ")
    ]


@pytest.mark.parametrize("name", ["README.md"])
def test_the_command_lines_run(name: str, tmp_path: Path) -> None:
    # guarantee 153: the `stepstone ...` lines of the page's shell blocks, in order, each
    # exits 0 (one interpreter runs them all, each as the `stepstone` command runs it)
    lines = [line for line in _command_lines(ROOT / name) if "..." not in line]  # postgresql://...
    ran = run_steps(lines, cwd=tmp_path, env=dict(os.environ))
    for done in ran:
        assert done.status == 0, (done.line, done.stderr)
    assert [done.line for done in ran] == lines
    assert len(ran) >= 4


def test_the_cli_pages_command_lines_run_in_tests_cli() -> None:
    # guarantee 153: docs/cli.md's `stepstone ...` lines are its opening example, which
    # tests/cli/test_cli_docs.py::test_the_opening_example_runs runs, line by line
    from tests.cli.test_cli_docs import opening_lines

    lines = _command_lines(ROOT / "docs" / "cli.md")
    assert [shlex.split(line) for line in lines] == [shlex.split(x) for x in opening_lines()]


@pytest.mark.parametrize(
    ("code", "imports_it"),
    [
        ("from agents import Agent\n", True),
        ("import agents\n", True),
        ("import agents.tool as t\n", True),
        ("from stepstone.integrations.openai_agents import DurableRunner\n", True),
        ("from stepstone.integrations import openai_agents\n", True),
        ("if True:\n    from agents import Agent\nawait run()\n", True),
        ("from stepstone import Agent\nimport agentsmith\n", False),
        ("from stepstone.integrations.pydantic_ai import DurableAgent\n", False),
        ("x = 'import agents'\n", False),
    ],
)
def test_the_runner_sees_which_pages_import_the_agents_sdk(code: str, imports_it: bool) -> None:
    # Only those pages pay for importing the SDK and pointing it at the loopback server; a
    # page that imports it unseen fails its run (see _runner.main).
    from tests.docs._runner import _imports_agents_sdk

    block = Block(ROOT / "docs" / "x.md", 1, "python", code)
    assert _imports_agents_sdk(block) is imports_it
