"""What `stepstone serve` refuses: foreign Host headers, writes without the header or
token, a missing or wrong token, bad input, targets outside its import paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.server._serve import HERE, start_server


def test_loopback_writes_need_a_header_and_a_foreign_host_is_refused(tmp_path: Path) -> None:
    # guarantee 560, 561, 562, 563, 564
    served = start_server(str(tmp_path / "app.sqlite"))
    try:
        with served.client() as c:
            port = served.url.rsplit(":", 1)[1].strip("/")
            evil = c.get("/runs", headers={"Host": f"evil.example:{port}"})
            assert evil.status_code == 403 and "is not this machine" in evil.json()["error"]
            assert c.get("/runs", headers={"Host": f"localhost:{port}"}).status_code == 200
            # a form post (what a page of another origin can send) is refused
            form = c.post(
                "/runs",
                content=b"target=serveapp:hello",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert form.status_code == 403 and "X-Stepstone-Action" in form.json()["error"]
            assert c.post("/runs/x/cancel").status_code == 403
            # bad input: 4xx JSON naming it, never a traceback
            cases = [
                (b"{not json", 400, "not JSON"),
                (b"[1, 2]", 400, "JSON object"),
                (b'{"target": "serveapp:hello", "bogus": 1}', 400, "unknown field"),
                (b'{"args": []}', 400, "'target' is required"),
                (b'{"target": "serveapp:nothing", "args": []}', 400, "no attribute"),
                (b'{"target": "os:system", "args": ["id"]}', 400, "not under the server"),
                (b'{"target": "json.decoder:JSONDecoder"}', 400, "not under the server"),
                (b'{"target": "nowhere_at_all:x"}', 400, "no module 'nowhere_at_all'"),
                (b'{"target": "serveapp:hello", "args": [1, 2, 3]}', 400, "too many"),
                (b'{"target": "serveapp:hello", "task": "x"}', 400, "not 'task'"),
                (b'{"target": "serveapp:approver", "args": [1]}', 400, "not a workflow"),
                (b'{"target": "serveapp:hello", "args": ["x"], "priority": "high"}', 400, "int"),
                (b'{"target": "serveapp:hello", "args": ["x"], "delay": -1}', 400, "delay"),
            ]
            for body, status, said in cases:
                resp = c.post("/runs", content=body, headers={"Content-Type": "application/json"})
                assert resp.status_code == status, (body, resp.text)
                assert said in resp.json()["error"], (body, resp.json())
                assert "Traceback" not in resp.text
            big = b'{"target": "serveapp:hello", "args": ["' + b"x" * (2 << 20) + b'"]}'
            resp = c.post("/runs", content=big, headers={"Content-Type": "application/json"})
            assert resp.status_code == 413 and "--max-body" in resp.json()["error"]
            assert c.get("/runs/nobody").status_code == 404
            assert c.get("/runs?limit=ten").status_code == 400
            assert c.get("/runs?status=fail").status_code == 400
            assert c.get("/no/such/route").json()["error"].startswith("no route")
        assert "os" not in "".join(served.lines) or "Traceback" not in "".join(served.lines)
    finally:
        assert served.stop() == 0


def test_a_token_guards_every_request_and_is_required_off_loopback(tmp_path: Path) -> None:
    # guarantee 560
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-32-characters-xx\n")
    db = str(tmp_path / "app.sqlite")
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepstone.cli",
            "serve",
            "--db",
            db,
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    assert refused.returncode == 1 and "--token-file" in refused.stderr
    served = start_server(db, "--token-file", str(token))
    try:
        with served.client() as c:
            assert c.get("/runs").status_code == 401
            wrong = c.get(
                "/runs", headers={"Authorization": "Bearer s3cret-token-of-32-characters-xy"}
            )
            assert wrong.status_code == 401 and "Bearer" in wrong.json()["error"]
            auth = {"Authorization": "Bearer s3cret-token-of-32-characters-xx"}
            assert c.get("/runs", headers=auth).status_code == 200
            start = c.post("/runs", json={"target": "serveapp:hello", "args": ["t"]})
            assert start.status_code == 401
            start = c.post(
                "/runs", content=b'{"target": "serveapp:hello", "args": ["t"]}', headers=auth
            )
            assert start.status_code == 202, start.text
            assert c.get("/").status_code == 200  # the page itself holds no data
    finally:
        assert served.stop() == 0


def test_a_read_only_server_refuses_writes(tmp_path: Path) -> None:
    # guarantee 562
    served = start_server(str(tmp_path / "app.sqlite"), "--read-only")
    try:
        with served.client() as c:
            resp = c.post("/runs", json={"target": "serveapp:hello", "args": ["x"]})
            assert resp.status_code == 403 and "read-only" in resp.json()["error"]
    finally:
        assert served.stop() == 0


def test_a_target_reaching_outside_the_import_paths_is_refused(tmp_path: Path) -> None:
    # guarantee 583
    served = start_server(str(tmp_path / "app.sqlite"))
    try:
        with served.client() as c:
            cases = [
                ("serveapp:os.system", "reaches module 'os'"),
                ("serveapp:os.path.join", "reaches module 'os'"),
                ("serveapp:time.sleep", "reaches module 'time'"),
                ("serveapp:JSONDecoder", "defined in module 'json.decoder'"),
            ]
            for target, said in cases:
                resp = c.post("/runs", json={"target": target, "args": ["id"]})
                assert resp.status_code == 400, (target, resp.text)
                assert said in resp.json()["error"], (target, resp.json())
                assert "--import-path" in resp.json()["error"] or "register" in resp.json()["error"]
            assert c.get("/runs").json()["total"] == 0  # nothing queued
            ok = c.post("/runs", json={"target": "serveapp:hello", "args": ["x"]})
            assert ok.status_code == 202, ok.text
    finally:
        assert served.stop() == 0
