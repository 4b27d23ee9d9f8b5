"""The inspector's HTTP API over a real server, and the `stepstone ui` command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.ui import InspectorServer
from tests.operate._live import SteppedRun
from tests.operate._runs import done_run, failed_run
from tests.operate.conftest import open_args


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = resp.read()
            ctype = resp.headers["Content-Type"]
            return resp.status, json.loads(body) if "json" in ctype else body.decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _post(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_api_lists_filters_and_details_runs(store_args: list[str]) -> None:
    # guarantee 276, 277
    with open_args(store_args) as store:
        done_run(store, "etl-1")
        done_run(store, "etl-2")
        failed_run(store, "nightly")
        with InspectorServer(store, port=0).start() as server:
            base = server.url
            assert base.startswith("http://127.0.0.1:")
            status, page = _get(base)
            assert status == 200 and "<title>stepstone inspector</title>" in page
            assert _get(base + "static/app.js")[0] == 200
            assert _get(base + "static/secret.py")[0] == 404
            status, data = _get(base + "api/runs")
            assert status == 200 and data["total"] == 3 and data["allow_actions"] is False
            assert [r["key"] for r in data["runs"]] == ["nightly", "etl-2", "etl-1"]
            assert _get(base + "api/runs?status=failed")[1]["runs"][0]["error_type"] == "ValueError"
            assert _get(base + "api/runs?prefix=etl-&limit=1")[1]["total"] == 2
            assert len(_get(base + "api/runs?prefix=etl-&limit=1")[1]["runs"]) == 1
            assert _get(base + "api/runs?kind=graph")[1]["total"] == 0
            assert _get(base + "api/runs?older_than=3600")[1]["total"] == 0
            assert _get(base + "api/runs?limit=ten")[0] == 400
            status, run = _get(base + "api/run?key=nightly")
            assert status == 200 and run["error"]["message"] == "bad row 7"
            assert run["timeline"][-1]["kind"] == "failed"
            assert _get(base + "api/run?key=nope")[0] == 404


def test_api_is_read_only_unless_actions_are_allowed(tmp_path: Path) -> None:
    # guarantee 278
    with Store(db=tmp_path / "s.sqlite") as store:
        run = SteppedRun(store, "live", steps=2).start()
        try:
            assert run.started[0].wait(60)
            with InspectorServer(store, port=0).start() as server:
                status, data = _post(
                    server.url + "api/cancel?key=live", {"X-Stepstone-Action": "1"}
                )
                assert status == 403 and "--allow-actions" in data["error"]
                assert _get(server.url + "api/cancel?key=live")[0] == 405
            with InspectorServer(store, port=0, allow_actions=True).start() as server:
                status, data = _post(server.url + "api/cancel?key=live")
                assert status == 403 and "X-Stepstone-Action" in data["error"]
                assert store.read("live")["status"] in ("claimed", "running")
                act = {"X-Stepstone-Action": "1"}
                status, data = _post(server.url + "api/retry?key=live&step=step_0", act)
                assert status == 409 and "stepstone cancel live" in data["error"]
                status, data = _post(server.url + "api/cancel?key=live", act)
                assert status == 200 and data["outcome"].startswith("cancel requested")
                run.finish()
                assert store.read("live")["error"]["type"] == "RunCancelledError"
                assert store.read("live")["completed_steps"] == ["step_0"]
                status, data = _post(server.url + "api/retry?key=live&step=step_0", act)
                assert status == 200 and data["next_step"] == "step_0"
                assert store.read("live")["completed_steps"] == []
        finally:
            run.finish()


def test_ui_command_serves_until_interrupted(tmp_path: Path) -> None:
    # guarantee 276
    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        failed_run(store, "nightly")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepstone.cli", "ui", "--db", str(db), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "read-only" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert url.startswith("http://127.0.0.1:")
        assert _get(url + "api/runs")[1]["runs"][0]["key"] == "nightly"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        assert proc.stderr is not None
        proc.stderr.close()


def _ui_refused(db: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``stepstone ui --db DB *options`` run to its end (it cannot listen)."""
    return subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "ui", "--db", str(db), *options],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ui_command_refuses_a_taken_port(tmp_path: Path) -> None:
    # guarantee 275
    db = tmp_path / "s.sqlite"
    Store(db=db).close()
    with InspectorServer(Store(db=db), port=0) as taken:
        port = taken.url.rsplit(":", 1)[1].strip("/")
        proc = _ui_refused(db, "--port", port)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot listen on 127.0.0.1:") and "--port" in proc.stderr


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # not an address; not this host's
def test_ui_command_names_a_bad_host(tmp_path: Path, host: str) -> None:
    # guarantee 275
    db = tmp_path / "s.sqlite"
    Store(db=db).close()
    proc = _ui_refused(db, "--host", host)
    assert proc.returncode == 1
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(f"error: cannot listen on {host}:8765 (")
    assert last.endswith("pass a --host that is an address of this machine (127.0.0.1 by default)")


