"""A throwaway PostgreSQL server for tests and benchmarks.

``PgServer`` runs ``initdb`` into a fresh temporary directory and starts ``postgres`` on a
free loopback port (127.0.0.1 only, its unix socket inside the temporary directory), with
password authentication and a password full of URL-hostile characters, so every URL the
tests build must percent-encode it. PostgreSQL refuses to run as root: when we are root the
server runs as the ``postgres`` OS user, which owns the temporary directory.

Nothing is left behind: :meth:`PgServer.close` stops the server and deletes the directory.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

__all__ = ["PASSWORD", "SUPERUSER", "CutProxy", "PgServer", "find_bindir", "unavailable_reason"]

#: The superuser's password: '@', ':', '/', '%', '?' and '#' all break an unencoded URL.
PASSWORD = "p@ss:w/rd%?#"
SUPERUSER = "stepstone"
_OS_USER = "postgres"


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        bindir = Path(initdb).resolve().parent
        if (bindir / "pg_ctl").exists():
            return bindir
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _others_can_enter(path: str) -> bool:
    """Whether every directory on ``path`` lets other users through (the x bit)."""
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & 0o001 for d in (p, *p.parents))


def unavailable_reason() -> str | None:
    """Why no test server can be started here, or None when one can."""
    if find_bindir() is None:
        return (
            "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under "
            "/usr/lib/postgresql/*/bin"
        )
    if _is_root():
        try:
            import pwd

            pwd.getpwnam(_OS_USER)
        except KeyError:
            return f"running as root and there is no {_OS_USER!r} OS user to run the server"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One PostgreSQL server in a temporary directory (see module docstring).

    Args:
        fsync: Keep PostgreSQL's fsync on (benchmarks) or turn it off (tests: faster; a
            server crash, as opposed to a machine crash, still keeps every committed
            transaction, since ``synchronous_commit`` stays on).
    """

    def __init__(self, *, fsync: bool = False) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        bindir = find_bindir()
        assert bindir is not None
        self.bindir = bindir
        self.fsync = fsync
        # As root the server runs as the postgres user, who must be able to reach the data
        # directory: a private TMPDIR (mode 0700) would lock it out, so use /tmp then.
        base = "/tmp" if _is_root() and not _others_can_enter(tempfile.gettempdir()) else None
        self.root = Path(tempfile.mkdtemp(prefix="stepstone-pg-", dir=base))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.running = False
        try:
            if _is_root():
                import pwd

                entry = pwd.getpwnam(_OS_USER)
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._initdb()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- process control -------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if _is_root():
            if shutil.which("runuser"):
                cmd = ["runuser", "-u", _OS_USER, "--", *cmd]
            else:
                cmd = ["su", _OS_USER, "-s", "/bin/sh", "-c", shlex.join(cmd)]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root, check=False
        )

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n", encoding="utf-8")
        if _is_root():
            import pwd

            entry = pwd.getpwnam(_OS_USER)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        done = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the server: on a free port the first time, on the same port after a stop."""
        fixed = bool(self.port)
        log = ""
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = _free_port()
            conf = {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self.root}'",
                "fsync": "on" if self.fsync else "off",
                "full_page_writes": "on" if self.fsync else "off",
                "max_connections": "200",
                "shared_buffers": "32MB",
            }
            (self.data / "postgresql.auto.conf").write_text(
                "".join(f"{k} = {v}\n" for k, v in conf.items()), encoding="utf-8"
            )
            done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "start")
            if done.returncode == 0:
                self.running = True
                return
            log = (
                self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
            )
            if "could not bind" not in log and "already in use" not in log:
                break
        raise RuntimeError(f"pg_ctl start failed:\n{done.stdout}{done.stderr}\n{log[-4000:]}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (clients disconnected, clean) or ``immediate`` (crash)."""
        if not self.running:
            return
        done = self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed:\n{done.stdout}{done.stderr}")
        self.running = False

    def restart(self, *, down_for: float = 0.0, mode: str = "fast") -> None:
        """Stop the server, keep it down ``down_for`` seconds, start it on the same port."""
        self.stop(mode)
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        """Stop the server and delete its directory."""
        try:
            self.stop("fast")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- databases ---------------------------------------------------------------------------
    def url(self, dbname: str = "postgres") -> str:
        """A ``postgresql://`` URL for ``dbname``, the password percent-encoded."""
        user = quote(SUPERUSER, safe="")
        password = quote(PASSWORD, safe="")
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser on the ``postgres`` database (autocommit)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping an old one) and return its URL."""
        ident = '"' + name.replace('"', '""') + '"'
        self.admin(f"DROP DATABASE IF EXISTS {ident} WITH (FORCE)")
        self.admin(f"CREATE DATABASE {ident}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, disconnecting its clients."""
        ident = '"' + name.replace('"', '""') + '"'
        self.admin(f"DROP DATABASE IF EXISTS {ident} WITH (FORCE)")


