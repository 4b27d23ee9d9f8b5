"""`stepstone runs/inspect --url postgresql://...`: read-only, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.exceptions import StoreError
from tests import _spawn
from tests.pgserver import PASSWORD, PgServer

pytestmark = pytest.mark.postgres


@pytest.fixture
def empty_db(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_database("t_cli_empty")
    try:
        yield url
    finally:
        pg_server.drop_database("t_cli_empty")


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


def _stepstone(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in a real process, forked from the tests' warm server."""
    return _spawn.run(
        [sys.executable, "-m", "stepstone.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_read_only_never_creates_the_schema(empty_db: str) -> None:
    # guarantee 142, 144
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k text, v text)")
    proc = _stepstone("runs", "--url", empty_db)
    assert proc.returncode == 1, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "no stepstone store" in line
    assert _tables(empty_db) == ["kv"]
    with pytest.raises(StoreError, match="no stepstone store"):
        Store(url=empty_db, read_only=True).keys()
    assert _tables(empty_db) == ["kv"]


def test_write_commands_never_create_the_schema_either(empty_db: str) -> None:
    # guarantee 144: cancel, fork, retry and prune write, but only into a stepstone store;
    # on PostgreSQL their check opened nothing, and the write created the tables
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k text, v text)")
    for args in (
        ("cancel", "k"),
        ("retry", "k", "--from", "s"),
        ("prune", "--keep-last", "0"),
    ):
        proc = _stepstone(*args, "--url", empty_db)
        assert proc.returncode == 1, (args, proc.stdout)
        assert "no stepstone store" in proc.stderr, (args, proc.stderr)
    assert _tables(empty_db) == ["kv"]


def test_runs_and_inspect_on_postgres(pg_url: str) -> None:
    # guarantee 142, 144, 148
    def broken(payload: object) -> str:
        raise ValueError("bad row 7")

    with Store(url=pg_url) as store:
        for key in store.keys():
            store.delete(key)
        plan = Plan(
            Step(lambda p: "rows", name="extract", writes="raw"),
            Step(broken),
            store=store,
            checkpoint_key="pg-nightly",
        )
        assert not Agent(engine=plan)("go").ok
    listed = json.loads(_stepstone("runs", "--url", pg_url, "--json").stdout)
    assert [(x["key"], x["status"]) for x in listed] == [("pg-nightly", "failed")]
    proc = _stepstone("inspect", "--url", pg_url, "pg-nightly")
    assert proc.returncode == 0, proc.stderr
    assert "status failed" in proc.stdout and "next step broken" in proc.stdout
    with Store(url=pg_url, read_only=True) as ro:
        assert ro.read("raw") == "rows"
        with pytest.raises(StoreError, match="read-only"):
            ro.write("raw", 1)
        with pytest.raises(StoreError, match="read-only"):
            ro.compare_and_swap("raw", "rows", 1)


def test_check_on_postgres_reads_every_record(pg_url: str) -> None:
    # guarantee 157: PostgreSQL checks its own pages; every record is read
    with Store(url=pg_url) as store:
        for key in store.keys():
            store.delete(key)
        plan = Plan(Step(lambda p: "rows", name="extract"), store=store, checkpoint_key="pg-c")
        assert Agent(engine=plan)("go").ok
        store.write("pg-v", [1])
    proc = _stepstone("check", "--url", pg_url, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and not report["file_checked"]
    assert (report["runs"], report["values"]) == (1, 1)
    # guarantee 353: the test cluster has data checksums off, and the check says so
    with psycopg.connect(pg_url, autocommit=True) as conn:
        setting = conn.execute("SHOW data_checksums").fetchone()[0]
    assert report["checksums"].startswith("none" if setting == "off" else "the server's")
    assert "initdb --data-checksums" in report["checksums"] or setting == "on"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE stepstone_runs SET meta = '[[[' WHERE key = 'pg-c'")
    proc = _stepstone("check", "--url", pg_url)
    assert proc.returncode == 1 and "record 'pg-c'" in proc.stdout, proc.stdout
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the head lost, its rows left
        conn.execute("DELETE FROM stepstone_runs WHERE key = 'pg-c'")
    report = json.loads(_stepstone("check", "--url", pg_url, "--json").stdout)
    (problem,) = report["problems"]
    assert problem["key"] == "pg-c" and "no run head" in problem["detail"]


def test_check_of_a_database_it_cannot_read_is_one_open_problem(
    empty_db: str, pg_server: PgServer
) -> None:
    """guarantee 157, 374: a PostgreSQL database `check` cannot read (no stepstone store in
    it, a wrong password, nothing listening) is one `open` problem naming why, as a SQLite
    file that will not open is; before, the same failure was listed four times as
    problems of the keys, and the database's schema was never said to be missing."""
    wrong_password = pg_server.url("t_cli_empty").replace(
        f":{quote(PASSWORD, safe='')}@", ":not-it@"
    )
    nothing_there = empty_db.replace(f":{pg_server.port}/", ":1/")
    for url, said in (
        (empty_db, "holds no stepstone store"),
        (wrong_password, "password authentication failed"),
        (nothing_there, "Connection refused"),
    ):
        proc = _stepstone("check", "--url", url, "--json")
        assert proc.returncode == 1, proc.stderr
        (problem,) = json.loads(proc.stdout)["problems"]
        assert problem["where"] == "open" and said in problem["detail"], problem
        assert "not-it" not in proc.stdout  # the password is never printed
        text = _stepstone("check", "--url", url)
        assert text.returncode == 1 and "1 problem(s)" in text.stdout, text.stdout
        assert "backup" not in text.stdout  # nothing is damaged: nothing to restore
    assert _tables(empty_db) == []  # read only: no schema created
