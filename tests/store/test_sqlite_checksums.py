"""Row checksums on SQLite: a byte changed inside a stored value is found on read.

Every test damages the closed store file itself (one byte of a value, found by its
content), as a failing disk does, never through SQL; the value stays valid text of the
same length and type, so nothing but the checksum can tell.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, CheckpointCorruptError, Plan, Step, Store
from stepstone.store import check_store
from tests.store.damage import flip, settle, stored_rows

FIXTURE_V2 = Path(__file__).parent / "fixtures" / "store_v2.sqlite"


def failed_plan(store: Store, calls: list[str], *, fail: bool) -> Plan:
    """Step ``a`` returns a marked output; step ``b`` fails while ``fail``."""

    def a(_: Any) -> str:
        calls.append("a")
        return "output-of-a-" + "x" * 60

    def b(text: str) -> str:
        calls.append("b")
        if fail:
            raise RuntimeError("b broke on purpose")
        return text.upper()

    return Plan(Step(a), Step(b), store=store, checkpoint_key="job", resume=True)


@pytest.fixture
def failed_run(tmp_path: Path) -> Path:
    db = tmp_path / "run.sqlite"
    with Store(db=db) as store:
        assert not Agent(engine=failed_plan(store, [], fail=True))("go").ok
        store.write("other", {"kept": True})
    settle(db)
    return db


def test_a_changed_byte_in_a_step_output_refuses_the_resume(failed_run: Path) -> None:
    # guarantee 353, 132: the output of a stays valid JSON text of the same length; without
    # its checksum, the resume would hand "output-Qf-a..." to b
    flip(failed_run, b"output-of-a-", at=7)
    before = stored_rows(failed_run)
    calls: list[str] = []
    with Store(db=failed_run) as store:
        for _ in range(2):
            with pytest.raises(
                CheckpointCorruptError, match=r"'job'.*journal row \d+ does not match its checksum"
            ):
                Agent(engine=failed_plan(store, calls, fail=False))("go")
        with pytest.raises(CheckpointCorruptError, match="'job'"):
            store.read("job")
        assert store.read("other") == {"kept": True}
    assert calls == []
    assert stored_rows(failed_run) == before


def test_a_changed_byte_in_a_run_head_is_listed_as_corrupt(failed_run: Path) -> None:
    # guarantee 353, 133: the failed run's error text in its head, changed; the head still
    # decodes, so only its checksum tells
    flip(failed_run, b"b broke on purpose", at=2, to=b"c")
    with Store(db=failed_run) as store:
        heads = {head.key: head for head in store.backend.run_list(None)}
        assert heads["job"].status == "corrupt"
        assert "run head does not match its checksum" in heads["job"].meta["corrupt"]
        with pytest.raises(CheckpointCorruptError, match=r"'job'.*run head"):
            Agent(engine=failed_plan(store, [], fail=False))("go")
        report = check_store(store)
    assert [p.key for p in report.problems] == ["job"]
    assert "checksum" in report.problems[0].detail


def test_a_changed_byte_in_a_plain_value_is_refused_on_read(tmp_path: Path) -> None:
    # guarantee 353
    db = tmp_path / "values.sqlite"
    with Store(db=db) as store:
        store.write("price", {"amount": 1250, "note": "net-of-tax"})
        store.write("other", [1, 2])
    settle(db)
    flip(db, b"1250", at=1, to=b"9")  # 1250 -> 1950: still a number, still JSON
    with Store(db=db) as store:
        with pytest.raises(CheckpointCorruptError, match=r"'price'.*value does not match"):
            store.read("price")
        with pytest.raises(CheckpointCorruptError, match="'price'"):
            store.compare_and_swap("price", {"amount": 1250, "note": "net-of-tax"}, 0)
        assert store.read("other") == [1, 2]
    # a read-only open checks the same way
    with Store(db=db, read_only=True) as store, pytest.raises(CheckpointCorruptError):
        store.read("price")


def test_a_checksummed_row_round_trips_every_kind_of_value(tmp_path: Path) -> None:
    # guarantee 353: what a write stores is what a read checks (text beyond ASCII, numbers
    # whole and not, NULL columns), through a plan's claim, commits and a group commit
    db = tmp_path / "kinds.sqlite"
    values: dict[str, Any] = {
        "ключ-✓": "değer ✓ 𝄞",
        "whole": 3,
        "float": 0.1,
        "none": None,
        "nested": {"a": [1.5, "b", None, True]},
    }
    with Store(db=db) as store:
        for key, value in values.items():
            store.write(key, value)
        steps = [Step(lambda p, i=i: f"{p}-é{i}", name=f"s{i}", writes=f"w{i}") for i in range(3)]
        assert Agent(engine=Plan(*steps, store=store, checkpoint_key="plan-✓"))("ü").ok
    with Store(db=db) as store:
        for key, value in values.items():
            assert store.read(key) == value
        assert store.read("w2") == "ü-é0-é1-é2"
        assert store.read("plan-✓")["status"] == "done"
        report = check_store(store)
        assert not report.problems and report.checksums == "a checksum on every row"


def test_rows_of_an_older_store_stay_readable_and_gain_checksums_when_rewritten(
    tmp_path: Path,
) -> None:
    # guarantee 353, 351: a version-2 store's rows have no checksum and read as before
    db = tmp_path / "v2.sqlite"
    shutil.copyfile(FIXTURE_V2, db)
    with Store(db=db, read_only=True) as store:  # read as it is: no checksums at all
        assert check_store(store).checksums == (
            "none: this store's schema (version 2) predates row checksums; open it once for "
            "writing to add them (rows gain theirs when next written)"
        )
    with Store(db=db) as store:
        assert store.read("etl-done")["status"] == "done"
        store.write("fresh", {"n": 1})
        report = check_store(store)
        assert not report.problems
        assert report.checksums is not None
        assert report.checksums.startswith("a checksum on every row but ")
    con = sqlite3.connect(db)
    try:
        unchecked = con.execute("SELECT count(*) FROM stepstone_journal WHERE crc IS NULL")
        assert unchecked.fetchone()[0] > 0
        (crc,) = con.execute("SELECT crc FROM stepstone_kv WHERE key = 'fresh'").fetchone()
        assert isinstance(crc, int)
    finally:
        con.close()


def test_what_sqlite_itself_wrote_is_taken_as_written(failed_run: Path) -> None:
    # guarantee 353: a hand edit in the sqlite3 shell, or an older stepstone still running
    # against the upgraded file (its statements do not know the checksum column), changes
    # rows through SQLite: their checksum is dropped, and they read as written
    con = sqlite3.connect(failed_run)
    try:
        con.execute(  # the value update of the stepstone before checksums
            "INSERT INTO stepstone_kv (key, value, updated_at) VALUES ('other', '[1]', 0) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
            "updated_at = excluded.updated_at"
        )
        # its head commit: every column it knows, the version moved on
        con.execute(
            "UPDATE stepstone_runs SET version = version + 1, iteration = 7, "
            "updated_at = updated_at + 1 WHERE key = 'job'"
        )
        con.execute(  # a hand edit of a journal row
            "UPDATE stepstone_journal SET data = replace(data, 'output-of-a', 'output-of-A') "
            "WHERE run_key = 'job'"
        )
        con.commit()
        rows = {
            table: con.execute(f"SELECT count(*) FROM {table} WHERE crc IS NULL").fetchone()[0]
            for table in ("stepstone_kv", "stepstone_runs", "stepstone_journal")
        }
    finally:
        con.close()
    assert rows == {"stepstone_kv": 1, "stepstone_runs": 1, "stepstone_journal": 1}
    calls: list[str] = []
    with Store(db=failed_run) as store:
        assert store.read("other") == [1]
        assert store.backend.run_get("job").iteration == 7  # type: ignore[union-attr]
        env = Agent(engine=failed_plan(store, calls, fail=False))("go")
    assert env.ok and env.payload.startswith("OUTPUT-OF-A-")  # b ran on the edited output
    assert calls == ["b"]


def test_a_rewrite_of_the_same_value_keeps_its_checksum(tmp_path: Path) -> None:
    # guarantee 353: the trigger that drops checksums never fires for stepstone's own writes
    db = tmp_path / "same.sqlite"
    with Store(db=db) as store:
        for _ in range(2):
            store.write("v", {"same": True})
    con = sqlite3.connect(db)
    try:
        (crc,) = con.execute("SELECT crc FROM stepstone_kv WHERE key = 'v'").fetchone()
    finally:
        con.close()
    assert isinstance(crc, int)


def test_a_damaged_checksum_trigger_is_found_at_open(tmp_path: Path) -> None:
    # guarantee 353, 131: a byte changed in a trigger's text would make every update of its
    # table fail with a bare "no such column"; the store refuses to open instead, naming it
    from stepstone import StoreDamagedError

    db = tmp_path / "trigger.sqlite"
    Store(db=db).close()
    marker = b"stepstone_runs SET crc = NULL"
    flip(db, marker, at=len(marker) - 1, to=b"M")  # NULL -> NULM
    for read_only in (False, True):
        with pytest.raises(StoreDamagedError, match="trigger stepstone_runs_crc is damaged"):
            Store(db=db, read_only=read_only)


def test_a_head_is_written_in_the_column_order_of_the_table() -> None:
    # what the checksum covers is what the columns hold: the row a head commit writes is
    # the head's columns in the table's order (a field added to RunHead must follow)
    from stepstone.store._base import RunHead, head_to_row
    from stepstone.store._sqlite_rows import _head_values

    head = RunHead(
        key="k", kind="plan", status="running", next_step="s", run_uid="u", version=3,
        iteration=2, journal_len=4, host="h", pid=7, pid_start=11, lease_until=5.5,
        meta={"a": 1}, created_at=1.25, updated_at=2.5,
    )  # fmt: skip
    assert _head_values(head) == head_to_row(head)


def test_every_write_path_leaves_a_checksum(tmp_path: Path) -> None:
    # guarantee 353: a claim, step commits, a group commit of concurrent runs, an
    # operator's cancel, fork and retry, a graph and a queued run all write checksummed rows
    # (a write path that left one out would show here as a row without one)
    import asyncio

    from stepstone import submit
    from stepstone.durable import retry_run
    from stepstone.durable._operate import cancel_run, fork_run
    from stepstone.worker import Worker
    from tests.engines.graph._graphs import Counter, loop_graph
    from tests.operate._runs import done_run, failed_run

    db = tmp_path / "paths.sqlite"
    with Store(db=db) as store:
        done_run(store, "done")
        failed_run(store, "failed")
        cancel_run(store, "failed")
        fork_run(store, "done", at="extract", to="forked")
        retry_run(store, "done", from_step="load")

        async def many() -> None:
            plans = [
                Plan(Step(lambda p, i=i: i, name="s", writes=f"g{i}"), store=store,
                     checkpoint_key=f"group-{i}")
                for i in range(6)
            ]  # fmt: skip
            await asyncio.gather(*(Agent(engine=p).run("go") for p in plans))

        asyncio.run(many())
        handle = submit(store, "tests.workers.targets:tool_agent", "queued")
        assert Worker(store, poll_interval=0.05).run(until_idle=True) == 1
        assert handle.result(timeout=5).payload == "QUEUED"
    from stepstone.graph import SQLiteCheckpointer

    cp = SQLiteCheckpointer(db)
    loop_graph(cp).invoke(Counter(limit=2), correlation_id="c")
    cp.close()
    with Store(db=db, read_only=True) as store:
        report = check_store(store)
    assert not report.problems and report.checksums == "a checksum on every row"
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT count(*) FROM stepstone_queue WHERE crc IS NULL").fetchone()
        assert (
            con.execute("SELECT count(*) FROM stepstone_queue WHERE crc IS NULL").fetchone()[0] == 0
        )
    finally:
        con.close()
