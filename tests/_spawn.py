"""Python child processes for the tests, forked from a warmed interpreter.

``Popen`` and ``run`` take the arguments of :mod:`subprocess`'s. When the command is a
Python child, ``[sys.executable, "-m", module, ...]`` or ``[sys.executable, "script.py",
...]``, with only the arguments listed in ``_POPEN_ARGS``, the child is forked from a fork
server (``tests/_zygote.py``) that has already imported stepstone, its CLI and the SDKs
the children use; that saves the 0.3-2 s of CPU each fresh interpreter spends importing
them. The child is a real process (its own pid, killable with SIGKILL, its own stdio,
environment and working directory), set up as a fresh interpreter would be for that
command, running its target as ``__main__`` and leaving through the interpreter's normal
exit. Anything else (``-c``, interpreter flags, other programs, other arguments, a change
of a start-up variable such as PYTHONHASHSEED, a directory on the child's path that would
shadow a preloaded module) runs in a fresh process through :mod:`subprocess`, unchanged.

What a forked child sees differently from a fresh interpreter: the preloaded modules are
already in ``sys.modules`` (a test of import-time behaviour, of a missing extra or of
start-up time must use :mod:`subprocess` itself; their objects are frozen with
``gc.freeze``, so collections and the exit skip them), ``os.getppid()`` is the fork
server, ``ps`` shows the server's command line, ``sys.flags`` and the string-hash seed are
the server's (shared by its children), and ``sys.excepthook`` is a wrapper that leaves the
server's frames out of a traceback (what it prints is what a fresh interpreter prints).

One fork server per test process (each xdist worker), started on first use and closed at
exit (it also ends when the test process's end of its socket closes, or when its parent
is gone). ``STEPSTONE_TEST_FRESH_PROCESSES=1`` makes every child a fresh interpreter, as
before this module existed.
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeAlias

PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL

ROOT = Path(__file__).resolve().parents[1]

#: The keyword arguments a forked child honours; any other sends the call to subprocess.
_POPEN_ARGS = frozenset(
    {
        "stdin",
        "stdout",
        "stderr",
        "text",
        "universal_newlines",
        "encoding",
        "errors",
        "env",
        "cwd",
        "start_new_session",
        "bufsize",
        "close_fds",
    }
)
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def fresh_only() -> bool:
    """Whether every child must be a fresh interpreter (STEPSTONE_TEST_FRESH_PROCESSES=1)."""
    return os.environ.get("STEPSTONE_TEST_FRESH_PROCESSES") == "1"


class Child:
    """A forked child: the part of :class:`subprocess.Popen` the tests use."""

    def __init__(
        self,
        args: Any,
        pid: int,
        pidfd: int,
        conn: socket.socket,
        pipes: tuple[int, int, int],
        *,
        text: bool,
        encoding: str | None,
        errors: str | None,
        bufsize: int,
    ) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.text_mode = text
        self.encoding, self.errors = encoding, errors
        self._conn = conn
        self._pidfd = pidfd
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_handles, conn, pidfd)
        stdin_w, stdout_r, stderr_r = pipes
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        if stdin_w != -1:
            self.stdin = open(stdin_w, "wb", bufsize)  # noqa: SIM115 (kept, as Popen does)
            if text:
                self.stdin = io.TextIOWrapper(
                    self.stdin,  # type: ignore[arg-type]
                    write_through=True,
                    encoding=encoding,
                    errors=errors,
                )
        if stdout_r != -1:
            self.stdout = open(stdout_r, "rb", bufsize)  # noqa: SIM115
            if text:
                self.stdout = io.TextIOWrapper(self.stdout, encoding=encoding, errors=errors)  # type: ignore[arg-type]
        if stderr_r != -1:
            self.stderr = open(stderr_r, "rb", bufsize)  # noqa: SIM115
            if text:
                self.stderr = io.TextIOWrapper(self.stderr, encoding=encoding, errors=errors)  # type: ignore[arg-type]
        self._communication_started = False
        self._output: dict[IO[Any], list[bytes]] = {}
        self._input: bytes | None = None
        self._input_offset = 0

    def __repr__(self) -> str:
        return f"<forked Child: returncode: {self.returncode} args: {self.args!r}>"

    # -- exit status ---------------------------------------------------------------------

    def _read_status(self, timeout: float | None) -> None:
        """Take the exit status from the fork server if it comes within ``timeout``."""
        if not _ready({self._conn.fileno(): select.POLLIN}, timeout):
            return
        msg = self._conn.recv(4096)
        if not msg:
            raise RuntimeError(
                f"the fork server (tests/_zygote.py) ended before child {self.pid} did"
            )
        self.returncode = json.loads(msg)["rc"]

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                if self.returncode is None:
                    self._read_status(0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            if self._lock.acquire(timeout=-1 if left is None else left):
                try:
                    if self.returncode is None:
                        self._read_status(left)
                finally:
                    self._lock.release()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.poll()
        if self.returncode is not None:
            return  # as subprocess: never signal a process already reaped
        try:
            signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
            pass  # it has just ended

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    # -- pipes ---------------------------------------------------------------------------

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdout:
            self.stdout.close()
        if self.stderr:
            self.stderr.close()
        try:
            if self.stdin:
                self.stdin.close()
        finally:
            self.wait()

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As :meth:`subprocess.Popen.communicate` (its POSIX implementation)."""
        if self._communication_started and input:
            raise ValueError("Cannot send input after starting communication")
        pipes = [self.stdin, self.stdout, self.stderr]
        if timeout is None and not self._communication_started and pipes.count(None) >= 2:
            stdout = stderr = None
            if self.stdin:
                self._stdin_write(input)
            elif self.stdout:
                stdout = self.stdout.read()
                self.stdout.close()
            elif self.stderr:
                stderr = self.stderr.read()
                self.stderr.close()
            self.wait()
            return stdout, stderr
        endtime = None if timeout is None else time.monotonic() + timeout
        try:
            return self._communicate(input, endtime, timeout)
        finally:
            self._communication_started = True

    def _stdin_write(self, input: Any) -> None:
        assert self.stdin is not None
        if input:
            try:
                self.stdin.write(input)
            except BrokenPipeError:
                pass
        try:
            self.stdin.close()
        except BrokenPipeError:
            pass

    def _left(self, endtime: float | None) -> float | None:
        return None if endtime is None else endtime - time.monotonic()

    def _timeout(
        self, timeout: float | None, out: list[bytes] | None, err: list[bytes] | None
    ) -> None:
        raise subprocess.TimeoutExpired(
            self.args,
            timeout,  # type: ignore[arg-type]
            output=b"".join(out) if out else None,
            stderr=b"".join(err) if err else None,
        )

    def _communicate(
        self, input: Any, endtime: float | None, timeout: float | None
    ) -> tuple[Any, Any]:
        if self.stdin and not self._communication_started:
            try:
                self.stdin.flush()
            except BrokenPipeError:
                pass
            if not input:
                try:
                    self.stdin.close()
                except BrokenPipeError:
                    pass
        if not self._communication_started:
            self._output = {}
            if self.stdout:
                self._output[self.stdout] = []
            if self.stderr:
                self._output[self.stderr] = []
        out = self._output[self.stdout] if self.stdout else None
        err = self._output[self.stderr] if self.stderr else None
        if self.stdin and self._input is None:
            self._input = input
            if self.text_mode and input is not None:
                self._input = input.encode(self.stdin.encoding, self.stdin.errors)
        readers = {f.fileno(): f for f in (self.stdout, self.stderr) if f and not f.closed}
        writer = self.stdin if self.stdin and input and not self.stdin.closed else None
        while readers or writer:
            left = self._left(endtime)
            if left is not None and left < 0:
                self._timeout(timeout, out, err)
            wanted = dict.fromkeys(readers, select.POLLIN)
            if writer is not None:
                wanted[writer.fileno()] = select.POLLOUT
            ready = _ready(wanted, left)
            ready_r = [fd for fd in ready if fd in readers]
            ready_w = writer is not None and writer.fileno() in ready
            left = self._left(endtime)
            if left is not None and left < 0:
                self._timeout(timeout, out, err)
            if ready_w and writer is not None:
                assert self._input is not None
                chunk = self._input[self._input_offset : self._input_offset + select.PIPE_BUF]
                try:
                    self._input_offset += os.write(writer.fileno(), chunk)
                except BrokenPipeError:
                    writer.close()
                    writer = None
                else:
                    if self._input_offset >= len(self._input):
                        writer.close()
                        writer = None
            for fd in ready_r:
                data = os.read(fd, 32768)
                f = readers[fd]
                if not data:
                    del readers[fd]
                    f.close()
                self._output[f].append(data)
        self.wait(timeout=self._left(endtime))
        stdout: Any = b"".join(out) if out is not None else None
        stderr: Any = b"".join(err) if err is not None else None
        if self.text_mode:
            if stdout is not None:
                assert self.stdout is not None
                stdout = _newlines(stdout, self.stdout.encoding, self.stdout.errors)
            if stderr is not None:
                assert self.stderr is not None
                stderr = _newlines(stderr, self.stderr.encoding, self.stderr.errors)
        return stdout, stderr


