"""Running an example as its users run it: ``python -W error examples/NAME ARGS`` in an empty
working directory, with a TMPDIR of its own, offline (no ``*_API_KEY`` variable; a model
request that would leave the machine is refused).

Each run checks that the example left no file in either directory (guarantee 150), so an
example whose own test runs it with literal arguments only (no store file) needs no second
run for that: ``test_examples_leave_no_files.py`` runs only the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(
    name: str,
    *args: str,
    tmp_path: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<name> ARGS``; assert it exits 0 and leaves its working directory and
    its TMPDIR empty. A store file named in ``args`` must lie elsewhere (in ``tmp_path``)."""
    run_dir = Path(tempfile.mkdtemp(prefix=name.removesuffix(".py") + "-", dir=tmp_path))
    cwd, tmp = run_dir / "cwd", run_dir / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**clean, "TMPDIR": str(tmp), "STEPSTONE_BLOCK_MODEL_REQUESTS": "1", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(run_dir)) for p in (*cwd.iterdir(), *tmp.iterdir()))
    assert left == [], f"{name} left files behind: {left}"  # guarantee 150
    return proc


def example_lines(name: str, *args: str, tmp_path: Path, timeout: float = 300) -> list[str]:
    """The stdout lines of :func:`run_example`."""
    return run_example(name, *args, tmp_path=tmp_path, timeout=timeout).stdout.splitlines()
