"""Webhooks from a real server process to a loopback receiver: signed as Standard
Webhooks say, retried with backoff, delivered after the server is SIGKILLed mid-send."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.server._serve import SECRET, Served, start_server, wait_until


class Receiver:
    """A loopback HTTP server that records each webhook it gets; ``answers`` are the
    statuses of the first requests (then 200); ``hold`` keeps the first request waiting."""

    def __init__(self, answers: list[int] | None = None, *, hold: bool = False) -> None:
        self.got: list[dict[str, Any]] = []
        self.answers = list(answers or [])
        self.hold = threading.Event() if hold else None
        self.first_in = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.got.append({"headers": dict(self.headers), "body": body.decode()})
                receiver.first_in.set()
                if receiver.hold is not None and len(receiver.got) == 1:
                    receiver.hold.wait(120)
                status = receiver.answers.pop(0) if receiver.answers else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:  # the sender was killed meanwhile
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    return path


def _verified(got: dict[str, Any]) -> Any:
    headers = {k.lower(): v for k, v in got["headers"].items()}
    return Webhook(SECRET).verify(got["body"], headers)


def _start_run(served: Served, url: str, key: str) -> None:
    with served.client() as c:
        resp = c.post(
            "/runs", json={"target": "serveapp:hello", "args": ["ada"], "key": key, "webhook": url}
        )
        assert resp.status_code == 202, resp.text
        assert resp.json()["webhook"]["status"] == "waiting"


def test_a_webhook_is_signed_retried_and_its_attempts_shown(
    tmp_path: Path, secret_file: Path
) -> None:
    """guarantee 571, 572: the run's end is sent signed (webhook-id, webhook-timestamp,
    webhook-signature verify with the secret), retried after failed answers with the same
    id, and the run's view lists each attempt."""
    receiver = Receiver([500, 503])
    served = start_server(
        str(tmp_path / "app.sqlite"),
        "--workers",
        "1",
        "--webhook-secret-file",
        str(secret_file),
        "--webhook-backoff",
        "0.2",
    )
    try:
        _start_run(served, receiver.url, "hooked-1")
        wait_until(lambda: len(receiver.got) >= 3)
        ids = {g["headers"]["webhook-id"] for g in receiver.got}
        assert len(ids) == 1 and next(iter(ids)).startswith("msg_")
        body = _verified(receiver.got[-1])
        assert body["type"] == "run.finished"
        assert body["data"] == {
            "key": "hooked-1",
            "status": "done",
            "error": None,
            "result": "HELLO ADA!",
        }
        tampered = dict(receiver.got[-1], body=receiver.got[-1]["body"].replace("ADA", "EVE"))
        with pytest.raises(Exception, match="signature"):
            _verified(tampered)
        with served.client() as c:
            hooks = wait_until(
                lambda: (
                    (h := c.get("/runs/hooked-1").json()["webhooks"])[0]["status"] == "delivered"
                    and h
                )
            )
        assert hooks[0]["attempts"] == 3
        assert [a["status"] for a in hooks[0]["log"]] == [500, 503, 200]
    finally:
        receiver.close()
        assert served.stop() == 0


@pytest.mark.crash
def test_a_server_killed_while_it_sends_delivers_after_restart(
    tmp_path: Path, secret_file: Path
) -> None:
    """guarantee 573: a server SIGKILLed while the receiver holds its webhook leaves the
    delivery claimed; a new server sends it again once the claim's lease ran out, with
    the same webhook-id (the receiver dedupes on it): at least once."""
    receiver = Receiver(hold=True)
    store = str(tmp_path / "app.sqlite")
    opts = ["--webhook-secret-file", str(secret_file), "--webhook-timeout", "1"]
    served = start_server(store, "--workers", "1", *opts)
    try:
        _start_run(served, receiver.url, "hooked-2")
        assert receiver.first_in.wait(120)
        served.kill()
        receiver.hold.set() if receiver.hold else None
        again = start_server(store, *opts)
        try:
            wait_until(lambda: len(receiver.got) >= 2)
            first, second = receiver.got[0], receiver.got[1]
            assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"]
            assert _verified(second)["data"]["status"] == "done"
            with again.client() as c:
                hook = wait_until(
                    lambda: (
                        (h := c.get("/runs/hooked-2").json()["webhooks"][0])["status"]
                        == "delivered"
                        and h
                    )
                )
            assert hook["attempts"] == 1
        finally:
            assert again.stop() == 0
    finally:
        served.kill()
        receiver.close()


