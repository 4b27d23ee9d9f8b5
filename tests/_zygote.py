"""The fork server behind :mod:`tests._spawn` (run as ``python -m tests._zygote FD``).

It imports the modules the tests' child processes import (stepstone, its CLI, the SDKs),
then waits on its control socket (``FD``, a ``SOCK_SEQPACKET`` socket from the test
process). Each request carries a child's argv, environment, working directory and the
three file descriptors for its stdin, stdout and stderr, plus a socket to answer on. The
server forks; the forked child turns itself into what ``python -m mod ...`` or ``python
script.py ...`` would be (see :func:`_become` and :func:`_run`) and runs the target at the
top level of this module, so it leaves through the interpreter's own exit: ``SystemExit``,
an uncaught exception (traceback, exit 1), a ``KeyboardInterrupt`` (death by SIGINT),
atexit handlers, the join of non-daemon threads and the flush of stdio all happen as in a
fresh interpreter. The server reaps its children and sends each one's exit status back.

It stays single-threaded, holds no file open but its sockets, and ends when the control
socket closes or its parent (the test process) is gone.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

#: Imported once here, so a child starts with them. Each reads no environment variable at
#: import time that a test sets for its children (tests/test_spawn.py checks the list).
PRELOAD = (
    "stepstone",
    "stepstone.cli",
    "stepstone.testing",
    "stepstone.worker",
    "stepstone.graph",
    "stepstone.integrations",
    "stepstone.integrations.openai_agents",
    "stepstone.integrations.pydantic_ai",
    "openai",
    "agents",
    "pydantic_ai",
    "pydantic_ai.models.openai",
    "psycopg",
)

#: Environment variables read at interpreter start-up, or at the import of a preloaded
#: module, that a child may not change: a request whose value differs from the server's
#: gets a fresh interpreter instead. (PYTHONPATH, PYTHONUNBUFFERED and
#: PYTHONDONTWRITEBYTECODE are applied per child.)
PER_CHILD = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
_LOCALE = ("LANG", "LANGUAGE", "TZ", "HOME")

#: The environment variables read while importing :data:`PRELOAD` (tests/test_spawn.py
#: checks that no test sets one of them for a child, unless it is in the start-up set).
ENV_READS: set[str] = set()

_MAX_MESSAGE = 1 << 20
_HERE = os.path.abspath(__file__)


def startup_environment(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` a child must share with the server (see :data:`PER_CHILD`)."""
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(("PYTHON", "LC_")) and k not in PER_CHILD) or k in _LOCALE
    }


@dataclasses.dataclass
class _Job:
    """What a forked child must become."""

    request: dict[str, Any]
    fds: list[int]
    conn: socket.socket
    close: list[socket.socket]


class _Server:
    def __init__(self, ctl: socket.socket, base_path: list[str]) -> None:
        self.ctl = ctl
        self.base_path = base_path
        self.env = startup_environment(dict(os.environ))
        self.children: dict[int, socket.socket] = {}
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.ppid = os.getppid()
        self.origins = {
            name: _origin(sys.modules[name])
            for name in {m.partition(".")[0] for m in PRELOAD}
            if name in sys.modules
        }

    def serve(self) -> _Job | None:
        """Serve until the control socket closes (None); in a forked child, its job."""
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            ready, _, _ = select.select([self.ctl, self.wake_r], [], [], 1.0)
            if self.wake_r in ready:
                while _drained(self.wake_r):
                    pass
            self.reap()
            if os.getppid() != self.ppid:
                return None  # the test process is gone
            if self.ctl in ready:
                msg, fds, _, _ = socket.recv_fds(self.ctl, _MAX_MESSAGE, 4)
                if not msg:
                    return None
                job = self.handle(json.loads(msg), fds)
                if job is not None:
                    return job

    def handle(self, request: dict[str, Any], fds: list[int]) -> _Job | None:
        conn = socket.socket(fileno=fds[3])
        reason = self.refusal(request)
        if reason is not None:
            _send(conn, {"fresh": reason})
            conn.close()
            for fd in fds[:3]:
                os.close(fd)
            return None
        assert threading.active_count() == 1, threading.enumerate()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            others = [self.ctl, self.wake_r, self.wake_w, *self.children.values()]
            return _Job(request=request, fds=fds[:3], conn=conn, close=others)
        for fd in fds[:3]:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            _send(conn, {"pid": pid}, [pidfd])
        finally:
            os.close(pidfd)
        self.children[pid] = conn
        return None

    def refusal(self, request: dict[str, Any]) -> str | None:
        """Why this child needs a fresh interpreter, or None."""
        env = startup_environment(request["env"])
        if env != self.env:
            differ = sorted(
                k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)
            )
            return f"start-up environment differs: {', '.join(differ)}"
        for directory in _prefix(request):
            for name, origin in self.origins.items():
                found = _found_in(directory, name)
                if found is not None and found != origin:
                    return f"{found} would shadow the preloaded {name}"
        return None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                _send(conn, {"rc": os.waitstatus_to_exitcode(status)})
                conn.close()


