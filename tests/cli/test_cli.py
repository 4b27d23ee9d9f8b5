"""The `stepstone` command: demo, inspect, runs; read-only opening; one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store, __version__
from stepstone.cli import app
from stepstone.exceptions import StoreError
from tests import _spawn

runner = CliRunner()


def stepstone(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: a real process (forked from the tests' warm server,
    see tests/_spawn.py), its exit status, stdout and stderr."""
    return _spawn.run(
        [sys.executable, "-m", "stepstone.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **env},
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process (faster); same exit status, stdout and stderr."""
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _failed_run(db: Path, key: str = "nightly") -> None:
    def broken(payload: object) -> str:
        raise ValueError("bad row 7")

    with Store(db=db) as store:
        plan = Plan(
            Step(lambda p: "rows", name="extract", writes="raw"),
            Step(broken),
            store=store,
            checkpoint_key=key,
        )
        Agent(engine=plan)("go")


def test_demo_tells_the_story_and_the_same_story_again(tmp_path: Path) -> None:
    # guarantee 150, 151: the installed command, not on PATH (as after `make demo`)
    exe = Path(sys.executable).parent / "stepstone"
    assert exe.exists()
    db = tmp_path / "demo.sqlite"
    runs = [
        subprocess.run(
            [str(exe), "demo", "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=180,
            env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        for _ in range(2)
    ]
    for i, proc in enumerate(runs):
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        assert "Traceback" not in out + proc.stderr
        assert ("earlier demo" in out) == (i == 1)
        assert "Run 1: the pipeline crashes during validate" in out
        assert "crashed — but every finished step was committed first" in out
        assert "status failed  next step validate" in out
        assert "completed steps: ['extract', 'transform']" in out
        assert "Run 2: resume=True picks up at validate" in out
        assert "done: 'loaded 3 rows'" in out
        assert "no step ran; payload keys: ['clean', 'loaded', 'raw', 'verdict']" in out
        assert "pruned 3 finished fork checkpoints" in out
        assert "NodeException at node 'size_crew'" in out
        assert f"{exe} inspect --db {db} etl-2026-04-30" in out
        assert f". {exe.parent.parent}/bin/activate" in out
    with Store(db=db) as store:
        assert store.read("etl-2026-04-30")["status"] == "done"


def test_demo_without_db_leaves_no_temp_dir(tmp_path: Path) -> None:
    # guarantee 150
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = stepstone("demo", TMPDIR=str(tmp))
    assert proc.returncode == 0, proc.stderr
    assert list(tmp.iterdir()) == []
    assert "demo --db demo.sqlite" in proc.stdout


def test_inspect_prints_the_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    result = runner.invoke(app, ["inspect", "--db", str(db), "nightly"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "status failed" in result.output and "next step broken" in result.output
    assert "completed steps: ['extract']" in result.output
    assert "kv keys: ['raw']" in result.output
    assert "error at step 'broken': ValueError: bad row 7" in result.output
    assert "history" in result.output and "rows" in result.output


def test_inspect_json_is_the_store_entry(tmp_path: Path) -> None:
    # guarantee 148
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    proc = stepstone("inspect", "--db", str(db), "nightly", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    with Store(db=db) as store:
        assert data["value"] == json.loads(json.dumps(store.read("nightly")))
    assert data["key"] == "nightly" and data["kind"] == "checkpoint" and data["run_kind"] == "plan"


def test_inspect_a_graph_run_shows_graph_fields(tmp_path: Path) -> None:
    # guarantee 147
    from stepstone.graph import END, GraphBuilder, NodeException, SQLiteCheckpointer, State

    class Count(State):
        n: int = 0

    db = tmp_path / "g.sqlite"
    cp = SQLiteCheckpointer(db)
    graph = (
        GraphBuilder(Count)
        .add_node("inc", lambda s: {"n": s.n + 1})
        .add_edge("inc", END)
        .set_entry("inc")
        .with_checkpointer(cp)
        .compile()
    )
    graph.invoke(Count(), correlation_id="c-1")
    (record,) = cp.list()
    cp.close()
    proc = stepstone("inspect", "--db", str(db), f"graph:{record.invocation_id}")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "graph run  status done" in out
    assert f"invocation_id {record.invocation_id}" in out and "correlation_id c-1" in out
    assert "completed nodes: ['inc']" in out and '"n": 1' in out
    assert "None" not in out and "completed steps" not in out

    def boom(state: Count) -> dict[str, int]:
        raise ValueError("bad input")

    cp = SQLiteCheckpointer(db)
    failing = (
        GraphBuilder(Count)
        .add_node("boom", boom)
        .add_edge("boom", END)
        .set_entry("boom")
        .with_checkpointer(cp)
        .compile()
    )
    with pytest.raises(NodeException) as info:
        failing.invoke(Count(), correlation_id="c-2")
    cp.close()
    out = cli("inspect", "--db", str(db), f"graph:{info.value.invocation_id}").stdout
    assert "graph run  status failed" in out
    assert "error at node 'boom': ValueError: bad input" in out


def test_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    # guarantee 145
    db = tmp_path / "s.sqlite"
    _failed_run(db)
    line = _one_line_error(cli("inspect", "--db", str(db), "nightlx"))
    assert "no key 'nightlx'" in line and "nightly" in line  # suggests near keys
    line = _one_line_error(cli("inspect", "--db", str(tmp_path / "nope.sqlite"), "k"))
    assert "no store file" in line
    assert not (tmp_path / "nope.sqlite").exists()
    _one_line_error(cli("runs", "--db", str(tmp_path)))  # a directory
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 50)
    assert "not a SQLite database" in _one_line_error(stepstone("runs", "--db", str(text)))
    line = _one_line_error(cli("runs", "--url", "mysql://u:s3cret@localhost/db"))
    assert "unsupported store URL scheme 'mysql'" in line and "postgresql://" in line
    assert "s3cret" not in line  # the URL's password is never echoed
    line = _one_line_error(cli("runs", "--url", "postgresql://u@127.0.0.1:9/db"))
    assert "127.0.0.1" in line
    line = _one_line_error(cli("inspect", "k"), code=2)
    assert "--db PATH or --url URL" in line
    usage = cli("runs", "--bogus")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    debug = stepstone("--debug", "runs", "--db", str(text))
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    debug = stepstone("runs", "--db", str(text), "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_read_only_commands_never_write_to_other_files(tmp_path: Path) -> None:
    # guarantee 144
    app_db = tmp_path / "app.sqlite"
    conn = sqlite3.connect(app_db)
    conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO kv VALUES ('theirs', '1')")
    conn.commit()
    conn.close()
    before = _digest(app_db)
    for args in (
        ["runs", "--db", str(app_db)],
        ["runs", "--url", f"sqlite:///{app_db}"],
        ["inspect", "--db", str(app_db), "theirs"],
    ):
        line = _one_line_error(cli(*args))
        assert "not a stepstone store" in line
    assert _digest(app_db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]
    missing = tmp_path / "missing.sqlite"
    for args in (["runs", "--db", str(missing)], ["runs", "--url", f"sqlite:///{missing}"]):
        assert "no store file" in _one_line_error(cli(*args))
    assert not missing.exists()


def test_version() -> None:
    # guarantee 148
    proc = stepstone("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"stepstone {__version__}"


def test_runs_prints_whole_keys(tmp_path: Path) -> None:
    # guarantee 146
    db = tmp_path / "s.sqlite"
    key = "nightly-etl-for-the-customer-with-a-rather-long-name-2026-04-30-shard-0007"
    _failed_run(db, key)
    proc = stepstone("runs", "--db", str(db), COLUMNS="60")
    assert proc.returncode == 0, proc.stderr
    assert key in proc.stdout and "…" not in proc.stdout
    result = runner.invoke(app, ["runs", "--db", str(db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and key in result.output and "failed" in result.output


def test_runs_shows_whether_the_owner_lives(tmp_path: Path) -> None:
    # guarantee 146
    db = tmp_path / "s.sqlite"
    script = textwrap.dedent(
        f"""
        import time
        from stepstone import Agent, Plan, Step, Store

        def slow(task):
            time.sleep(600)

        store = Store(db={str(db)!r})
        Agent(engine=Plan(Step(slow), store=store, checkpoint_key="busy"))("go")
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with Store(db=db, read_only=True) as store:
                    head = store.backend.run_get("busy")
            except StoreError:  # the owner has not created the file or its schema yet
                head = None
            if head is not None and head.status in ("claimed", "running"):
                break
            assert time.monotonic() < deadline, "the owner never started its step"
            time.sleep(0.2)
        live = stepstone("runs", "--db", str(db), "--json")
        assert live.returncode == 0, live.stderr
        (line,) = json.loads(live.stdout)
        assert line["owner"]["state"] == "live" and line["owner"]["pid"] == owner.pid
        assert "live (pid" in stepstone("runs", "--db", str(db)).stdout
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=60)
    dead = stepstone("runs", "--db", str(db), "--json")
    (line,) = json.loads(dead.stdout)
    assert line["status"] in ("claimed", "running") and line["owner"]["state"] == "dead"
    assert "process gone" in stepstone("runs", "--db", str(db)).stdout


def test_one_corrupt_run_never_breaks_the_listing(tmp_path: Path) -> None:
    # guarantee 149
    db = tmp_path / "s.sqlite"
    for key in ("a-good", "b-bad", "c-good", "d-utf8", "e-journal"):
        _failed_run(db, key)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE stepstone_runs SET meta = '[[[' WHERE key = 'b-bad'")
    conn.execute("UPDATE stepstone_runs SET meta = CAST(x'7bff' AS TEXT) WHERE key = 'd-utf8'")
    conn.execute(
        "UPDATE stepstone_journal SET data = CAST(x'22ff22' AS TEXT) WHERE run_key = 'e-journal'"
    )
    conn.commit()
    conn.close()
    proc = stepstone("runs", "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "a-good" in proc.stdout and "c-good" in proc.stdout
    bad = next(line for line in proc.stdout.splitlines() if "b-bad" in line)
    assert "corrupt" in bad
    assert "corrupt" in next(line for line in proc.stdout.splitlines() if "d-utf8" in line)
    listed = json.loads(stepstone("runs", "--db", str(db), "--json").stdout)
    assert [x["key"] for x in listed] == ["a-good", "b-bad", "c-good", "d-utf8", "e-journal"]
    assert listed[1]["corrupt"] and listed[3]["corrupt"] and listed[0]["status"] == "failed"
    assert listed[4]["status"] == "failed"  # a bad journal row does not spoil its head
    for key in ("b-bad", "d-utf8", "e-journal"):
        assert key in _one_line_error(stepstone("inspect", "--db", str(db), key))


def test_show_and_history_of_corrupt_records(tmp_path: Path) -> None:
    """guarantee 131, 149: `show` and `history` (which open the file read-only) name the
    damage instead of failing with a bare driver error; a run that lost a journal row is
    still shown, with what is wrong."""
    db = tmp_path / "s.sqlite"
    for key in ("lost-row", "bad-utf8"):
        _failed_run(db, key)
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM stepstone_journal WHERE run_key = 'lost-row' AND seq = 1")
    conn.execute(
        "UPDATE stepstone_runs SET next_step = CAST(x'62ff' AS TEXT) WHERE key = 'bad-utf8'"
    )
    conn.commit()
    conn.close()
    shown = stepstone("show", "--db", str(db), "lost-row")
    assert shown.returncode == 0, shown.stderr
    assert "corrupt" in shown.stdout and "rows [1] are missing" in shown.stdout
    detail = json.loads(stepstone("show", "--db", str(db), "lost-row", "--json").stdout)
    assert "rows [1] are missing" in detail["corrupt"] and detail["record"] is None
    assert stepstone("history", "--db", str(db), "lost-row").returncode == 0
    for command in ("show", "history", "inspect"):
        line = _one_line_error(stepstone(command, "--db", str(db), "bad-utf8"))
        assert "'bad-utf8'" in line and "UTF-8" in line


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_runs_prefix(tmp_path: Path, fmt: str) -> None:
    db = tmp_path / "s.sqlite"
    _failed_run(db, "x:1")
    _failed_run(db, "y:1")
    args = ["runs", "--db", str(db), "--prefix", "x:"] + (["--json"] if fmt == "json" else [])
    proc = cli(*args)
    assert proc.returncode == 0 and "x:1" in proc.stdout and "y:1" not in proc.stdout
    if fmt == "json":  # the fields docs/cli.md lists
        (line,) = json.loads(proc.stdout)
        assert set(line) == {
            "key", "kind", "status", "next_step", "run_uid", "version", "iteration",
            "owner", "error", "error_type", "steps", "created_at", "updated_at", "superseded_by",
            "damaged",
        }  # fmt: skip
        assert set(line["owner"]) == {"state", "host", "pid", "lease_until"}
        assert line["error"]["step"] == "broken" and line["owner"]["state"] == "-"


def test_runs_on_an_older_store_reads_it_as_it_is(tmp_path: Path) -> None:
    # guarantee 142, 144: inspection never migrates
    fixture = Path(__file__).parents[1] / "store" / "fixtures" / "store_v1.sqlite"
    db = tmp_path / "old.sqlite"
    db.write_bytes(fixture.read_bytes())
    before = _digest(db)
    listed = json.loads(cli("runs", "--db", str(db), "--json").stdout)
    assert [(x["key"], x["status"]) for x in listed] == [
        ("etl-done", "done"),
        ("etl-failed", "failed"),
    ]
    assert "next step broken" in cli("inspect", "--db", str(db), "etl-failed").stdout
    assert _digest(db) == before