Process: TypeAlias = "subprocess.Popen[Any] | Child"


def _ready(wanted: dict[int, int], timeout: float | None) -> set[int]:
    """The fds of ``wanted`` ready within ``timeout`` seconds (poll(2), as subprocess:
    select(2) fails on fd numbers over 1023)."""
    poller = select.poll()
    for fd, events in wanted.items():
        poller.register(fd, events)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return {fd for fd, _ in poller.poll(ms)}


def _newlines(data: bytes, encoding: str, errors: str) -> str:
    return data.decode(encoding, errors).replace("\r\n", "\n").replace("\r", "\n")


def _close_handles(conn: socket.socket, pidfd: int) -> None:
    conn.close()
    os.close(pidfd)


def _target(args: Any, kwargs: Mapping[str, Any]) -> tuple[str | None, str | None] | None:
    """``(module, None)`` or ``(None, script)`` when a forked child can run this, else None."""
    if fresh_only() or not set(kwargs) <= _POPEN_ARGS or not isinstance(args, list | tuple):
        return None
    if kwargs.get("close_fds", True) is not True or kwargs.get("bufsize", -1) not in (-1, 0):
        return None
    if kwargs.get("stderr") == STDOUT and kwargs.get("stdout") is None:
        return None
    try:
        argv = [os.fspath(a) for a in args]
    except TypeError:
        return None
    if len(argv) < 2 or argv[0] != sys.executable or not all(isinstance(a, str) for a in argv):
        return None
    env = kwargs.get("env")
    if env is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return None
    cwd = os.fspath(kwargs["cwd"]) if kwargs.get("cwd") is not None else os.getcwd()
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        return None
    if argv[1] == "-m":
        if len(argv) >= 3 and _MODULE.fullmatch(argv[2]):
            return argv[2], None
        return None
    script = argv[1]
    if script.startswith("-") or not script.endswith(".py"):
        return None
    if not os.path.isfile(os.path.join(cwd, script)):
        return None
    return None, script