def test_webhook_requests_are_checked(tmp_path: Path, secret_file: Path) -> None:
    # guarantee 563
    bare = start_server(str(tmp_path / "a.sqlite"))
    try:
        with bare.client() as c:
            resp = c.post(
                "/runs",
                json={"target": "serveapp:hello", "args": ["x"], "webhook": "http://127.0.0.1:9/"},
            )
            assert resp.status_code == 400 and "--webhook-secret-file" in resp.json()["error"]
    finally:
        assert bare.stop() == 0
    signed = start_server(str(tmp_path / "b.sqlite"), "--webhook-secret-file", str(secret_file))
    try:
        with signed.client() as c:
            for url in ("ftp://x/", "not a url", 42):
                resp = c.post(
                    "/runs", json={"target": "serveapp:hello", "args": ["x"], "webhook": url}
                )
                assert resp.status_code == 400 and "webhook" in resp.json()["error"]
    finally:
        assert signed.stop() == 0


def test_a_queue_webhook_tells_the_end_of_every_run_of_the_queue(
    tmp_path: Path, secret_file: Path
) -> None:
    """guarantee 585: a queue's webhook is sent, signed, for every run submitted to the
    queue after it was set, however it was submitted (the API, or Python in another
    process's store handle); not for runs before it, nor after it is dropped."""
    from stepstone import Store, submit

    receiver = Receiver()
    db = tmp_path / "app.sqlite"
    served = start_server(
        str(db), "--workers", "2", "--queue", "billing", "--webhook-secret-file", str(secret_file)
    )
    w = {"X-Stepstone-Action": "1"}
    try:
        with served.client() as c, Store(db=db) as store:

            def ended(key: str) -> bool:
                entry = c.get(f"/runs/{key}").json().get("entry") or {}
                return entry.get("status") in ("done", "failed")

            submit(store, "serveapp:pipeline", "before", key="q-before", queue="billing")
            wait_until(lambda: ended("q-before"))
            assert c.get("/queues/billing/webhook").status_code == 404
            bad = c.put("/queues/billing/webhook", json={"url": "ftp://x"}, headers=w)
            assert bad.status_code == 400 and "http" in bad.json()["error"]
            set_ = c.put("/queues/billing/webhook", json={"url": receiver.url})
            assert set_.status_code == 200, set_.text
            assert c.get("/queues/billing/webhook").json()["url"] == receiver.url
            started = c.post(
                "/runs",
                json={
                    "target": "serveapp:hello",
                    "args": ["ada"],
                    "key": "q-api",
                    "queue": "billing",
                },
            )
            assert started.status_code == 202, started.text
            # recorded as the run is queued: its view lists it at once
            assert len(c.get("/runs/q-api").json()["webhooks"]) == 1
            submit(store, "serveapp:pipeline", "from python", key="q-py", queue="billing")
            wait_until(lambda: len(receiver.got) >= 2)
            bodies = {_verified(g)["data"]["key"]: _verified(g)["data"] for g in receiver.got}
            assert set(bodies) == {"q-api", "q-py"}
            assert bodies["q-api"]["result"] == "HELLO ADA!"
            assert bodies["q-py"]["status"] == "done"
            assert len({g["headers"]["webhook-id"] for g in receiver.got}) == 2
            # dropped: later runs of the queue are not told
            assert c.delete("/queues/billing/webhook", headers=w).status_code == 200
            assert c.get("/queues/billing/webhook").status_code == 404
            submit(store, "serveapp:pipeline", "after", key="q-after", queue="billing")
            wait_until(lambda: ended("q-after"))
            c.post(  # a run with its own webhook: once it is delivered, the outbox went round
                "/runs",
                json={
                    "target": "serveapp:hello",
                    "args": ["x"],
                    "key": "q-own",
                    "queue": "billing",
                    "webhook": receiver.url,
                },
            )
            wait_until(lambda: len(receiver.got) >= 3)
            assert _verified(receiver.got[2])["data"]["key"] == "q-own"
            assert c.get("/runs/q-after").json()["webhooks"] == []
            assert c.get("/runs/q-before").json()["webhooks"] == []
    finally:
        receiver.close()
        assert served.stop() == 0
