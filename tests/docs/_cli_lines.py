"""The ``stepstone ...`` lines of a docs page's shell block, run one after another in one
fresh interpreter, each exactly as the ``stepstone`` console script runs it (its entry point,
``stepstone.cli:main``, with that line's arguments), each with its own exit status, stdout and
stderr. One interpreter for the lines of a block saves the ~0.4 s of CPU that starting
Python and importing the CLI costs per line.

What a separate process would show is kept: the exit status (``SystemExit``, or 1 after an
uncaught exception, printed as Python prints it) and an empty stdin. A line that needs a
shell (a pipe, a redirection, a variable) is refused: run it through one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

__all__ = ["Ran", "run_lines"]

_SHELL = set("|&;<>()$`\\\"'*?[]~{}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ran:
    """One command line and how it ended."""

    line: str
    status: int
    stdout: str
    stderr: str


def run_lines(
    lines: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300
) -> list[Ran]:
    """Run ``lines`` (each ``stepstone ARGS``) in order in one new interpreter in ``cwd``."""
    for line in lines:
        if not line.startswith("stepstone ") or _SHELL & set(line):
            raise ValueError(f"not a plain `stepstone ...` line, run it in a shell: {line!r}")
    proc = subprocess.run(
        [sys.executable, "-c", _BOOT, __file__],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, f"the command lines' interpreter failed:\n{proc.stderr[-4000:]}"
    return [Ran(**ran) for ran in json.loads(proc.stdout)]


# `python -c`, as `python -m stepstone.cli` would: the working directory first on sys.path.
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def _run_one(line: str) -> dict[str, object]:
    from stepstone.cli import main

    out, err = io.StringIO(), io.StringIO()
    sys.argv = shlex.split(line)
    sys.stdin = io.StringIO("")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
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
    return {"line": line, "status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _main() -> None:
    lines = json.loads(sys.stdin.read())
    # The report goes to the real stdout; whatever else reaches file descriptor 1 (a child
    # process a command starts) goes to stderr.
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    ran = [_run_one(line) for line in lines]
    json.dump(ran, report)
    report.close()


if __name__ == "__main__":
    _main()