class CutProxy:
    """A loopback TCP proxy in front of a server that can cut one connection on cue.

    :meth:`arm` names a byte string and a mode. The next client message containing it is
    either dropped (``"before"``: the server never sees it) or forwarded with whatever the
    client sends in the next 0.3 s (``"after"``: the server runs it, then the connection
    is cut before any answer gets back). Both sides
    of that connection are then closed, exactly like a network cut. A real component
    between the client and the real server, not a stand-in for either.
    """

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed: tuple[bytes, str] | None = None
        self._socks: list[socket.socket] = []
        self._closed = False
        self.cuts = 0
        self.forwarded: list[bytes] = []
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    def url_for(self, url: str) -> str:
        """``url`` (a database of the proxied server) through this proxy."""
        return url.replace(f"127.0.0.1:{self.target_port}/", f"127.0.0.1:{self.port}/")

    def arm(self, marker: bytes, mode: str) -> None:
        """Cut the connection carrying the next client message that contains ``marker``."""
        if mode not in ("before", "after"):
            raise ValueError(mode)
        with self._lock:
            self._armed = (marker, mode)

    def seen(self, marker: bytes) -> int:
        """How many forwarded client messages contained ``marker``."""
        with self._lock:
            return sum(marker in chunk for chunk in self.forwarded)

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()  # server down: the client sees a refused/closed connection
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._socks += [client, upstream]
            muted = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, muted), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, muted), daemon=True).start()

    @staticmethod
    def _cut(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _up(self, client: socket.socket, upstream: socket.socket, muted: Any) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._cut(client, upstream)
                return
            with self._lock:
                armed = self._armed
                hit = armed is not None and armed[0] in data
                if hit:
                    self._armed = None
                    self.cuts += 1
                if not (hit and armed is not None and armed[1] == "before"):
                    self.forwarded.append(data)
            if hit and armed is not None and armed[1] == "before":
                self._cut(client, upstream)
                return
            if hit:
                muted.set()  # from now on the server's answers are dropped
            try:
                upstream.sendall(data)
            except OSError:
                self._cut(client, upstream)
                return
            if hit:
                # The rest of the request (a pipeline's Sync may follow in its own packet)
                # still goes through for a moment; then the cut, before any answer.
                until = time.monotonic() + 0.3
                while (left := until - time.monotonic()) > 0:
                    client.settimeout(left)
                    try:
                        more = client.recv(65536)
                    except OSError:  # timeout (or the client went away)
                        break
                    if not more:
                        break
                    with self._lock:
                        self.forwarded.append(more)
                    try:
                        upstream.sendall(more)
                    except OSError:
                        break
                time.sleep(max(0.0, until - time.monotonic()))
                self._cut(client, upstream)
                return

    def _down(self, upstream: socket.socket, client: socket.socket, muted: Any) -> None:
        while True:
            try:
                data = upstream.recv(65536)
                if not data:
                    break
                if not muted.is_set():
                    client.sendall(data)
            except OSError:
                break
        self._cut(client, upstream)

    def close(self) -> None:
        """Stop accepting and cut every connection."""
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        self._listener.close()
        self._cut(*socks)
