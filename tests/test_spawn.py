"""The tests' fork server (tests/_spawn.py, tests/_zygote.py): a forked child behaves as a
fresh ``python -m mod`` / ``python script.py`` does.

Most tests run twice: ``forked`` (from the fork server) and ``fresh`` (the same call with
STEPSTONE_TEST_FRESH_PROCESSES=1, a plain subprocess), with the same assertions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone.core._ids import process_alive
from tests import _spawn, _zygote

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["forked", "fresh"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "fresh":
        monkeypatch.setenv("STEPSTONE_TEST_FRESH_PROCESSES", "1")
    yield request.param


def _kind(proc: object, mode: str) -> None:
    """The call went where ``mode`` says."""
    expected = _spawn.Child if mode == "forked" else subprocess.Popen
    assert isinstance(proc, expected), proc


def _script(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _wait_line(proc: _spawn.Process, text: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == text, (line, proc.poll())


def test_exit_codes_and_an_uncaught_exception(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        if sys.argv[1] == "raise":
            raise LookupError("no such item")
        sys.exit(int(sys.argv[1]))
        """,
    )
    for code in (0, 3):
        done = _spawn.run([sys.executable, str(script), str(code)], capture_output=True, text=True)
        assert done.returncode == code, done.stderr
        assert done.stderr == ""
    proc = _spawn.Popen(
        [sys.executable, str(script), "raise"], stdout=_spawn.PIPE, stderr=_spawn.PIPE, text=True
    )
    _kind(proc, mode)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert out == ""
    # the traceback a fresh interpreter prints: the script's frame first, nothing of ours
    assert err.splitlines() == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 4, in <module>',
        '    raise LookupError("no such item")',
        "LookupError: no such item",
    ]


def test_sys_exit_with_a_message(tmp_path: Path, mode: str) -> None:
    script = _script(tmp_path, "import sys\nsys.exit('cannot go on')\n")
    done = _spawn.run([sys.executable, str(script)], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (1, "cannot go on\n")


def test_text_and_bytes_pipes(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        data = sys.stdin.buffer.read()
        sys.stdout.buffer.write(data[::-1])
        sys.stderr.write("é\\n")
        """,
    )
    done = _spawn.run(
        [sys.executable, str(script)], input=b"\x00\xffab", capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"ba\xff\x00", "é\n".encode())
    done = _spawn.run(
        [sys.executable, str(script)], input="ab\r\ncd", capture_output=True, text=True
    )
    assert (done.stdout, done.stderr) == ("dc\n\nba", "é\n")  # universal newlines, as subprocess
    with _spawn.Popen(
        [sys.executable, str(script)], stdin=_spawn.PIPE, stdout=_spawn.PIPE, stderr=_spawn.STDOUT
    ) as proc:
        _kind(proc, mode)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"xyz")
        proc.stdin.close()
        assert proc.stdout.read() == b"zyx" + "é\n".encode()
    assert proc.returncode == 0


def test_the_environment_is_replaced(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWN_PARENT_ONLY", "1")
    script = _script(
        tmp_path,
        "import os\nprint(os.environ.get('SPAWN_PARENT_ONLY'), os.environ.get('SPAWN_CHILD'))\n",
    )
    env = {k: v for k, v in os.environ.items() if k != "SPAWN_PARENT_ONLY"}
    done = _spawn.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**env, "SPAWN_CHILD": "yes"},
    )
    assert done.stdout == "None yes\n", done.stderr
    inherited = _spawn.run([sys.executable, str(script)], capture_output=True, text=True)
    assert inherited.stdout == "1 None\n", inherited.stderr


def test_module_target_argv_name_cwd_and_path(tmp_path: Path, mode: str) -> None:
    pkg = tmp_path / "spawnpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 'found'\n")
    (pkg / "mod.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            from spawnpkg.helper import VALUE
            print(__name__, __package__, sys.argv, os.getcwd(), sys.path[0], VALUE)
            print("tests" in sys.modules)
            """
        )
    )
    done = _spawn.run(
        [sys.executable, "-m", "spawnpkg.mod", "a", "b c"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    argv = [str(pkg / "mod.py"), "a", "b c"]
    assert first == f"__main__ spawnpkg {argv} {tmp_path} {tmp_path} found"
    assert second == "False"  # the fork server's own package is not there for the child


def test_script_target_argv_name_and_path(tmp_path: Path, mode: str) -> None:
    (tmp_path / "sibling.py").write_text("WHERE = 'beside the script'\n")
    script = _script(
        tmp_path,
        """
        import sys
        from sibling import WHERE
        print(__name__, __file__, sys.argv, sys.path[0], WHERE)
        """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _spawn.run(
        [sys.executable, "../child.py", "x"], capture_output=True, text=True, cwd=elsewhere
    )
    assert done.returncode == 0, done.stderr
    assert script == elsewhere.parent / "child.py"
    file = f"{elsewhere}/../child.py"  # a fresh interpreter joins the path, does not normalise it
    assert done.stdout == f"__main__ {file} ['../child.py', 'x'] {tmp_path} beside the script\n"


def test_pythonpath_entries_follow_the_first_entry(tmp_path: Path, mode: str) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "spawn_extra.py").write_text("NAME = 'from PYTHONPATH'\n")
    script = _script(
        tmp_path,
        "import sys, spawn_extra\nprint(spawn_extra.NAME, sys.path.index(sys.argv[1]))\n",
    )
    done = _spawn.run(
        [sys.executable, str(script), str(extra)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(extra)},
    )
    assert done.stdout == "from PYTHONPATH 1\n", done.stderr


def test_signals(tmp_path: Path, mode: str) -> None:
    script = _script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    for sig in (signal.SIGKILL, signal.SIGTERM):
        proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, text=True)
        _kind(proc, mode)
        _wait_line(proc, "ready")
        os.kill(proc.pid, 0)  # a real process of its own
        assert proc.poll() is None
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == -sig
        assert proc.stdout is not None
        proc.stdout.close()
    # SIGINT: a fresh interpreter turns it into KeyboardInterrupt (traceback, then death by
    # SIGINT), unless its parent ignores SIGINT (as xdist's workers do): then so does it
    waiter = _script(
        tmp_path,
        "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\nprint('still here')\n",
        "waiter.py",
    )
    for handler in (signal.default_int_handler, signal.SIG_IGN):
        old = signal.signal(signal.SIGINT, handler)
        try:
            proc = _spawn.Popen(
                [sys.executable, str(waiter)],
                stdin=_spawn.PIPE,
                stdout=_spawn.PIPE,
                stderr=_spawn.PIPE,
                text=True,
            )
        finally:
            signal.signal(signal.SIGINT, old)
        _kind(proc, mode)
        _wait_line(proc, "ready")
        proc.send_signal(signal.SIGINT)  # pending before the line below reaches it
        out, err = proc.communicate("go on\n", timeout=60)
        if handler is signal.SIG_IGN:
            assert (proc.returncode, out, err) == (0, "still here\n", "")
        else:
            assert proc.returncode == -signal.SIGINT, err
            assert err.startswith("Traceback") and err.endswith("KeyboardInterrupt\n"), err
            assert out == ""
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, text=True)
    _wait_line(proc, "ready")
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    proc.kill()  # already reaped: nothing happens
    assert proc.stdout is not None
    proc.stdout.close()