def _ignore(signum: int, frame: object) -> None:
    """SIGCHLD's handler: the wake-up fd does the work."""


def _drained(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(4096))
    except BlockingIOError:
        return False


def _send(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    try:
        socket.send_fds(conn, [json.dumps(message).encode()], fds or [])
    except OSError:
        pass  # the test process let go of this child


def _origin(module: types.ModuleType) -> str | None:
    """Where a top-level module was imported from: its package directory or its file."""
    paths = getattr(module, "__path__", None)
    if paths:
        return os.path.realpath(next(iter(paths)))
    file = getattr(module, "__file__", None)
    return os.path.realpath(file) if file else None


def _found_in(directory: str, name: str) -> str | None:
    """What ``import name`` would find in ``directory`` (a package or module), if anything."""
    candidate = os.path.join(directory, name)
    for suffix in importlib.machinery.all_suffixes():
        if os.path.isfile(os.path.join(candidate, "__init__" + suffix)):
            return os.path.realpath(candidate)
    for suffix in importlib.machinery.all_suffixes():
        if os.path.isfile(candidate + suffix):
            return os.path.realpath(candidate + suffix)
    return None


def _prefix(request: dict[str, Any]) -> list[str]:
    """The entries a fresh interpreter puts before the site paths: the script's directory
    (or, for ``-m``, the working directory), then PYTHONPATH's entries."""
    cwd = request["cwd"]
    if request["module"] is not None:
        first = cwd
    else:
        first = os.path.dirname(os.path.realpath(os.path.join(cwd, request["script"])))
    extra = request["env"].get("PYTHONPATH", "")
    return [first, *(os.path.join(cwd, p) for p in extra.split(os.pathsep) if p)]


def _become(job: _Job, base_path: list[str]) -> None:
    """Turn this forked child into a fresh interpreter's start, short of running the target."""
    request = job.request
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sock in job.close:
        sock.close()
    if request["setsid"]:
        os.setsid()
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
    job.conn.close()
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    _fresh_stdio(buffered=not os.environ.get("PYTHONUNBUFFERED"))
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]  # this server's own package: the child imports it anew, if at all
    prefix = _prefix(request)
    rest: list[str] = []
    for entry in [os.path.abspath(p) for p in prefix[1:]] + base_path:
        if entry not in rest:
            rest.append(entry)
    sys.path[:] = [prefix[0], *rest]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.argv = list(request["argv"][2:] if request["module"] is not None else request["argv"][1:])
    sys.orig_argv = [sys.executable, *request["argv"][1:]]
    if request["module"] is None:
        sys.excepthook = _script_excepthook
    else:
        sys.excepthook = _module_excepthook
    _fresh_signals(set(request["ignored_signals"]))
    gc.enable()


