"""Every code block of docs/operate.md runs, in order, in an empty directory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.docs._one_interpreter import Script, run_steps

DOC = Path(__file__).resolve().parents[2] / "docs" / "operate.md"


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(python|sh)\n(.*?)```", DOC.read_text(), flags=re.S)


def _serve_once(line: str, cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(line, shell=True, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        assert "stepstone inspector on http://127.0.0.1:" in banner, banner
        url = banner.split(" on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "api/runs", timeout=30) as resp:
            assert json.loads(resp.read())["total"] >= 1
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        assert proc.stderr is not None
        proc.stderr.close()


def test_operate_doc_blocks_run(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "COLUMNS": "160",
    }
    blocks = _blocks()
    assert [lang for lang, _ in blocks].count("sh") >= 4
    # Each python block as a script, each shell line as the `stepstone` command: in order,
    # all in one interpreter but `stepstone ui`, which ends the page.
    steps: list[str | Script] = []
    for i, (lang, code) in enumerate(blocks):
        if lang == "python":
            steps.append(Script(code=code, name=f"docs/operate.md python block {i + 1}"))
            continue
        lines = [raw.split("  #", 1)[0].strip() for raw in code.splitlines()]
        steps += [line for line in lines if line]
    serve = [step for step in steps if isinstance(step, str) and step.startswith("stepstone ui")]
    assert serve == steps[-1:], "`stepstone ui` ends the page"
    ran = run_steps(steps[:-1], cwd=tmp_path, env=env)
    for step, done in zip(steps, ran, strict=False):
        assert done.status == 0, (step, done.stdout, done.stderr)
    _serve_once("exec " + serve[0], tmp_path, env)  # the `stepstone` command on PATH
