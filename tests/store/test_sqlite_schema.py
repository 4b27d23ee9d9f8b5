"""SQLite layout: ``stepstone_`` tables, migration of older stores, read-only opening.

``fixtures/store_v1.sqlite`` is frozen: it was written by stepstone 0.1.0 before the table
prefix (schema version 1: tables ``kv``, ``runs``, ``journal``) and holds three plain values
(``greeting``, ``fan:1``, ``fan:2``), a done Plan run ``etl-done`` (steps ``shout``, ``bang``
on input ``"hi"``) and a failed one ``etl-failed`` (``extract`` done, ``broken`` raised
``ValueError: bad row 7``). Never rewrite it; tests work on copies.

``fixtures/store_v2.sqlite`` is frozen too: schema version 2 (the ``stepstone_`` tables, as a
new store got them from that version on), written through the public API and then switched
to ``journal_mode=DELETE`` so that it is one self-contained file. It holds the same three
plain values, the same two Plan runs (now with their ``plan shape`` journal rows and
``encoding`` envelopes: ``etl-done``, steps ``shout`` and ``bang`` with ``writes="loud"`` and
``"final"``; ``etl-failed``, ``extract`` done with ``writes="raw"`` and ``broken`` raising
``ValueError: bad row 7``), and one finished graph run under ``graph:<uuid>`` (one node
``inc`` adding 1 to ``n=41``).

``fixtures/store_v3.sqlite`` is frozen the same way: schema version 3 (a checksum, ``crc``,
on every row), written through the public API with the same records as ``store_v2``, then
switched to ``journal_mode=DELETE``.

``fixtures/store_v4.sqlite`` is frozen the same way: schema version 4 (timers, messages,
events and streams beside the journal; no times on journal rows), with the records of
``store_v3`` and a finished agent run ``agent:bill-1:checkpoint:latest`` (run id ``bill-1``,
thread ``t1``: the model called ``lookup(order="o-42")``, which returned
``"order o-42 ok"``, then answered ``"Done."``).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.exceptions import StoreDamagedError, StoreError
from stepstone.store._sqlite import MIGRATIONS

FIXTURE = Path(__file__).parent / "fixtures" / "store_v1.sqlite"
FIXTURE_V2 = Path(__file__).parent / "fixtures" / "store_v2.sqlite"
#: Every frozen store, one per on-disk format an older stepstone wrote.
FROZEN = sorted((Path(__file__).parent / "fixtures").glob("store_v*.sqlite"))


def _tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    conn.close()
    return {str(r[0]) for r in rows}


def _columns(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'stepstone%'"
            )
        ]
        return {n: conn.execute(f"PRAGMA table_info({n})").fetchall() for n in sorted(names)}
    finally:
        conn.close()


def _layout(path: Path) -> dict[str, object]:
    """Per stepstone table: its columns, whether it is ``WITHOUT ROWID``, and its indexes
    (uniqueness, origin, columns; not names, which a renamed table keeps from its old name)."""
    conn = sqlite3.connect(path)
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name LIKE 'stepstone%'"
        ).fetchall()
        out: dict[str, object] = {}
        for name, sql in sorted(tables):
            indexes = sorted(
                (
                    unique,
                    origin,
                    tuple(c[2] for c in conn.execute(f"PRAGMA index_info('{index}')")),
                )
                for _, index, unique, origin, _ in conn.execute(f"PRAGMA index_list('{name}')")
            )
            out[name] = (
                conn.execute(f"PRAGMA table_info('{name}')").fetchall(),
                "WITHOUT ROWID" in " ".join(str(sql).upper().split()),
                indexes,
            )
        return out
    finally:
        conn.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _v1_copy(tmp_path: Path) -> Path:
    path = tmp_path / "old.sqlite"
    shutil.copyfile(FIXTURE, path)
    return path


def test_new_store_uses_prefixed_tables_next_to_a_users_kv_table(tmp_path: Path) -> None:
    # guarantee 140
    path = tmp_path / "app.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE kv (id INTEGER PRIMARY KEY, label TEXT)")
    conn.execute("INSERT INTO kv (label) VALUES ('mine')")
    conn.commit()
    conn.close()
    with Store(db=path) as store:
        store.write("k", 1)
        assert store.read("k") == 1
    assert {"stepstone_schema", "stepstone_kv", "stepstone_runs", "stepstone_journal"} <= _tables(
        path
    )
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT label FROM kv").fetchall() == [("mine",)]
    assert conn.execute("SELECT MAX(version) FROM stepstone_schema").fetchone() == (
        len(MIGRATIONS),
    )
    conn.close()


def _assert_records_of_every_version(store: Store) -> None:
    """The records every frozen store holds: a value, a fan-out's values, a finished Plan."""
    assert store.read("greeting") == {"text": "hello"}
    assert dict(store.items(prefix="fan:")) == {"fan:1": 1, "fan:2": 2}
    done = store.read("etl-done")
    assert done["status"] == "done" and done["completed_steps"] == ["shout", "bang"]
    assert done["kv"] == {"loud": "HI", "final": "HI!"}


