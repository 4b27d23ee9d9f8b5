"""Starting ``stepstone serve`` as a real process, and reading Server-Sent Events."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

HERE = Path(__file__).parent
SECRET = "whsec_" + "c2VydmUtdGVzdHMtc2VjcmV0LWtleS0zMi1ieXRlcyE="
#: One TLS context for every test client: httpx2 builds (and loads the CA bundle into) a new
#: one per client otherwise, ~25 ms of CPU each, though these servers speak plain HTTP.
TLS = ssl.create_default_context()


@dataclass
class Served:
    """One ``stepstone serve`` process."""

    proc: subprocess.Popen[str]
    url: str
    store: str
    lines: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None

    def _closed(self) -> None:
        if self.drain is not None:
            self.drain.join(60)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def client(self, **kwargs: Any) -> httpx2.Client:
        kwargs.setdefault("verify", TLS)
        return httpx2.Client(base_url=self.url, timeout=60, **kwargs)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)
        self._closed()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(60)
        self._closed()
        return code


def store_args(store: str) -> list[str]:
    return ["--url", store] if "://" in store else ["--db", store]


def start_server(store: str, *args: str, env: dict[str, str] | None = None) -> Served:
    """``stepstone serve`` on ``store`` (a file or a URL), any free port, this folder as
    its import path; waits for the line naming its URL."""
    inherited = {k: v for k, v in os.environ.items() if k != "STEPSTONE_WEBHOOK_SECRET"}
    full_env = {**inherited, "SERVEAPP_STORE": store, **(env or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "serve",
            *store_args(store),
            "--port",
            "0",
            "--import-path",
            str(HERE),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=HERE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    line = proc.stderr.readline()
    lines.append(line)
    if " on http://" not in line:
        rest = proc.stderr.read() if proc.wait(60) is not None else ""
        raise AssertionError(f"stepstone serve did not start: {line}{rest}")
    url = line.split(" on ", 1)[1].split(" ", 1)[0]
    served = Served(proc=proc, url=url, store=store, lines=lines)

    def drain() -> None:  # keep reading stderr so the server never blocks on it
        assert proc.stderr is not None
        for text in proc.stderr:
            lines.append(text)

    served.drain = threading.Thread(target=drain, daemon=True)
    served.drain.start()
    return served


@dataclass
class Event:
    id: str | None
    event: str
    data: str


def sse(
    client: httpx2.Client, path: str, *, last_id: str | None = None, stop_after: int | None = None
) -> Iterator[Event]:
    """The events of ``GET path`` as they come (with ``Last-Event-ID``), until the
    stream closes (or ``stop_after`` items were read)."""
    headers = {"Accept": "text/event-stream"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    with client.stream("GET", path, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        ident: str | None = None
        kind, data = "message", []
        seen = 0
        for line in resp.iter_lines():
            if line == "":
                if data:
                    yield Event(ident, kind, "\n".join(data))
                    seen += kind == "item"
                    if stop_after is not None and seen >= stop_after:
                        return
                kind, data = "message", []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                ident = value
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)


def wait_until(fn: Any, limit: float = 120.0, every: float = 0.05) -> Any:
    """``fn()`` once it is truthy (a generous deadline: the machine is busy)."""
    import time

    deadline = time.monotonic() + limit
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {limit}s")
        time.sleep(every)
