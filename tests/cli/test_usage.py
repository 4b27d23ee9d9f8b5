"""A wrong command line answers alike in every command: one `error:` line naming the option,
the value and what it takes, exit status 2; and Ctrl-C stops every command with
`interrupted` on stderr and exit status 130 (real processes, real signals)."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Store
from stepstone.cli import app
from stepstone.durable import claim_run

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "s.sqlite"
    Store(db=path).close()
    return str(path)


def test_a_bad_option_value_is_one_line_and_exit_status_2(db: str) -> None:
    # guarantee 227
    cases = [
        (["runs", "--status", "FAILED"], ["'FAILED'", "claimed, running, paused, failed, done"]),
        (["runs", "--status", "done,bogus"], ["'bogus'", "pass one of claimed"]),
        (["runs", "--sort", "age"], ["'age'", "updated, created, key"]),
        (["runs", "--limit", "0"], ["--limit", "'0'", ">= 1"]),
        (["runs", "--limit", "ten"], ["--limit", "'ten'", ">= 1"]),
        (["runs", "--offset", "-1"], ["--offset", "'-1'", ">= 0"]),
        (["runs", "--older-than", "3x"], ["--older-than", "'3x'", "30d, 12h"]),
        (["runs", "--newer-than", "soon"], ["--newer-than", "'soon'", "30d, 12h"]),
        (["runs", "--bogus"], ["--bogus", "runs --help`"]),
        (["queue", "--status", "bogus"], ["--status bogus", "queued, running, done"]),
        (["queue", "--limit", "0"], ["--limit", "'0'", ">= 1"]),
        (["ui", "--port", "70000"], ["--port", "'70000'", "from 0 to 65535"]),
        (["ui", "--poll", "nan"], ["--poll", "'nan'", "seconds > 0"]),
        (["worker", "--concurrency", "0"], ["--concurrency", "'0'", ">= 1"]),
        (["show"], ["Missing argument", "show --help`"]),
    ]
    for args, said in cases:
        result = runner.invoke(app, [*args, "--db", db], env={"COLUMNS": "200"})
        err = result.stderr
        assert result.exit_code == 2, (args, result.stdout, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert all(s in err for s in said), (args, err)
        assert "Traceback" not in result.stdout + err and result.stdout == "", args
    result = runner.invoke(app, ["check"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and "--db FILE or --url URL" in result.stderr


def _start(*args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    """``stepstone ARGS`` as Ctrl-C reaches it: SIGINT at its default in the child, also
    when these tests run as a background job (whose children inherit it ignored)."""
    return subprocess.Popen(
        [sys.executable, "-m", "stepstone.cli", *args],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "COLUMNS": "120"},
        **kwargs,  # type: ignore[call-overload]
    )


def _long_run(db: Path, steps: int) -> None:
    with Store(db=db, durability="normal") as store:
        run = claim_run(store, "long", kind="plan", resume=False, first_step="s0").run
        assert run is not None
        for s in range(steps):
            last = s == steps - 1
            run.commit_sync(
                status="done" if last else "running",
                next_step=None if last else f"s{s + 1}",
                rows=[("step", f"s{s}", {"iteration": s + 1, "envelope": {"payload": s}})],
            )
        run.release()


def _writing(proc: subprocess.Popen[bytes]) -> None:
    """Return once ``proc`` has begun its output. Its output is many times the pipe's
    capacity and nobody reads the pipe yet, so it cannot have ended: it is at work, or
    blocked writing, mid-output, until the pipe is read."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while True:
        held = fcntl.ioctl(proc.stdout.fileno(), termios.FIONREAD, b"\0\0\0\0")
        if int.from_bytes(held, sys.byteorder) > 0:
            return
        assert proc.poll() is None, "it ended before it printed anything"
        assert time.monotonic() < deadline, "it never printed anything"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def long_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of 4,000 steps, made once: the commands below only read it."""
    db = tmp_path_factory.mktemp("long") / "long.sqlite"
    _long_run(db, 4000)
    return db


@pytest.mark.skipif(sys.platform != "linux", reason="reads what a pipe holds (Linux)")
@pytest.mark.parametrize("command", ["show", "history", "inspect"])
def test_ctrl_c_in_the_middle_of_a_long_output_says_interrupted(
    long_db: Path, command: str
) -> None:
    # guarantee 228: before, show and history exited 130 without a word (inspect said so)
    db = long_db
    proc = _start(command, "long", "--db", str(db), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _writing(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.decode() == "interrupted\n"
    assert out  # what it printed before stays printed


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_ctrl_c_in_the_middle_of_a_check_says_interrupted(tmp_path: Path) -> None:
    """guarantee 228: `check` is stopped while it checks (its progress bar, on a real
    pseudo-terminal, shows it at work); before, it exited 130 without a word."""
    db = tmp_path / "many.sqlite"
    # checking 5,000 runs takes over a second, so the check is still at work when the
    # SIGINT sent as soon as its bar shows arrives (20,000 took 4 s to write, 5 s to check)
    with Store(db=db, durability="normal") as store:
        for i in range(5000):
            run = claim_run(store, f"r{i:05d}", kind="plan", resume=False, first_step="s0").run
            assert run is not None
            run.commit_sync(status="done", next_step=None, rows=[("step", "s0", {"n": i})])
            run.release()
    leader, follower = pty.openpty()
    try:
        proc = _start("check", "--db", str(db), stdout=subprocess.PIPE, stderr=follower)
    finally:
        os.close(follower)
    seen = b""
    try:
        while b"checking" not in seen:  # the bar is drawn while check_store works
            chunk = os.read(leader, 65536)
            assert chunk, "the check ended before it showed its progress"
            seen += chunk
        proc.send_signal(signal.SIGINT)
        try:
            while chunk := os.read(leader, 65536):
                seen += chunk
        except OSError:  # the terminal's other end is closed: all read
            pass
    finally:
        os.close(leader)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, seen)
    assert seen.decode(errors="replace").rstrip().endswith("interrupted")
    assert b"nothing is damaged" not in out
