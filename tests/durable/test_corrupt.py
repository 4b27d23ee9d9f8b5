"""Corrupt records: every bad byte is a CheckpointCorruptError naming the key; a failed
resume writes nothing; one corrupt run never hides the others."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, CheckpointCorruptError, Envelope, Plan, Step, Store


def run(plan: Plan) -> Envelope[Any]:
    return Agent(engine=plan)("go")


def plan_of(store: Store, key: str, fail: set[str]) -> Plan:
    def a(payload: Any) -> dict[str, Any]:
        return {"a": payload}

    def b(payload: Any) -> str:
        if "b" in fail:
            raise RuntimeError("b broke")
        return "b"

    return Plan(Step(a, writes=f"{key}-a"), Step(b), store=store, checkpoint_key=key, resume=True)


def table(con: sqlite3.Connection, suffix: str) -> str:
    """The table whose name ends with ``suffix`` (``runs``, ``journal``, ``kv``)."""
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    (name,) = [n for n in names if n == suffix or n.endswith(f"_{suffix}")]
    return str(name)


def dump(db: Path) -> list[Any]:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        con.text_factory = bytes
        rows = {t: con.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables}
        return [(t, sorted(rows[t], key=repr)) for t in tables]
    finally:
        con.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "corrupt.sqlite"
    with Store(db=path) as store:
        for key in ("bad", "good"):
            assert not run(plan_of(store, key, {"b"})).ok  # failed at b: resumable
    yield path


def corrupt(db: Path, sql: str, *args: Any) -> None:
    con = sqlite3.connect(db)
    try:
        sql = sql.replace("{runs}", table(con, "runs")).replace("{journal}", table(con, "journal"))
        con.execute(sql, args)
        con.commit()
    finally:
        con.close()


CORRUPTIONS = {
    "meta is not JSON": ("UPDATE {runs} SET meta = '[[[' WHERE key = 'bad'", "column meta"),
    "meta is not an object": ("UPDATE {runs} SET meta = '[1]' WHERE key = 'bad'", "meta"),
    "head status unknown": ("UPDATE {runs} SET status = 'dXne' WHERE key = 'bad'", "status"),
    "run unfinished without a next step": (
        "UPDATE {runs} SET next_step = NULL WHERE key = 'bad'",
        "names no step to continue at",
    ),
    "head not UTF-8": (
        "UPDATE {runs} SET next_step = CAST(X'62FF' AS TEXT) WHERE key = 'bad'",
        "UTF-8",
    ),
    "journal not JSON": (
        "UPDATE {journal} SET data = '{\"envel' WHERE run_key = 'bad' AND seq = 0",
        "journal row 0",
    ),
    "journal kind unknown": (
        "UPDATE {journal} SET kind = 'stXp' WHERE run_key = 'bad' AND kind = 'step'",
        "journal row",
    ),
    "journal not UTF-8": (
        "UPDATE {journal} SET data = CAST(X'7B22FF22' AS TEXT) WHERE run_key = 'bad'",
        "UTF-8",
    ),
    "journal row past the head's count": (
        "UPDATE {runs} SET journal_len = journal_len - 1 WHERE key = 'bad'",
        "rows [1] past them",
    ),
    "journal count absurd": (
        "UPDATE {runs} SET journal_len = 1000000000000 WHERE key = 'bad'",
        "rows [2, 3, 4",
    ),
    "journal seq not a number": (
        "UPDATE {journal} SET seq = 'x' WHERE run_key = 'bad' AND seq = 1",
        "not an integer",
    ),
    "plan rejoin not a step name": (
        "UPDATE {runs} SET meta = json_set(meta, '$.rejoin', 7) WHERE key = 'bad'",
        "rejoin",
    ),
    "plan rejoin names no step": (
        "UPDATE {runs} SET meta = json_set(meta, '$.rejoin', 'zz') WHERE key = 'bad'",
        "written by this very Plan",
    ),
    "plan next step moved to another step": (
        "UPDATE {runs} SET next_step = 'a' WHERE key = 'bad'",
        "failed at step 'b' but continues at step 'a'",
    ),
    "plan position not a count": (
        "UPDATE {runs} SET meta = json_set(meta, '$.position', 'zz') WHERE key = 'bad'",
        "position",
    ),
    "journal field name damaged": (
        "UPDATE {journal} SET data = replace(data, '\"writes\"', '\"wrXtes\"') "
        "WHERE run_key = 'bad' AND kind = 'step'",
        "['wrXtes']",
    ),
    "journal envelope field name damaged": (
        "UPDATE {journal} SET data = replace(data, '\"encoding\"', '\"encodinf\"') "
        "WHERE run_key = 'bad' AND kind = 'step'",
        "['envelope.encodinf']",
    ),
    "plan steps row lists no steps": (
        "UPDATE {journal} SET data = '{\"steps\": 5}' WHERE run_key = 'bad' AND kind = 'plan'",
        "(the plan's steps) is not a list",
    ),
    "plan steps row entry damaged": (
        "UPDATE {journal} SET data = replace(data, 'false', '0') "
        "WHERE run_key = 'bad' AND kind = 'plan'",
        "(the plan's steps) is not a list",
    ),
    "journal envelope wrong shape": (
        'UPDATE {journal} SET data = \'{"envelope": {"error": 5}}\' '
        "WHERE run_key = 'bad' AND kind = 'step'",
        "step 'a'",
    ),
}


#: Corruptions only the Plan that wrote the run can see (a step name it does not have).
ONLY_THE_PLAN_KNOWS = {"plan rejoin names no step", "plan next step moved to another step"}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_resume_of_a_corrupt_run_names_the_key_and_writes_nothing(db: Path, case: str) -> None:
    # guarantee 122, 131, 132
    sql, what = CORRUPTIONS[case]
    corrupt(db, sql)
    before = dump(db)
    for _ in range(2):  # the second attempt gets the same error, not "owned by a live run"
        with Store(db=db) as store:
            with pytest.raises(CheckpointCorruptError, match=r"'bad'") as info:
                run(plan_of(store, "bad", set()))
            assert what in str(info.value)
            assert "store.delete('bad')" in str(info.value)
        assert dump(db) == before
    with Store(db=db) as store:
        assert run(plan_of(store, "good", set())).ok  # the others are untouched


def test_a_resume_of_a_run_missing_a_journal_row_refuses_and_writes_nothing(db: Path) -> None:
    """guarantee 131, 132: a lost row (its step would silently drop out of the run) is
    found before the claim, by the head's count of rows."""
    corrupt(db, "DELETE FROM {journal} WHERE run_key = 'bad' AND seq = 1")
    before = dump(db)
    with (
        Store(db=db) as store,
        pytest.raises(CheckpointCorruptError, match=r"'bad'.*rows \[1\] are missing"),
    ):
        run(plan_of(store, "bad", set()))
    assert dump(db) == before


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM {runs} WHERE key = 'bad'",
        "UPDATE {runs} SET key = 'bXd' WHERE key = 'bad'",  # a flipped byte in its key
    ],
)
def test_journal_rows_whose_head_was_lost_are_never_started_over(db: Path, sql: str) -> None:
    """guarantee 131, 132: a fresh start over rows no head counts would drop them and run
    every step again; it is refused, nothing written, until the key is deleted."""
    corrupt(db, sql)
    before = dump(db)
    with Store(db=db) as store:
        for _ in range(2):
            with pytest.raises(
                CheckpointCorruptError, match=r"'bad'.*journal rows but no run head"
            ):
                run(plan_of(store, "bad", set()))
        assert dump(db) == before
        store.delete("bad")
        assert run(plan_of(store, "bad", set())).ok


