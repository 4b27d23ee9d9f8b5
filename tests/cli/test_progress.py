"""Long store work shows progress on a terminal: `stepstone check` and `stepstone prune` draw
a bar on stderr when it is a terminal (a real pseudo-terminal here), and nothing with
`--json` or a dry run."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from stepstone import Agent, Plan, Step, Store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")


def _done_runs(path: Path, n: int) -> None:
    def step(payload: object) -> object:
        return payload

    with Store(db=path) as store:
        for i in range(n):
            assert Agent(engine=Plan(Step(step), store=store, checkpoint_key=f"r{i}"))("go").ok


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run ``stepstone ARGS`` with its stderr on a pseudo-terminal: (exit code, stdout,
    what the terminal received)."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "stepstone.cli", *args],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=120,
            check=False,
        )
    finally:
        os.close(follower)
    received = b""
    try:
        while chunk := os.read(leader, 65536):
            received += chunk
    except OSError:  # the terminal's other end is closed: all read
        pass
    finally:
        os.close(leader)
    return proc.returncode, proc.stdout.decode(), received.decode(errors="replace")


def test_check_and_prune_show_a_bar_on_a_terminal_and_none_for_json(tmp_path: Path) -> None:
    """guarantee 370"""
    db = tmp_path / "s.db"
    _done_runs(db, 20)
    code, out, err = _on_a_terminal("check", "--db", str(db))
    assert code == 0 and "nothing is damaged" in out
    assert "checking" in err and "━" in err and "checking" not in out
    code, out, err = _on_a_terminal("check", "--db", str(db), "--json")
    assert code == 0 and out.lstrip().startswith("{") and err == ""
    code, out, err = _on_a_terminal("prune", "--db", str(db), "--keep-last", "5", "--dry-run")
    assert code == 0 and err == ""
    code, out, err = _on_a_terminal("prune", "--db", str(db), "--keep-last", "5", "--min-age", "0s")
    assert code == 0 and "pruning" in err and "pruning" not in out
    with Store(db=db) as store:
        assert len(store.keys()) == 5