def test_a_foreign_host_header_is_refused(tmp_path: Path) -> None:
    # guarantee 289
    with Store(db=tmp_path / "s.sqlite") as store:
        failed_run(store, "nightly")
        with InspectorServer(store, port=0).start() as server:
            port = server.url.rsplit(":", 1)[1].strip("/")
            for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
                req = urllib.request.Request(server.url + "api/runs", headers={"Host": host})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    assert resp.status == 200
            req = urllib.request.Request(
                server.url + "api/runs", headers={"Host": f"evil.example:{port}"}
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=30)
            assert err.value.code == 403
            assert "is not this machine" in json.loads(err.value.read())["error"]
            err.value.close()


def test_api_approves_a_paused_call_only_with_actions(tmp_path: Path) -> None:
    from stepstone import Agent, Runner, tool
    from stepstone.testing import FunctionModel, call

    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    replies = {0: call("refund", order="o-1"), 1: "done"}
    agent = Agent(model=FunctionModel(lambda r: replies[r.turn]), tools=[refund])
    with Store(db=tmp_path / "runs.sqlite") as store:
        paused = Runner(store=store).run_sync(agent, user_message="go", run_id="r", thread_id="t")
        call_id = paused.pending_approvals[0]["call_id"]
        key = store.keys()[0]
        q = f"key={urllib.parse.quote(key)}&call_id={call_id}"
        with InspectorServer(store, port=0).start() as server:
            status, body = _post(f"{server.url}/api/approve?{q}", {"X-Stepstone-Action": "1"})
            assert status == 403 and "--allow-actions" in body["error"]
            status, run = _get(f"{server.url}/api/run?key={urllib.parse.quote(key)}")
            assert status == 200 and run["pending_approvals"][0]["decision"] is None
            assert run["agent"]["effects"][0]["position"] == "model:0:0"
        with InspectorServer(store, port=0, allow_actions=True).start() as server:
            status, body = _post(f"{server.url}/api/approve?{q}")
            assert status == 403 and "X-Stepstone-Action" in body["error"]
            status, body = _post(
                f"{server.url}/api/approve?key={urllib.parse.quote(key)}&call_id=nope",
                {"X-Stepstone-Action": "1"},
            )
            assert status == 409 and f"it waits for {call_id}" in body["error"]
            status, body = _post(
                f"{server.url}/api/approve?{q}&deny=too+much", {"X-Stepstone-Action": "1"}
            )
            assert status == 200 and body["decision"] == "too much"
            assert body["outcome"].startswith("denied refund call")
            _, run = _get(f"{server.url}/api/run?key={urllib.parse.quote(key)}")
            assert run["pending_approvals"][0]["decision"] == "too much"
            # guarantee 372: a page drawn before that decision does not replace it...
            status, body = _post(f"{server.url}/api/approve?{q}", {"X-Stepstone-Action": "1"})
            assert status == 409 and "already denied (too much)" in body["error"]
            _, run = _get(f"{server.url}/api/run?key={urllib.parse.quote(key)}")
            assert run["pending_approvals"][0]["decision"] == "too much"
            # ...a page that showed it does (replace=1), and the same decision again is a no-op
            status, body = _post(
                f"{server.url}/api/approve?{q}&deny=still+too+much&replace=1",
                {"X-Stepstone-Action": "1"},
            )
            assert status == 200 and body["previous"] == "too much" and body["changed"]
            status, body = _post(
                f"{server.url}/api/approve?{q}&deny=still+too+much", {"X-Stepstone-Action": "1"}
            )
            assert status == 200 and body["changed"] is False
            assert body["outcome"] == f"refund call {call_id} is already denied (still too much)"
        final = Runner(store=store).resume_sync(agent, run_id="r", thread_id="t")
        assert final.tool_executions[0]["error"]["type"] == "ApprovalDenied"


