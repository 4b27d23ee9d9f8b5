"""`stepstone check`: the file's pages, then every record; exit 1 names what is wrong
(guarantee 157)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store
from stepstone.cli import app
from stepstone.store import check_store
from tests.store.damage import damage_page, damage_table, settle

runner = CliRunner()


def _check(*args: str) -> Any:
    return runner.invoke(app, ["check", *args], env={"COLUMNS": "300"})


def _store(db: Path) -> Path:
    """Three finished two-step runs and two plain values."""
    with Store(db=db) as store:
        for key in ("r1", "r2", "r3"):
            plan = Plan(
                Step(lambda p: {"rows": 3}, name="extract"),
                Step(lambda p: "ok", name="load"),
                store=store,
                checkpoint_key=key,
            )
            assert Agent(engine=plan)("go").ok
        store.write("v1", 1)
        store.write("v2", {"a": [1, 2]})
    return db


def test_a_sound_store_is_ok_and_counted(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.sqlite")
    before = db.read_bytes()
    result = _check("--db", str(db))
    assert result.exit_code == 0, result.output
    assert "3 runs" in result.output and "2 values" in result.output
    assert "integrity_check" in result.output and "ok: nothing is damaged" in result.output
    assert "values guarded by: a checksum on every row" in result.output  # guarantee 353
    report = json.loads(_check("--db", str(db), "--json", "--quick").output)
    assert report["ok"] and report["quick"] and report["file_checked"]
    assert (report["runs"], report["values"], report["problems"]) == (3, 2, [])
    assert report["journal_rows"] > 0
    assert db.read_bytes() == before  # read only


def test_bad_records_are_named_by_key_and_the_others_still_read(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.sqlite")
    con = sqlite3.connect(db)
    con.execute("UPDATE stepstone_runs SET meta = '[[[' WHERE key = 'r1'")
    con.execute("DELETE FROM stepstone_journal WHERE run_key = 'r2' AND seq = 0")
    con.execute("UPDATE stepstone_kv SET value = '{\"cut' WHERE key = 'v2'")
    con.execute("UPDATE stepstone_runs SET key = 'rX' WHERE key = 'r3'")  # a damaged key
    con.commit()
    con.close()
    result = _check("--db", str(db), "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    problems = {p["key"]: p for p in report["problems"]}
    assert sorted(problems) == ["r1", "r2", "r3", "rX", "v2"]
    assert "no run head" in problems["r3"]["detail"]  # its rows, left without a head
    assert "rows [0, 1, 2] are missing" in problems["rX"]["detail"]  # the head, without rows
    assert all(p["where"] == "record" for p in problems.values())
    assert "meta" in problems["r1"]["detail"]
    assert "rows [0] are missing" in problems["r2"]["detail"]
    assert "'v2'" in problems["v2"]["detail"]
    assert (report["runs"], report["values"], report["file_checked"]) == (0, 1, True)
    text = _check("--db", str(db)).output
    assert "5 problem(s)" in text and "record 'r2'" in text
    assert ".recover" not in text  # the pages are sound: nothing to recover


def test_damaged_pages_are_reported_with_what_still_reads(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.sqlite")
    damage_table(db, "stepstone_journal")
    result = _check("--db", str(db))
    assert result.exit_code == 1, result.output
    assert "file: " in result.output and ".recover" in result.output
    report = check_store(Store(db=db, read_only=True))
    assert report.problems[0].where == "file"
    assert {p.key for p in report.problems if p.where == "record"} == {"r1", "r2", "r3"}
    assert all("damaged: " in p.detail for p in report.problems[1:])
    assert report.values == 2  # the values' table is sound


def test_a_file_too_damaged_to_open_is_a_problem_of_the_file(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.sqlite")
    damage_page(db, 1, offset=100)  # the table list, after the file's 100-byte header
    result = _check("--db", str(db), "--json")
    assert result.exit_code == 1, result.output
    (problem,) = json.loads(result.output)["problems"]
    assert problem["where"] == "file" and problem["detail"].startswith("damaged: ")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a store\n" * 100)
    result = _check("--db", str(notes))
    assert result.exit_code == 1 and "is not a SQLite database" in result.output


def test_a_store_that_will_not_open_for_another_reason_is_not_called_damaged(
    tmp_path: Path,
) -> None:
    # guarantee 157: a text file, or a store a newer stepstone wrote: nothing to recover
    # from a backup
    notes = tmp_path / "notes.txt"
    notes.write_text("not a store\n" * 100)
    newer = _store(tmp_path / "newer.sqlite")
    con = sqlite3.connect(newer)
    con.execute("INSERT INTO stepstone_schema VALUES (99, 0)")
    con.commit()
    con.close()
    for path, said in ((notes, "is not a SQLite database"), (newer, "upgrade stepstone")):
        result = _check("--db", str(path))
        assert result.exit_code == 1 and said in result.output, result.output
        assert ".recover" not in result.output and "backup" not in result.output
        (problem,) = json.loads(_check("--db", str(path), "--json").output)["problems"]
        assert problem["where"] == "open"


def test_check_needs_exactly_one_store(tmp_path: Path) -> None:
    assert _check().exit_code == 2
    result = _check("--db", str(tmp_path / "missing.sqlite"))
    assert result.exit_code == 1 and "no store file" in result.output  # as every command


def test_damage_that_quotes_invalid_utf8_is_reported_printably(tmp_path: Path) -> None:
    """guarantee 131, 157: a table definition holding a byte that is not UTF-8 is a
    problem of the file, printed with the byte as ``\\xff`` (never a crash of the report)."""
    import subprocess
    import sys

    db = _store(tmp_path / "s.sqlite")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(
        "UPDATE sqlite_master SET sql = replace(sql, 'key', CAST(X'6BFF79' AS TEXT)) "
        "WHERE name = 'stepstone_kv'"
    )
    conn.commit()
    conn.close()
    for args in (["check"], ["runs"]):
        proc = subprocess.run(
            [sys.executable, "-m", "stepstone.cli", *args, "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert "k\\xffy" in proc.stdout + proc.stderr


def test_each_finding_of_sqlite_is_a_line_of_its_own(tmp_path: Path) -> None:
    """guarantee 433: SQLite answers several findings in one text, a newline between
    them; the report lists each on its own line, never a literal ``\\n``."""
    db = _store(tmp_path / "s.sqlite")
    settle(db)
    with open(db, "r+b") as fh:  # the header's freelist: a trunk page that is a table's
        fh.seek(32)
        fh.write((5).to_bytes(4, "big") + (2).to_bytes(4, "big"))
    result = _check("--db", str(db))
    assert result.exit_code == 1, result.output
    assert "\\n" not in result.output and "*** in database" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("  file: ")]
    assert len(lines) == 3 and "Main freelist" in lines[0], result.output
    report = json.loads(_check("--db", str(db), "--json").output)
    files = [p["detail"] for p in report["problems"] if p["where"] == "file"]
    assert len(files) == len(lines) and not any("\n" in d for d in files)