class _Server:
    """This process's fork server."""

    def __init__(self, *, preload: bool = True) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        bare = [] if preload else ["--bare"]  # for tests of the server's own life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests._zygote", str(theirs.fileno()), *bare],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        self.ctl = ours
        self.owner = os.getpid()
        self.lock = threading.Lock()
        hello = ours.recv(1 << 20)
        if not hello:
            code = self.proc.wait()
            ours.close()
            raise RuntimeError(
                f"the fork server (tests/_zygote.py) failed to start (exit {code}); "
                "its traceback is on stderr; STEPSTONE_TEST_FRESH_PROCESSES=1 runs without it"
            )
        self.hello: dict[str, Any] = json.loads(hello)

    def close(self) -> None:
        self.ctl.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def spawn(
        self, args: Any, module: str | None, script: str | None, kw: dict[str, Any]
    ) -> Child | None:
        """A forked child, or None when the server says it needs a fresh interpreter."""
        argv = [os.fspath(a) for a in args]
        env = dict(os.environ if kw.get("env") is None else kw["env"])
        cwd = os.path.abspath(os.fspath(kw["cwd"]) if kw.get("cwd") is not None else os.getcwd())
        request = {
            "argv": argv,
            "module": module,
            "script": script,
            "env": env,
            "cwd": cwd,
            "setsid": bool(kw.get("start_new_session", False)),
            "ignored_signals": _ignored_signals(),
        }
        child_fds, parent_fds, opened = _stdio(kw)
        conn, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                socket.send_fds(
                    self.ctl, [json.dumps(request).encode()], [*child_fds, theirs.fileno()]
                )
        except BaseException:
            conn.close()
            for fd in parent_fds:
                if fd != -1:
                    os.close(fd)
            raise
        finally:
            theirs.close()
            for fd in opened:
                os.close(fd)
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
        if not msg:
            conn.close()
            raise RuntimeError(
                "the fork server (tests/_zygote.py) ended; its traceback is on stderr"
            )
        answer = json.loads(msg)
        if "fresh" in answer:
            conn.close()
            for fd in parent_fds:
                if fd != -1:
                    os.close(fd)
            return None
        text = bool(
            kw.get("text") or kw.get("universal_newlines") or kw.get("encoding") or kw.get("errors")
        )
        encoding = kw.get("encoding")
        if text and encoding is None:
            encoding = "utf-8" if sys.flags.utf8_mode else locale.getencoding()
        return Child(
            args,
            answer["pid"],
            fds[0],
            conn,
            (parent_fds[0], parent_fds[1], parent_fds[2]),
            text=text,
            encoding=encoding,
            errors=kw.get("errors"),
            bufsize=kw.get("bufsize", -1),
        )