def test_bad_query_values_are_a_400_naming_them(tmp_path: Path) -> None:
    """guarantee 376: a number the run list cannot use (not a number, infinite, NaN,
    negative, fractional) or an unknown status is a 400 whose JSON names the parameter,
    the value and what it takes; before, limit=inf and limit=1e400 crashed the request
    (500, a traceback on the server's stderr) and the others were 409 Conflict. Ages take
    the CLI's forms (1d, 12h) as well as seconds."""
    with Store(db=tmp_path / "runs.sqlite") as store:
        done_run(store, "etl-1")
        with InspectorServer(store, port=0).start() as server:
            base = server.url + "api/runs?"
            for query, said in (
                ("limit=inf", "limit='inf' is not a whole number >= 1"),
                ("limit=1e400", "limit='1e400' is not a whole number >= 1"),
                ("limit=nan", "limit='nan' is not a whole number >= 1"),
                ("limit=-1", "limit='-1' is not a whole number >= 1"),
                ("limit=0", "limit='0' is not a whole number >= 1"),
                ("limit=2.5", "limit='2.5' is not a whole number >= 1"),
                ("offset=-3", "offset='-3' is not a whole number >= 0"),
                ("offset=inf", "offset='inf' is not a whole number >= 0"),
                ("older_than=nan", "older_than='nan' is not an age"),
                ("newer_than=-5", "newer_than='-5' is not an age"),
                ("newer_than=soon", "newer_than='soon' is not an age"),
                ("status=fail", "unknown run status ['fail']"),
            ):
                status, body = _get(base + query)
                assert status == 400 and said in body["error"], (query, status, body)
            for query in ("older_than=0", "older_than=0s", "newer_than=1d", "limit=1&offset=0"):
                status, body = _get(base + query)
                assert status == 200 and body["total"] == 1, (query, body)
            assert _get(base + "newer_than=1d")[1]["runs"][0]["key"] == "etl-1"
            assert _get(base + "older_than=1d")[1]["total"] == 0


def test_a_run_with_megabytes_of_output_is_sent_cut_to_the_page(tmp_path: Path) -> None:
    """guarantee 379: the run page, which polls every second, gets each payload cut to
    4096 characters of JSON with its full length (before: a run with ten 5 MB outputs sent
    50 MB per poll); full=1 gets it all, and `stepstone show` prints texts of the record
    cut to 2000 characters with their length (before: all 10 MB on the terminal), while
    `show --json` and `history --payloads --json` keep everything."""
    from typer.testing import CliRunner

    from stepstone import Agent, Plan, Step
    from stepstone.cli import app

    big = "y" * 3_000_000
    with Store(db=tmp_path / "runs.sqlite") as store:
        plan = Plan(
            Step(lambda p: big, name="extract", writes="raw"),
            Step(lambda p: {"rows": [big[:5000]] * 3}, name="parse"),
            Step(lambda p: "loaded", name="load"),
            store=store,
            checkpoint_key="big",
        )
        assert Agent(engine=plan)("go").ok
        with InspectorServer(store, port=0).start() as server:
            url = server.url + "api/run?key=big"
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = resp.read()
            assert len(body) < 20_000
            extract, parse, load = json.loads(body)["timeline"]
            assert extract["payload"] == big[:4096] and extract["payload_chars"] == len(big)
            assert parse["payload"].startswith('{"rows": ["yyy') and len(parse["payload"]) == 4096
            assert parse["payload_chars"] == len(json.dumps({"rows": [big[:5000]] * 3}))
            assert load["payload"] == "loaded" and "payload_chars" not in load
            status, full = _get(url + "&full=1")
            assert status == 200 and full["timeline"][0]["payload"] == big
    cli = CliRunner(env={"COLUMNS": "200"})
    db = ["--db", str(tmp_path / "runs.sqlite")]
    shown = cli.invoke(app, ["show", "big", *db])
    assert shown.exit_code == 0 and len(shown.stdout) < 20_000
    assert f"… ({len(big)} characters; --json shows them all)" in shown.stdout
    whole = json.loads(cli.invoke(app, ["show", "big", "--json", *db]).stdout)
    assert whole["record"]["kv"]["raw"] == big
    hist = json.loads(cli.invoke(app, ["history", "big", "--payloads", "--json", *db]).stdout)
    assert hist[0]["payload"] == big
