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

from tests.docs._cli_lines import run_lines

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
    for lang, code in blocks:
        if lang == "python":
            proc = subprocess.run(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, (code, proc.stderr)
            continue
        lines = [raw.split("  #", 1)[0].strip() for raw in code.splitlines()]
        lines = [line for line in lines if line]
        serve = [line for line in lines if line.startswith("stepstone ui")]
        assert serve in ([], lines[-1:]), "`stepstone ui` ends its block"
        # The other lines in one interpreter, each as the `stepstone` command runs it.
        commands = lines[: len(lines) - len(serve)]
        ran = run_lines(commands, cwd=tmp_path, env=env) if commands else []
        assert [done.line for done in ran] == commands
        for done in ran:
            assert done.status == 0, (done.line, done.stdout, done.stderr)
        for line in serve:  # the `stepstone` command on PATH, in a shell
            _serve_once("exec " + line, tmp_path, env)
