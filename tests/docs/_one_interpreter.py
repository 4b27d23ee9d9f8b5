"""The steps of a docs page, ``stepstone ...`` command lines and python scripts, run one
after another in one fresh interpreter, each with its own exit status, stdout and stderr.
One interpreter per page saves the ~0.4 s of CPU that starting Python and importing
stepstone costs per step.

Each step runs as it would in a process of its own:

* a command line as the ``stepstone`` console script runs it: its entry point,
  ``stepstone.cli:main``, with the line's arguments in ``sys.argv``;
* a script as ``python -c CODE`` runs it: as the ``__main__`` module, a new one, with
  ``sys.argv == ["-c"]``.

Its exit status is 0, the code of a ``SystemExit``, or 1 after an uncaught exception (printed
as Python prints it); its stdin is empty. A command line that needs a shell (a pipe, a
redirection, a variable) is refused: run it through one.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import io
import json
import os
import shlex
import subprocess
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Ran", "Script", "run_steps"]

_SHELL = set("|&;<>()$`\\\"'*?[]~{}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Script:
    """Python code to run as ``python -c CODE`` runs it; ``name`` shows in tracebacks."""

    code: str
    name: str = "<script>"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ran:
    """One step (a command line, or a script's name) and how it ended."""

    line: str
    status: int
    stdout: str
    stderr: str


def run_steps(
    steps: Sequence[str | Script],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float = 300,
    keep_going: bool = False,
) -> list[Ran]:
    """Run ``steps`` in order in one new interpreter in ``cwd``: each a ``stepstone ARGS``
    line or a :class:`Script`. After a step that fails the others do not run (status -1),
    as in ``set -e``, unless ``keep_going``."""
    for step in steps:
        if isinstance(step, str) and (not step.startswith("stepstone ") or _SHELL & set(step)):
            raise ValueError(f"not a plain `stepstone ...` line, run it in a shell: {step!r}")
    request = [dataclasses.asdict(s) if isinstance(s, Script) else s for s in steps]
    proc = subprocess.run(
        [sys.executable, "-c", _BOOT, __file__],
        input=json.dumps({"steps": request, "keep_going": keep_going}),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, f"the steps' interpreter failed:\n{proc.stderr[-4000:]}"
    ran = [Ran(**done) for done in json.loads(proc.stdout)]
    assert len(ran) == len(steps)
    return ran


# `python -c`, as `python -m stepstone.cli` and `python -c CODE` would: the working
# directory first on sys.path.
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def _command(line: str) -> None:
    from stepstone.cli import main

    sys.argv = shlex.split(line)
    main()


def _script(code: str, name: str) -> None:
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module  # what pickle, typing and pydantic look names up in
    sys.argv = ["-c"]
    try:
        exec(compile(code, name, "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = saved


def _run_one(step: str | dict[str, str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    sys.stdin = io.StringIO("")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if isinstance(step, str):
                _command(step)
            else:
                _script(step["code"], step["name"])
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:  # sys.exit("message"): Python prints it and exits with 1
                print(exc.code, file=sys.stderr)
                status = 1
        except BaseException:  # noqa: BLE001 - as Python does at the top level
            traceback.print_exc()
            status = 1
    line = step if isinstance(step, str) else step["name"]
    return {"line": line, "status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _main() -> None:
    request = json.loads(sys.stdin.read())
    steps = request["steps"]
    # The report goes to the real stdout; whatever else reaches file descriptor 1 (a child
    # process a step starts) goes to stderr.
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    ran = []
    for step in steps:
        ran.append(_run_one(step))
        # As `set -e`: a later step would run on what the failed one left.
        if ran[-1]["status"] != 0 and not request["keep_going"]:
            ran += [
                {
                    "line": s if isinstance(s, str) else s["name"],
                    "status": -1,
                    "stdout": "",
                    "stderr": "not run: an earlier step failed",
                }
                for s in steps[len(ran) :]
            ]
            break
    json.dump(ran, report)
    report.close()


if __name__ == "__main__":
    _main()