def _fresh_signals(ignored: set[int]) -> None:
    """Signal dispositions as a fresh interpreter started by the test process has them:
    what the test process ignores stays ignored across exec (SIGINT too: then Python
    installs no KeyboardInterrupt handler; xdist's workers ignore SIGINT), every other
    handler is reset to the default, and Python ignores SIGPIPE and SIGXFSZ and turns
    SIGINT into KeyboardInterrupt."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in ignored or sig in (signal.SIGPIPE, signal.SIGXFSZ):
            handler: Any = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError):
            pass  # one the C library keeps for itself


def _fresh_stdio(*, buffered: bool) -> None:
    """sys.stdin/stdout/stderr as the interpreter builds them at start-up, on fds 0-2."""
    streams = []
    for fd, old in enumerate((sys.__stdin__, sys.__stdout__, sys.__stderr__)):
        assert old is not None
        writing = fd > 0
        raw_buffering = -1 if buffered or not writing else 0
        buf = open(fd, "wb" if writing else "rb", raw_buffering, closefd=False)  # noqa: SIM115
        raw = buf.raw if isinstance(buf, io.BufferedIOBase) else buf  # type: ignore[attr-defined]
        stream = io.TextIOWrapper(
            buf,  # type: ignore[arg-type]
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=buffered and (raw.isatty() or fd == 2),
            write_through=not buffered,
        )
        stream.mode = "w" if writing else "r"  # type: ignore[misc]
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _strip(tb: types.TracebackType | None, files: tuple[str, ...]) -> types.TracebackType | None:
    while tb is not None and tb.tb_frame.f_code.co_filename in files:
        tb = tb.tb_next
    return tb


def _module_excepthook(
    kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    """The traceback a fresh ``python -m`` prints: runpy's frames, then the target's (this
    server was itself started with ``-m``, so runpy's frames are the same two)."""
    head = tb
    if head is not None and head.tb_frame.f_code.co_filename == "<frozen runpy>":
        after = head.tb_next
        if after is not None and after.tb_frame.f_code.co_filename == "<frozen runpy>":
            after.tb_next = _strip(after.tb_next, (_HERE,))
    sys.__excepthook__(kind, exc, head)


def _script_excepthook(
    kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None
) -> None:
    """The traceback a fresh ``python script.py`` prints: the script's frames only."""
    tb = _strip(tb, ("<frozen runpy>", _HERE))
    sys.__excepthook__(kind, exc.with_traceback(tb), tb)


def _run(request: dict[str, Any]) -> None:
    """Run the target as ``__main__`` (what ``python -m``/``python script.py`` does).

    runpy.run_module/run_path would put this server's ``__main__`` back in sys.modules (and
    its sys.argv[0]) as soon as the target's code returns or raises, before atexit handlers
    and the join of non-daemon threads; a fresh interpreter keeps the target's ``__main__``
    to the end. So the module is built here and stays."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if request["module"] is not None:
        spec = _main_spec(request["module"])
        assert spec.loader is not None and spec.origin is not None
        code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
        sys.argv[0] = spec.origin
        main.__dict__.update(
            __file__=spec.origin,
            __cached__=spec.cached,
            __loader__=spec.loader,
            __package__=spec.parent,
            __spec__=spec,
        )
    else:
        path = os.path.join(os.getcwd(), request["script"])  # as CPython: joined, not normalised
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        main.__dict__.update(
            __file__=path,
            __cached__=None,
            __loader__=importlib.machinery.SourceFileLoader("__main__", path),
            __package__=None,
            __spec__=None,
        )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _main_spec(name: str) -> importlib.machinery.ModuleSpec:
    """The spec ``python -m name`` runs (a package's ``__main__``), or exit as it does."""
    try:
        spec = importlib.util.find_spec(name)
    except ImportError as exc:
        msg = f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
        raise SystemExit(f"{sys.executable}: {msg}") from None
    if spec is None:
        raise SystemExit(f"{sys.executable}: No module named {name}")
    if spec.submodule_search_locations is not None:
        main = name + ".__main__"
        try:
            inner = importlib.util.find_spec(main)
        except ImportError:
            inner = None
        if inner is None:
            raise SystemExit(
                f"{sys.executable}: No module named {main}; "
                f"{name!r} is a package and cannot be directly executed"
            )
        return inner
    return spec


def _preload() -> None:
    """Import :data:`PRELOAD`, then freeze what they made (gc.freeze, as the gc module's
    documentation advises before forking): a child's collections, and the collection at its
    exit (0.7 s of CPU for the Agents SDK's objects), skip the preloaded objects."""
    gc.disable()
    environ = type(os.environ)
    getitem, contains = environ.__getitem__, environ.__contains__

    def read(self: Any, key: Any) -> Any:
        ENV_READS.add(key)
        return getitem(self, key)

    def has(self: Any, key: Any) -> bool:
        ENV_READS.add(key)
        return contains(self, key)

    environ.__getitem__, environ.__contains__ = read, has  # type: ignore[method-assign]
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        environ.__getitem__, environ.__contains__ = getitem, contains  # type: ignore[method-assign]
    gc.freeze()


def _open_fds() -> list[int]:
    """This process's open file descriptors (fstat: opens nothing itself)."""
    found = []
    for fd in range(min(os.sysconf("SC_OPEN_MAX"), 4096)):
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.append(fd)
    return found


def _main() -> _Job | None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    base_path = list(sys.path[1:])  # sys.path[0] is our working directory (-m)
    if sys.argv[2:] != ["--bare"]:
        _preload()
    server = _Server(ctl, base_path)
    hello = {
        "threads": threading.active_count(),
        "env_reads": sorted(ENV_READS),
        "fds": _open_fds(),
        "sockets": sorted(x.fileno() for x in (ctl, server.wake_r, server.wake_w)),
    }
    _send(ctl, hello)
    job = server.serve()
    if job is not None:
        _become(job, base_path)
    return job


if __name__ == "__main__":
    _job = _main()
    if _job is not None:
        _run(_job.request)
