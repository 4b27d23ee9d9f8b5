"""Run streams as Server-Sent Events from a real server process: reconnecting with
Last-Event-ID, a server SIGKILLed while a client reads, 200 readers of one run, a server
closed while clients follow a run."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx2
import pytest

from stepstone import Store
from stepstone.ui import InspectorServer
from tests.operate._runs import done_run
from tests.server._serve import TLS, Served, sse, start_server, wait_until

pytestmark = pytest.mark.crash


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "app.sqlite")


def _start(served: Served, key: str, n: int, gate: Path) -> None:
    with served.client() as c:
        resp = c.post(
            "/runs", json={"target": "serveapp:talker", "args": [key, n, str(gate)], "key": key}
        )
        assert resp.status_code == 202, resp.text


def test_reconnect_and_a_killed_server_lose_and_repeat_nothing(store: str, tmp_path: Path) -> None:
    """guarantee 568: a client that reads some items, drops the connection and reconnects
    with Last-Event-ID gets the rest, in order; one whose server is SIGKILLed in the middle
    of the stream reconnects to a new server process on the same store (here a separate
    worker process writes the stream) and gets the rest: no item lost, none twice."""
    gate = tmp_path / "gate"
    worker_env = {"SERVEAPP_STORE": store}
    reader = start_server(store)  # serves the API and streams; runs nothing itself
    import subprocess
    import sys

    from tests.server._serve import HERE, store_args

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "worker",
            *store_args(store),
            "--import-path",
            str(HERE),
            "--poll-interval",
            "0.05",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**__import__("os").environ, **worker_env},
        cwd=HERE,
    )
    try:
        _start(reader, "chat-1", 12, gate)
        for i in range(4):
            (tmp_path / f"gate.{i}").touch()
        got = []
        with reader.client() as c:
            for event in sse(c, "/runs/chat-1/streams/tokens", stop_after=3):
                got.append(event)
        assert [e.id for e in got] == ["0", "1", "2"]
        with reader.client() as c:
            stream = sse(c, "/runs/chat-1/streams/tokens", last_id=got[-1].id)
            first = next(stream)
            assert first.id == "3"
            got.append(first)
            reader.kill()  # SIGKILL while this client reads the stream
            with pytest.raises(httpx2.HTTPError):
                for event in stream:
                    got.append(event)
        for i in range(4, 12):
            (tmp_path / f"gate.{i}").touch()
        restarted = start_server(store)
        try:
            with restarted.client() as c:
                rest = list(sse(c, "/runs/chat-1/streams/tokens", last_id=got[-1].id))
        finally:
            assert restarted.stop() == 0
        items = [e for e in got + rest if e.event == "item"]
        assert [int(e.id or -1) for e in items] == list(range(12))
        assert [e.data for e in items] == [f'{{"i": {i}, "text": "tok{i}"}}' for i in range(12)]
        assert rest[-1].event == "end" and '"done"' in rest[-1].data
    finally:
        reader.kill()
        worker.kill()
        worker.wait(60)


def test_two_hundred_readers_each_get_every_item(tmp_path: Path) -> None:
    """guarantee 569: 200 clients follow one run's stream at once (on loopback, each
    bounded in time); every one gets every item in order, then the end event, and the
    server reads the store once per stream, not once per client."""
    store = str(tmp_path / "app.sqlite")
    gate = tmp_path / "gate"
    served = start_server(store, "--workers", "2")
    n_items, n_readers = 20, 200
    try:
        _start(served, "fan-1", n_items, gate)
        results: list[list[str]] = [[] for _ in range(n_readers)]
        connected = threading.Semaphore(0)
        errors: list[BaseException] = []

        def read(i: int) -> None:
            try:
                with (
                    httpx2.Client(base_url=served.url, timeout=120, verify=TLS) as c,
                    c.stream("GET", "/runs/fan-1/streams/tokens") as resp,
                ):
                    assert resp.status_code == 200
                    connected.release()
                    kind, ident = "", ""
                    for line in resp.iter_lines():
                        if line.startswith("event:"):
                            kind = line.split(":", 1)[1].strip()
                        elif line.startswith("id:"):
                            ident = line.split(":", 1)[1].strip()
                        elif line == "" and kind:
                            results[i].append(ident if kind == "item" else kind)
                            kind = ""
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)
                connected.release()

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(n_readers)]
        for t in threads:
            t.start()
        for _ in range(n_readers):
            assert connected.acquire(timeout=120)
        for i in range(n_items):
            (tmp_path / f"gate.{i}").touch()
        for t in threads:
            t.join(180)
        assert not errors, errors[:3]
        expected = [str(i) for i in range(n_items)] + ["end"]
        assert all(r == expected for r in results), [r for r in results if r != expected][:2]
    finally:
        assert served.stop() == 0


def test_bad_stream_requests(tmp_path: Path) -> None:
    # guarantee 563
    served = start_server(str(tmp_path / "app.sqlite"), "--workers", "1")
    try:
        _start(served, "s-1", 1, tmp_path / "nogate")
        with served.client() as c:
            bad = c.get("/runs/s-1/streams/tokens", headers={"Last-Event-ID": "x1"})
            assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["error"]
            assert c.get("/runs/s-1/streams/tokens?from=-1").status_code == 400
        (tmp_path / "nogate.0").touch()
        with served.client() as c:
            wait_until(lambda: c.get("/runs/s-1").json()["status"] == "done")
    finally:
        assert served.stop() == 0


def test_a_server_stopped_from_a_thread_ends_the_streams_it_serves(tmp_path: Path) -> None:
    """guarantee 655: closing a server that serves from a thread (``InspectorServer``,
    ``Server.start()``) ends the streams its clients hold open, and the server stops: each
    client reads its response to a clean end, with no ``gone`` event (the run is still
    there). Before, uvicorn waited out its graceful shutdown for those streams (no signal
    reaches a server in a thread), then cut their connections."""
    with Store(db=tmp_path / "s.sqlite") as store:
        done_run(store, "kept")
        server = InspectorServer(store, port=0).start()
        try:
            with (
                httpx2.Client(base_url=server.url, timeout=60, verify=TLS) as c,
                c.stream("GET", "/runs/kept/watch") as resp,
            ):
                assert resp.status_code == 200
                lines = resp.iter_lines()
                assert next(line for line in lines if line.startswith("event:")) == "event: run"
                server.close()  # from this thread, while the stream is open
                rest = list(lines)  # to the end of the response: a cut would raise
        finally:
            server.close()
    assert not [line for line in rest if line.startswith("event:")], rest