def test_atexit_and_non_daemon_threads_at_exit(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path,
        """
        import atexit, sys, threading, time
        atexit.register(print, "atexit ran", flush=True)
        def late():
            time.sleep(0.2)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        print("main done", flush=True)
        sys.exit(4)
        """,
    )
    done = _spawn.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert done.stdout.splitlines() == ["main done", "thread done", "atexit ran"]


def test_wait_timeout_and_run_timeout(tmp_path: Path, mode: str) -> None:
    script = _script(tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.2)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _spawn.run([sys.executable, str(script)], capture_output=True, text=True, timeout=2)
    assert time.monotonic() - started < 60
    # the output so far, as bytes even in text mode (as subprocess.run gives it)
    assert caught.value.stdout in (None, b"ready\n")


def test_check_raises_called_process_error(tmp_path: Path, mode: str) -> None:
    script = _script(tmp_path, "import sys\nprint('out')\nsys.exit(5)\n")
    with pytest.raises(subprocess.CalledProcessError) as caught:
        _spawn.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert (caught.value.returncode, caught.value.stdout) == (5, "out\n")


def test_two_children_at_once(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        print("up", flush=True)
        print(sys.stdin.readline().strip().upper(), flush=True)
        """,
    )
    a, b = (
        _spawn.Popen(
            [sys.executable, str(script)], stdin=_spawn.PIPE, stdout=_spawn.PIPE, text=True
        )
        for _ in range(2)
    )
    _wait_line(a, "up")
    _wait_line(b, "up")
    assert a.pid != b.pid
    assert b.communicate("second\n", timeout=60)[0] == "SECOND\n"
    assert a.poll() is None  # still waiting on its stdin
    assert a.communicate("first\n", timeout=60)[0] == "FIRST\n"
    assert (a.returncode, b.returncode) == (0, 0)


def test_devnull_and_inherited_descriptors(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path, "import sys\nprint(repr(sys.stdin.read()))\nprint('err', file=sys.stderr)\n"
    )
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        done = _spawn.run(
            [sys.executable, str(script)], stdin=_spawn.DEVNULL, stdout=f, stderr=_spawn.STDOUT
        )
    assert done.returncode == 0
    assert out.read_text() == "''\nerr\n"


def test_the_child_is_forked_from_the_warm_server(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nprint('stepstone.cli' in sys.modules)\n")
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, text=True)
    assert isinstance(proc, _spawn.Child)
    assert proc.communicate(timeout=60)[0] == "True\n"
    assert _spawn.server().hello["threads"] == 1


def test_the_server_holds_only_its_sockets_and_one_thread() -> None:
    hello = _spawn.server().hello
    assert hello["threads"] == 1
    assert hello["fds"] == [0, 1, 2, *hello["sockets"]]  # no store, socket or file left open


def test_children_draw_different_random_numbers(tmp_path: Path, mode: str) -> None:
    script = _script(
        tmp_path,
        "import random, secrets, uuid\n"
        "print(random.random(), secrets.token_hex(8), uuid.uuid4(), uuid.uuid1())\n",
    )
    outs = [
        _spawn.run([sys.executable, str(script)], capture_output=True, text=True).stdout.split()
        for _ in range(3)
    ]
    for column in zip(*outs, strict=True):
        assert len(set(column)) == 3, outs


def test_what_a_forked_child_cannot_be_goes_to_subprocess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path, "import sys\nprint(hash('stepstone'))\n")
    calls: list[list[str]] = [
        [sys.executable, "-c", "print(1)"],
        [sys.executable, "-X", "dev", str(script)],
        [sys.executable, str(tmp_path / "missing.py")],
        ["/bin/echo", "hi"],
    ]
    for argv in calls:
        proc = _spawn.Popen(argv, stdout=_spawn.PIPE, stderr=_spawn.PIPE)
        assert isinstance(proc, subprocess.Popen), argv
        proc.communicate(timeout=60)
    # an argument the fork server does not honour
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, preexec_fn=os.getpid)
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)
    # a start-up variable of a fresh interpreter: the server refuses, a fresh one runs it
    seeded = [
        _spawn.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "7"},
        ).stdout
        for _ in range(2)
    ]
    assert (
        seeded[0]
        == seeded[1]
        == subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "7"},
        ).stdout
    )
    # a directory on the child's path that would shadow a preloaded module
    (tmp_path / "openai.py").write_text("")
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE)
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, fresh=True)
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)
    (tmp_path / "openai.py").unlink()
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE, fresh=True)
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)
    monkeypatch.setenv("STEPSTONE_TEST_FRESH_PROCESSES", "1")
    proc = _spawn.Popen([sys.executable, str(script)], stdout=_spawn.PIPE)
    assert isinstance(proc, subprocess.Popen)
    proc.communicate(timeout=60)


def test_the_server_is_gone_after_close(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('hi')\n")
    server = _spawn._Server(preload=False)
    try:
        child = server.spawn(
            [sys.executable, str(script)], None, str(script), {"stdout": _spawn.PIPE}
        )
        assert child is not None
        assert child.communicate(timeout=60) == (b"hi\n", None)
    finally:
        server.close()
    assert server.proc.returncode == 0  # waited for: its CPU counts as this process's
    with pytest.raises(ProcessLookupError):
        os.kill(server.proc.pid, 0)


def test_the_server_ends_with_its_test_process() -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom tests import _spawn\n"
            "server = _spawn._Server(preload=False)\n"
            "print(server.proc.pid, flush=True)\ntime.sleep(120)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    zygote = int(holder.stdout.readline())
    holder.kill()  # no atexit: only the socket's close and the parent check remain
    holder.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while process_alive(zygote, None):  # gone, or a zombie: ended
        assert time.monotonic() < deadline, "the fork server outlived its test process"
        time.sleep(0.05)


def test_no_test_sets_a_variable_the_preloaded_modules_read_at_import() -> None:
    """A variable read while the server imported its modules is either in the start-up set
    (a child with another value gets a fresh interpreter) or set by no test: otherwise a
    forked child would see the server's value, not its own."""
    read = set(_spawn.server().hello["env_reads"])
    assert "OPENAI_LOG" in read  # the recording works (openai reads it at import)
    loose = {k for k in read if not _zygote.startup_environment({k: ""})}
    assert "PYTHONHASHSEED" not in loose and "LANG" not in loose
    here = {Path(__file__).resolve(), Path(_zygote.__file__).resolve()}
    for path in sorted(ROOT.joinpath("tests").rglob("*.py")):
        if path.resolve() in here:
            continue
        text = path.read_text()
        for name in loose:
            for use in (f'"{name}"', f"'{name}'", f"{name}="):
                assert use not in text, (path, name)