def test_a_run_kind_no_engine_writes_is_named_as_possible_damage(db: Path) -> None:
    """guarantee 132: a kind a flipped byte changed ("plan" -> "qlan") is refused like any
    other engine's run under the key, and the message says it may be damage."""
    from stepstone.exceptions import StoreKeyConflictError

    corrupt(db, "UPDATE {runs} SET kind = 'qlan' WHERE key = 'bad'")
    before = dump(db)
    with (
        Store(db=db) as store,
        pytest.raises(StoreKeyConflictError, match="a damaged byte changed the record's kind"),
    ):
        run(plan_of(store, "bad", set()))
    assert dump(db) == before


def band_plan(store: Store, calls: list[str], fail: bool) -> Plan:
    """first, then a band of left and right (right fails when ``fail``), then after."""

    def step(name: str) -> Any:
        def run(payload: Any) -> str:
            calls.append(name)
            if fail and name == "right":
                raise RuntimeError("right broke")
            return name

        run.__name__ = name
        return run

    return Plan(
        Step(step("first")),
        Step(step("left"), parallel=True),
        Step(step("right"), parallel=True),
        Step(step("after")),
        store=store,
        checkpoint_key="band",
        resume=True,
    )


BAND_CORRUPTIONS = {
    "a branch filed under another name": (
        "UPDATE {journal} SET name = 'lXft' WHERE run_key = 'band' AND name = 'left'",
        "'left/lXft'",
    ),
    "a branch filed under no band": (
        "UPDATE {journal} SET data = json_remove(data, '$.band') "
        "WHERE run_key = 'band' AND name = 'left'",
        "['left']",
    ),
    "a branch filed under another band": (
        "UPDATE {journal} SET data = json_set(data, '$.band', 'first') "
        "WHERE run_key = 'band' AND name = 'left'",
        "'first/left'",
    ),
    "a branch row without its envelope": (
        "UPDATE {journal} SET data = json_remove(data, '$.envelope') "
        "WHERE run_key = 'band' AND name = 'left'",
        "has no envelope",
    ),
}