def test_v1_store_is_migrated_on_open_and_keeps_every_record(tmp_path: Path) -> None:
    # guarantee 141
    path = _v1_copy(tmp_path)
    assert {"kv", "runs", "journal"} <= _tables(path)
    with Store(db=path) as store:
        _assert_records_of_every_version(store)
        failed = store.read("etl-failed")
        assert failed["status"] == "failed" and failed["next_step"] == "broken"
        assert failed["error"]["message"] == "bad row 7"
        # The migrated store keeps working: the failed run resumes where it stopped.
        plan = Plan(
            Step(lambda t: "rows", name="extract", writes="raw"),
            Step(lambda rows: f"fixed {rows}", name="broken"),  # the same plan as the fixture
            store=store,
            checkpoint_key="etl-failed",
            resume=True,
        )
        env = Agent(engine=plan)("go")
        assert env.ok and env.payload == "fixed rows"
    tables = _tables(path)
    assert not {"kv", "runs", "journal"} & tables
    fresh = tmp_path / "fresh.sqlite"
    Store(db=fresh).close()
    assert _columns(path) == _columns(fresh)  # migrations and the new-file schema agree
    conn = sqlite3.connect(path)
    versions = [v for (v,) in conn.execute("SELECT version FROM stepstone_schema ORDER BY 1")]
    conn.close()
    assert versions == list(range(1, len(MIGRATIONS) + 1))  # every migration ran once


def test_read_only_open_of_a_v1_store_reads_without_migrating(tmp_path: Path) -> None:
    # guarantee 142
    path = _v1_copy(tmp_path)
    before = _digest(path)
    with Store(db=path, read_only=True) as store:
        assert store.read("greeting") == {"text": "hello"}
        assert store.read("etl-failed")["next_step"] == "broken"
        assert [k for k, _ in store.items(kind="checkpoint")] == ["etl-done", "etl-failed"]
        with pytest.raises(StoreError, match="read-only"):
            store.write("x", 1)
    assert _digest(path) == before
    assert {"kv", "runs", "journal"} <= _tables(path)


def test_read_only_never_touches_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    # guarantee 142
    path = tmp_path / "app.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE kv (k TEXT, v TEXT)")
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(StoreError, match="not a stepstone store"):
        Store(db=path, read_only=True)
    with pytest.raises(StoreError, match="not a stepstone store"):
        Store(url=f"sqlite:///{path}", read_only=True)
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]  # no -wal, no -shm
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    conn.close()


