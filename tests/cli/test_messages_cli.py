"""``stepstone send``, ``events`` and ``stream``."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Store
from stepstone.cli import app
from stepstone.durable import claim_run
from stepstone.durable._messages import decode_value, encode_value

runner = CliRunner()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def _store(tmp_path: Path) -> Path:
    db = tmp_path / "s.sqlite"
    Store(db=db).close()
    return db


def test_send_stores_a_json_message_and_refuses_bad_json_and_finished_runs(
    tmp_path: Path,
) -> None:
    # guarantee 508
    db = _store(tmp_path)
    out = cli("send", "o-42", "approval", '{"ok": true, "by": "ana"}', "--db", str(db), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"key": "o-42", "topic": "approval", "id": 1}
    with Store(db=db) as store:
        (msg,) = store.backend.messages("o-42")
        assert decode_value(msg.data) == {"ok": True, "by": "ana"} and msg.topic == "approval"
        claimed = claim_run(store, "done-run", kind="test", resume=False, first_step="a")
        assert claimed.run is not None
        claimed.run.commit_sync(status="done", next_step=None)
        claimed.run.release()
    bad = cli("send", "o-42", "approval", "yes", "--db", str(db))
    assert bad.returncode == 2 and "not JSON" in bad.stderr and "'\"yes\"'" in bad.stderr
    done = cli("send", "done-run", "approval", "1", "--db", str(db))
    assert done.returncode == 1 and "done-run" in done.stderr and "finished" in done.stderr
    missing = cli("send", "k", "t", "1", "--db", str(tmp_path / "none.sqlite"))
    assert missing.returncode == 1 and "no store file" in missing.stderr


def test_events_and_stream_print_what_the_run_wrote(tmp_path: Path) -> None:
    # guarantee 508
    db = _store(tmp_path)
    with Store(db=db) as store:
        store.backend.event_set("r", "stage", encode_value("charged", "e"))
        for i in range(3):
            store.backend.stream_append("r", "progress", encode_value({"pct": i * 10}, "s"), 1)
        claimed = claim_run(store, "r", kind="test", resume=True, first_step="a")
        assert claimed.run is not None
        run = claimed.run
        events = cli("events", "r", "--db", str(db))
        assert events.returncode == 0 and events.stdout.strip() == 'stage: "charged"'
        as_json = cli("events", "r", "--db", str(db), "--json")
        assert json.loads(as_json.stdout) == {"stage": "charged"}
        snapshot = cli("stream", "r", "progress", "--db", str(db), "--from", "1")
        assert snapshot.stdout.splitlines() == ['1  {"pct": 10}', '2  {"pct": 20}']
        assert "next offset 3 (the run goes on)" in snapshot.stderr

        def finish() -> None:
            time.sleep(0.3)
            store.backend.stream_append("r", "progress", encode_value({"pct": 99}, "s"), 1)
            run.commit_sync(status="done", next_step=None)
            run.release()

        thread = threading.Thread(target=finish)
        thread.start()
        follow = cli("stream", "r", "progress", "--db", str(db), "--follow", "--json")
        thread.join()
    lines = [json.loads(line) for line in follow.stdout.splitlines()]
    assert [line.get("offset") for line in lines[:-1]] == [0, 1, 2, 3]
    assert lines[3] == {"offset": 3, "value": {"pct": 99}, "attempt": 1}
    assert lines[-1] == {"next_offset": 4, "ended": "done"}


def test_show_says_what_a_run_waits_for_and_lists_its_events_streams_and_mail(
    tmp_path: Path,
) -> None:
    # guarantee 514
    from stepstone.store._extras import ExtraWrites, Timer

    db = _store(tmp_path)
    with Store(db=db) as store:
        claimed = claim_run(store, "w", kind="plan", resume=False, first_step="a")
        assert claimed.run is not None
        now = store.backend.clock()
        claimed.run.commit_sync(
            status="running",
            next_step="a",
            rows=[("t", None, {})],
            extras=ExtraWrites(
                events=(("stage", encode_value("charged", "e")),),
                stream=(("progress", encode_value(1, "s")),),
                timers=(
                    Timer(run_key="w", name="0", wake_at=now + 3600, topic=None, since=now),
                    Timer(run_key="w", name="1", wake_at=None, topic="approval", since=now),
                    Timer(run_key="w", name="2", wake_at=now - 1, topic=None, since=now),
                ),
            ),
        )
        from stepstone import send

        send(store, "w", "approval", {"ok": True})
        claimed.run.release()
    as_json = cli("show", "w", "--db", str(db), "--json")
    detail = json.loads(as_json.stdout)
    assert [(w["name"], w["state"], w["topic"]) for w in detail["waiting"]] == [
        ("0", "sleeping", None),
        ("1", "waiting", "approval"),
        ("2", "due", None),
    ]
    assert detail["events"] == {"stage": "charged"}
    assert detail["streams"] == [{"name": "progress", "length": 1}]
    assert [m["topic"] for m in detail["messages"]["pending"]] == ["approval"]
    text = cli("show", "w", "--db", str(db)).stdout
    assert "sleeping until" in text and "waiting for a message on 'approval'" in text
    assert 'stage: "charged"' in text and "progress: 1 value(s)" in text
    assert "1 pending on 'approval'" in text


def test_check_reads_a_runs_messages_events_and_streams(tmp_path: Path) -> None:
    # guarantee 504: a changed byte in a stream value is found by `stepstone check`
    import sqlite3

    db = _store(tmp_path)
    with Store(db=db) as store:
        claimed = claim_run(store, "r", kind="plan", resume=False, first_step="a")
        assert claimed.run is not None
        claimed.run.release()
        store.backend.stream_append("r", "log", encode_value("hello", "s"), None)
        store.backend.event_set("r", "stage", encode_value("ok", "e"))
    assert cli("check", "--db", str(db)).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute("UPDATE stepstone_streams SET data = '\"hellO\"'")  # beneath the checksum
    conn.commit()
    conn.close()
    found = cli("check", "--db", str(db), "--json")
    assert found.returncode == 1
    (problem,) = json.loads(found.stdout)["problems"]
    assert problem["key"] == "r" and "value 0 of stream 'log'" in problem["detail"]


@pytest.mark.postgres
def test_every_command_on_postgresql_against_a_waiting_workflow(pg_url: str) -> None:
    # guarantee 508, 509, 514: the same commands with --url, a real run waiting for them
    import asyncio

    import stepstone
    from stepstone import schedule, workflow

    with Store(url=pg_url) as store:
        store.setup()
        for key in store.keys():
            store.delete(key)

        @workflow(store=store)
        async def approve(order: str) -> str:
            await stepstone.write_stream("outbox", f"please approve {order}")
            stepstone.set_event("stage", "asked")
            answer = await stepstone.recv("approval", timeout=60)
            stepstone.set_event("stage", "approved" if answer else "expired")
            return f"approved by {answer['by']}" if answer else "expired"

        result: list[str] = []
        thread = threading.Thread(
            target=lambda: result.append(asyncio.run(approve.using(key="o-42").run("o-42")))
        )
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not store.backend.timers("o-42") and time.monotonic() < deadline:
                time.sleep(0.05)
            shown = cli("show", "o-42", "--url", pg_url)
            assert "waiting for a message on 'approval'" in shown.stdout, shown.stdout
            assert 'stage: "asked"' in shown.stdout
            sent = cli("send", "o-42", "approval", '{"ok": true, "by": "ana"}', "--url", pg_url)
            assert sent.returncode == 0, sent.stderr
            follow = cli("stream", "o-42", "outbox", "--url", pg_url, "--follow", "--json")
        finally:
            thread.join(60)
        assert result == ["approved by ana"]
        lines = [json.loads(line) for line in follow.stdout.splitlines()]
        assert lines == [
            {"offset": 0, "value": "please approve o-42", "attempt": None},
            {"next_offset": 1, "ended": "done"},
        ]
        events = cli("events", "o-42", "--url", pg_url, "--json")
        assert json.loads(events.stdout) == {"stage": "approved"}
        finished = cli("send", "o-42", "approval", "1", "--url", pg_url)
        assert finished.returncode == 1 and "finished" in finished.stderr
        schedule(store, "tests.messages.targets:noop_plan", cron="0 3 * * *", name="nightly")
        listed = cli("schedules", "--url", pg_url, "--json")
        assert [s["name"] for s in json.loads(listed.stdout)] == ["nightly"]
        for verb in ("pause", "resume", "delete"):
            done = cli("schedules", verb, "nightly", "--url", pg_url)
            assert done.returncode == 0, done.stderr
        assert cli("schedules", "--url", pg_url, "--json").stdout.strip() == "[]"