@pytest.mark.parametrize("case", sorted(BAND_CORRUPTIONS))
def test_a_band_branch_filed_wrongly_is_corrupt_not_run_again(tmp_path: Path, case: str) -> None:
    """guarantee 131, 132: a finished branch of a band that failed elsewhere is reused on
    resume; a damaged name, band or envelope must not make it run again."""
    db = tmp_path / "band.sqlite"
    with Store(db=db) as store:
        assert not run(band_plan(store, [], fail=True)).ok
    sql, what = BAND_CORRUPTIONS[case]
    corrupt(db, sql)
    before = dump(db)
    calls: list[str] = []
    with Store(db=db) as store, pytest.raises(CheckpointCorruptError, match="'band'") as info:
        run(band_plan(store, calls, fail=False))
    assert what in str(info.value)
    assert calls == [] and dump(db) == before


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_read_and_listing_of_a_corrupt_run(db: Path, case: str) -> None:
    # guarantee 131, 133
    sql, _ = CORRUPTIONS[case]
    corrupt(db, sql)
    with Store(db=db) as store:
        if case in ONLY_THE_PLAN_KNOWS:
            assert store.read("bad")["status"] == "failed"
        else:
            with pytest.raises(CheckpointCorruptError, match=r"'bad'"):
                store.read("bad")
        assert store.read("good")["status"] == "failed"
        heads = {h.key: h for h in store.backend.run_list(None)}
        assert set(heads) == {"bad", "good"}
        assert heads["good"].status == "failed"
        if case.startswith(("meta", "head")):
            assert heads["bad"].status == "corrupt" and "'bad'" in heads["bad"].meta["corrupt"]
        assert set(store.keys()) >= {"bad", "good"}


def test_corrupt_plain_value_names_its_key(tmp_path: Path) -> None:
    # guarantee 131
    path = tmp_path / "kv.sqlite"
    with Store(db=path) as store:
        store.write("v", {"ok": 1})
    con = sqlite3.connect(path)
    con.execute(f"UPDATE {table(con, 'kv')} SET value = CAST(X'7B22FF22' AS TEXT)")
    con.commit()
    con.close()
    with Store(db=path) as store, pytest.raises(CheckpointCorruptError, match=r"'v'.*UTF-8"):
        store.read("v")


@pytest.mark.postgres
def test_corrupt_head_on_postgres(pg_url: str) -> None:
    # guarantee 131, 132, 133
    import psycopg

    with Store(url=pg_url) as store:
        for key in ("pg-bad", "pg-good"):
            store.delete(key)
            assert not run(plan_of(store, key, {"b"})).ok
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("UPDATE stepstone_runs SET meta = '[[[' WHERE key = 'pg-bad'")
        before = con.execute("SELECT * FROM stepstone_runs ORDER BY key").fetchall()
    with Store(url=pg_url) as store:
        for _ in range(2):
            with pytest.raises(CheckpointCorruptError, match=r"'pg-bad'.*meta"):
                run(plan_of(store, "pg-bad", set()))
        with pytest.raises(CheckpointCorruptError, match=r"'pg-bad'"):
            store.read("pg-bad")
        heads = {h.key: h.status for h in store.backend.run_list("pg-")}
        assert heads == {"pg-bad": "corrupt", "pg-good": "failed"}
        assert run(plan_of(store, "pg-good", set())).ok
    with psycopg.connect(pg_url, autocommit=True) as con:
        after = con.execute("SELECT * FROM stepstone_runs WHERE key = 'pg-bad'").fetchall()
    assert after == [r for r in before if r[0] == "pg-bad"]


def test_graph_checkpointer_list_skips_a_corrupt_record(tmp_path: Path) -> None:
    # guarantee 133
    from stepstone.graph import CheckpointFilter, SQLiteCheckpointer
    from tests.engines.graph._graphs import Counter, loop_graph

    path = tmp_path / "graph.sqlite"
    cp = SQLiteCheckpointer(path)
    graph = loop_graph(cp)
    graph.invoke(Counter(limit=2), correlation_id="c1")
    graph.invoke(Counter(limit=3), correlation_id="c2")
    first, second = cp.list()
    cp.close()
    con = sqlite3.connect(path)
    con.execute(
        f"UPDATE {table(con, 'runs')} SET meta = '[[[' WHERE key = ?",
        (f"graph:{first.invocation_id}",),
    )
    con.commit()
    con.close()
    cp = SQLiteCheckpointer(path)
    try:
        listed = cp.list()
        assert [r.invocation_id for r in listed] == [second.invocation_id]
        assert cp.list(CheckpointFilter(correlation_id="c2"))[0].status == "done"
        with pytest.raises(CheckpointCorruptError, match=first.invocation_id):
            cp.load(first.invocation_id)
    finally:
        cp.close()