def test_read_only_refuses_missing_files_directories_and_non_sqlite(tmp_path: Path) -> None:
    # guarantee 142
    missing = tmp_path / "missing.sqlite"
    with pytest.raises(StoreError, match="no store file"):
        Store(db=missing, read_only=True)
    with pytest.raises(StoreError, match="no store file"):
        Store(url=f"sqlite:///{missing}", read_only=True)
    assert not missing.exists()
    with pytest.raises(StoreError, match="is a directory"):
        Store(db=tmp_path, read_only=True)
    with pytest.raises(StoreError, match="is a directory"):
        Store(db=tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database\n" * 100)
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store(db=text, read_only=True)
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store(db=text)
    assert text.read_text() == "hello, not a database\n" * 100
    with pytest.raises(ValueError, match="pass db= or url="):
        Store(read_only=True)


def test_newer_schema_is_refused_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    Store(db=path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO stepstone_schema VALUES (?, 0)", (len(MIGRATIONS) + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="upgrade stepstone"):
        Store(db=path)
    with pytest.raises(StoreError, match="upgrade stepstone"):
        Store(db=path, read_only=True)


def test_reading_a_graph_run_does_not_depend_on_imports(tmp_path: Path) -> None:
    # guarantee 143
    path = tmp_path / "g.sqlite"
    script = textwrap.dedent(
        f"""
        from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

        class S(State):
            n: int = 0

        cp = SQLiteCheckpointer({str(path)!r})
        graph = (
            GraphBuilder(S).add_node("inc", lambda s: {{"n": s.n + 1}})
            .add_edge("inc", END).set_entry("inc").with_checkpointer(cp).compile()
        )
        graph.invoke(S(), correlation_id="c-1")
        cp.close()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    reader = textwrap.dedent(
        f"""
        import json, sys
        from stepstone import Store
        with Store(db={str(path)!r}, read_only=True) as store:
            (key,) = store.keys(prefix="graph:")
            assert "stepstone.engines.graph._checkpoint" not in sys.modules
            value = store.read(key)
        print(json.dumps(value, sort_keys=True, default=str))
        """
    )
    first = subprocess.run(
        [sys.executable, "-c", reader], check=True, timeout=120, capture_output=True, text=True
    ).stdout
    with Store(db=path, read_only=True) as store:
        import json

        import stepstone.graph  # noqa: F401

        (key,) = store.keys(prefix="graph:")
        second = json.dumps(store.read(key), sort_keys=True, default=str)
    assert first.strip() == second
    view = json.loads(first)
    assert view["kind"] == "graph" and view["status"] == "done" and view["state"] == {"n": 1}


def test_several_processes_opening_a_v1_store_migrate_it_once(tmp_path: Path) -> None:
    # guarantee 141
    path = _v1_copy(tmp_path)
    script = textwrap.dedent(
        f"""
        from stepstone import Store
        with Store(db={str(path)!r}) as store:
            assert store.read("greeting") == {{"text": "hello"}}
            assert store.read("etl-done")["status"] == "done"
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    conn = sqlite3.connect(path)
    versions = [v for (v,) in conn.execute("SELECT version FROM stepstone_schema ORDER BY 1")]
    conn.close()
    assert versions == list(range(1, len(MIGRATIONS) + 1))  # every migration ran once


def _v2_copy(tmp_path: Path) -> Path:
    path = tmp_path / "v2.sqlite"
    shutil.copyfile(FIXTURE_V2, path)
    return path


def test_v2_store_opens_and_keeps_every_record(tmp_path: Path) -> None:
    # guarantee 141
    path = _v2_copy(tmp_path)
    with Store(db=path) as store:
        _assert_records_of_every_version(store)
        (graph_key,) = store.keys(prefix="graph:")
        graph = store.read(graph_key)
        assert graph["status"] == "done" and graph["state"] == {"n": 42}
        failed = store.read("etl-failed")
        assert failed["status"] == "failed" and failed["error"]["message"] == "bad row 7"
        plan = Plan(
            Step(lambda t: "rows", name="extract", writes="raw"),
            Step(lambda rows: f"fixed {rows}", name="broken"),  # the fixture's plan, fixed
            store=store,
            checkpoint_key="etl-failed",
            resume=True,
        )
        env = Agent(engine=plan)("go")
        assert env.ok and env.payload == "fixed rows"
        assert store.read("etl-failed")["completed_steps"] == ["extract", "broken"]
    conn = sqlite3.connect(path)
    versions = [v for (v,) in conn.execute("SELECT version FROM stepstone_schema ORDER BY 1")]
    conn.close()
    assert versions == list(range(2, len(MIGRATIONS) + 1))  # each later migration ran once


@pytest.mark.parametrize("fixture", FROZEN, ids=lambda p: p.stem)
def test_read_only_open_of_every_frozen_store_changes_no_byte(
    tmp_path: Path, fixture: Path
) -> None:
    # guarantee 142
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    before = _digest(path)
    with Store(db=path, read_only=True) as store:
        assert store.read("greeting") == {"text": "hello"}
        assert store.read("etl-done")["kv"] == {"loud": "HI", "final": "HI!"}
        assert store.read("etl-failed")["next_step"] == "broken"
    assert _digest(path) == before


@pytest.mark.parametrize("fixture", FROZEN, ids=lambda p: p.stem)
def test_every_frozen_store_upgrades_to_exactly_a_new_stores_layout(
    tmp_path: Path, fixture: Path
) -> None:
    # guarantee 351
    assert len(FROZEN) >= 2  # store_v1 and store_v2 at least
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    Store(db=path).close()
    fresh = tmp_path / "fresh.sqlite"
    Store(db=fresh).close()
    layout = _layout(path)
    assert layout == _layout(fresh)
    assert set(layout) == {
        "stepstone_kv",
        "stepstone_runs",
        "stepstone_journal",
        "stepstone_schema",
        # guarantee 504: what a run keeps beside its journal (schema version 4)
        "stepstone_timers",
        "stepstone_messages",
        "stepstone_events",
        "stepstone_streams",
        # guarantee 570: the webhook outbox
        "stepstone_webhooks",
    }


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        ("DELETE FROM stepstone_schema", "records schema version 0, but the file has"),
        ("UPDATE stepstone_schema SET version = 1", "lacks journal, kv, runs"),
        ("UPDATE stepstone_schema SET version = -1", "-1, not a version number"),
    ],
)
def test_a_damaged_schema_table_is_refused_before_anything_is_written(
    tmp_path: Path, damage: str, what: str
) -> None:
    """guarantee 131: a lost or changed version row never makes the store create its tables
    again or migrate tables it already migrated (a bare "table already exists")."""
    path = tmp_path / "s.sqlite"
    with Store(db=path) as store:
        store.write("kept", 1)
    tables = _tables(path)
    conn = sqlite3.connect(path)
    conn.execute(damage)
    conn.commit()
    before = conn.execute("SELECT key, value FROM stepstone_kv").fetchall()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(StoreDamagedError, match="stepstone_schema table") as info:
            Store(db=path, read_only=read_only)
        assert what in str(info.value) and "nothing was written" in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT key, value FROM stepstone_kv").fetchall() == before
    assert _tables(path) == tables  # none created, none dropped
    assert {"stepstone_schema", "stepstone_kv", "stepstone_runs"} <= tables
    conn.close()


@pytest.mark.parametrize(
    ("sql", "what"),
    [
        ("replace(sql, 'created_at', 'crXated_at')", "instead of"),
        ("replace(sql, 'status', CAST(X'73FF6174' AS TEXT))", "instead of"),
        ("replace(sql, ' (', CAST(X'20FF28' AS TEXT))", "table definition is damaged"),
    ],
)
def test_a_damaged_table_definition_is_found_at_open(tmp_path: Path, sql: str, what: str) -> None:
    """guarantee 131: a flipped byte in a table's definition (SQLite's schema text) is a
    StoreDamagedError when the store opens, not a bare "no such column" or a decoding error
    on a later read."""
    path = tmp_path / "s.sqlite"
    with Store(db=path) as store:
        store.write("kept", 1)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(f"UPDATE sqlite_master SET sql = {sql} WHERE name = 'stepstone_runs'")
    conn.commit()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(StoreDamagedError, match="stepstone_schema table") as info:
            Store(db=path, read_only=read_only)
        assert what in str(info.value)