def _ignored_signals() -> list[int]:
    """The signals this process ignores: a fresh child inherits that across exec (bar the
    ones subprocess restores to the default: SIGPIPE, SIGXFSZ)."""
    restored = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP}
    return [
        int(sig)
        for sig in signal.valid_signals()
        if sig not in restored and signal.getsignal(sig) == signal.SIG_IGN
    ]


def _stdio(kw: Mapping[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """The child's fds 0-2, the parent's ends of its pipes (-1: none), the fds to close
    once sent (the child's ends of the pipes, /dev/null)."""
    child: list[int] = []
    parent = [-1, -1, -1]
    opened: list[int] = []
    for n, name in enumerate(("stdin", "stdout", "stderr")):
        value = kw.get(name)
        if value is None:
            child.append(n)
        elif value == PIPE:
            r, w = os.pipe()
            mine, theirs = (w, r) if n == 0 else (r, w)
            parent[n] = mine
            child.append(theirs)
            opened.append(theirs)
        elif value == DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            child.append(fd)
            opened.append(fd)
        elif value == STDOUT and n == 2:
            child.append(child[1])
        elif isinstance(value, int):
            child.append(value)
        else:
            child.append(value.fileno())
    return child, parent, opened


_server: _Server | None = None
_server_lock = threading.Lock()


def server() -> _Server:
    """This process's fork server, started on first use."""
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid():
            _server = _Server()
            atexit.register(close)
        return _server


def close() -> None:
    """Stop this process's fork server (its running children go on, as orphans)."""
    global _server
    with _server_lock:
        found, _server = _server, None
    if found is not None and found.owner == os.getpid():
        found.close()


def Popen(args: Sequence[Any], *, fresh: bool = False, **kwargs: Any) -> Process:  # noqa: N802 (subprocess's name)
    """:class:`subprocess.Popen`, forked from the warmed server where it can be.

    ``fresh=True``: a fresh interpreter all the same (a test that keeps one on purpose)."""
    target = None if fresh else _target(args, kwargs)
    if target is not None:
        child = server().spawn(args, *target, dict(kwargs))
        if child is not None:
            return child
    return subprocess.Popen(args, **kwargs)


def run(
    args: Sequence[Any],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    fresh: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run`, forked from the warmed server where it can be (``fresh``:
    as :func:`Popen`)."""
    if input is not None:
        if kwargs.get("stdin") is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        kwargs["stdin"] = PIPE
    if capture_output:
        if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
            raise ValueError("stdout and stderr arguments may not be used with capture_output.")
        kwargs["stdout"] = kwargs["stderr"] = PIPE
    with Popen(args, fresh=fresh, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()  # as subprocess on POSIX: the exception holds the output so far
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
        assert code is not None
        if check and code:
            raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)
