"""The docs' steps run in one interpreter each as in a process of its own: exit status,
output, ``__main__`` (see ``_one_interpreter.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs._one_interpreter import Script, run_steps

MODEL = """
from __future__ import annotations

import dataclasses
import pickle
import sys

from pydantic import BaseModel


class Note(BaseModel):
    body: Body


class Body(BaseModel):
    text: str


@dataclasses.dataclass
class Point:
    x: int


print(Note.model_validate({"body": {"text": "hi"}}).body.text, sys.argv)
print(pickle.loads(pickle.dumps(Point(3))), __name__)
"""


def test_each_step_ends_as_its_own_process_would(tmp_path: Path) -> None:
    ran = run_steps(
        [
            "stepstone --version",
            "stepstone runs",  # no store: a usage error
            "stepstone show nope --db missing.sqlite",
            Script(code=MODEL, name="model"),
            Script(code="print(Note)", name="fresh namespace"),
            Script(code="import sys; sys.exit(3)", name="exit 3"),
            Script(code="import sys; sys.exit('gone')", name="exit message"),
            Script(code="input()", name="stdin"),
            Script(code="raise KeyError('k')", name="raise"),
        ],
        cwd=tmp_path,
        env=dict(os.environ),
        keep_going=True,
    )
    status = {done.line: done.status for done in ran}
    assert status == {
        "stepstone --version": 0,
        "stepstone runs": 2,
        "stepstone show nope --db missing.sqlite": 1,
        "model": 0,
        "fresh namespace": 1,
        "exit 3": 3,
        "exit message": 1,
        "stdin": 1,
        "raise": 1,
    }
    by = {done.line: done for done in ran}
    assert by["stepstone --version"].stdout.startswith("stepstone ")
    assert "--db" in by["stepstone runs"].stderr
    assert by["model"].stdout.splitlines() == ["hi ['-c']", "Point(x=3) __main__"]
    assert "NameError: name 'Note' is not defined" in by["fresh namespace"].stderr
    assert by["exit message"].stderr.strip() == "gone"
    assert "EOFError" in by["stdin"].stderr
    assert by["raise"].stderr.rstrip().endswith("KeyError: 'k'")
    assert not list(tmp_path.iterdir())


def test_after_a_failed_step_the_others_do_not_run(tmp_path: Path) -> None:
    ran = run_steps(
        [
            Script(code="print(1)"),
            Script(code="raise SystemExit(2)"),
            Script(code="open('x', 'w')"),
        ],
        cwd=tmp_path,
        env=dict(os.environ),
    )
    assert [done.status for done in ran] == [0, 2, -1]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("line", ["stepstone runs --db a.sqlite | head", "ls", "stepstone x $HOME"])
def test_a_line_that_needs_a_shell_is_refused(line: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run it in a shell"):
        run_steps([line], cwd=tmp_path, env=dict(os.environ))
