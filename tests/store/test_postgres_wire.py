"""A step commit sent with libpq's own calls (``_postgres_wire``): the same statement and
values as through a psycopg cursor, the same errors, and a session that lost its prepared
statements prepares them again."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from stepstone.durable import claim_run
from stepstone.store import Store
from stepstone.store._base import JournalRow, RunHead
from stepstone.store._postgres import PostgresBackend
from stepstone.store._postgres_commit import commit_statement
from stepstone.store._postgres_wire import _STATE, asend, moved, send_commit, text_values

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    with Store(backend=PostgresBackend(pg_url)) as s:
        for key in s.keys():
            s.delete(key)
        yield s


def claimed_head(store: Store, key: str) -> RunHead:
    run = claim_run(store, key, kind="test", resume=False, first_step="s0").run
    assert run is not None
    head = store.backend.run_get(key)
    assert head is not None
    return head


def next_commit(
    head: RunHead, name: str, data: Any, writes: list[tuple[str, str]] | None = None
) -> tuple[RunHead, bytes, list[Any]]:
    """The head after one more step, and its commit statement and parameters."""
    new = dataclasses.replace(
        head, version=head.version + 1, journal_len=head.journal_len + 1, next_step=name
    )
    row = JournalRow(seq=head.journal_len, kind="step", name=name, data=json.dumps(data))
    sql, params, _ = commit_statement(new, head.version, [row], writes or [])
    return new, sql, params


def prepared_names(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name").fetchall()
    return [r[0] for r in rows if r[0].startswith("stepstone_")]


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "unprepared"])
def test_a_commit_sent_with_libpq_lands_as_through_a_cursor(
    store: Store, pg_url: str, prepare: bool
) -> None:
    """guarantee 348: plain values (text with quotes, newlines and non-ASCII, NULL, integers,
    floats) reach the server unchanged; a commit whose head no longer matches moves nothing;
    prepared once per session under the store's own name, or never with prepare=False."""
    head = claimed_head(store, "wire")
    data = {"t": "é ✓ 'q' \"d\" \\ \n%s $1", "n": 3}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for i in range(3):
            head, sql, params = next_commit(head, f"s{i} ü", data, [(f"wire:v{i}", "v é")])
            assert send_commit(conn, sql, params, prepare) is True
        stale = next_commit(dataclasses.replace(head, version=head.version - 1), "x", data)
        assert send_commit(conn, stale[1], stale[2], prepare) is False
        assert len(prepared_names(conn)) == (2 if prepare else 0)  # two statement shapes
    stored = store.backend.run_get("wire")
    assert stored is not None and stored.version == head.version
    assert stored.next_step == "s2 ü" and stored.updated_at == head.updated_at
    journal = store.backend.run_journal("wire")
    assert [r.name for r in journal if r.kind == "step"] == ["s0 ü", "s1 ü", "s2 ü"]
    assert all(json.loads(r.data) == data for r in journal if r.kind == "step")
    assert store.backend.kv_get("wire:v2") == "v é"


def test_a_session_that_lost_its_prepared_statements_prepares_them_again(
    store: Store, pg_url: str
) -> None:
    """guarantee 348: after ``DEALLOCATE ALL`` (psycopg sends one on the same connection
    after a ROLLBACK or a DROP; a pooler may hand over another session) each statement is
    prepared again when it is next sent, and a statement the session still holds is used
    as it is; every commit lands once."""
    head = claimed_head(store, "dealloc")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        head, sql, params = next_commit(head, "s0", {})  # shape A: one row
        assert send_commit(conn, sql, params, True) is True
        conn.execute("DEALLOCATE ALL")
        assert prepared_names(conn) == []
        head, sql, params = next_commit(head, "s1", {}, [("dealloc:v", "1")])  # shape B
        assert send_commit(conn, sql, params, True) is True
        assert len(prepared_names(conn)) == 1  # B only; this connection still notes A
        head, sql, params = next_commit(head, "s2", {})  # A: missing, prepared again
        assert send_commit(conn, sql, params, True) is True
        head, sql, params = next_commit(head, "s3", {}, [("dealloc:v", "2")])  # B as it is
        assert send_commit(conn, sql, params, True) is True
        getattr(conn, _STATE).clear()  # the connection forgot what it prepared
        head, sql, params = next_commit(head, "s4", {})  # A: present already, used
        assert send_commit(conn, sql, params, True) is True
        assert len(prepared_names(conn)) == 2
    journal = store.backend.run_journal("dealloc")
    assert [r.name for r in journal][-5:] == ["s0", "s1", "s2", "s3", "s4"]
    assert store.backend.kv_get("dealloc:v") == "2"


def test_values_libpq_text_cannot_carry_go_through_a_cursor(store: Store, pg_url: str) -> None:
    """guarantee 348: a NUL byte or a lone surrogate (alone or in an array), a nested
    array, or a connection whose client encoding is not UTF-8 sends nothing this way (the
    cursor sends it, and raises what it always raised). Arrays of text, integers, floats
    (a commit's rows' start times) and NULLs go as array literals."""
    assert text_values(["a\0b"]) is None
    assert text_values(["\ud800"]) is None
    assert text_values([["a", "b\0"]]) is None
    assert text_values([["\ud800"]]) is None
    assert text_values([[["a"]]]) is None
    assert text_values([[0.5, None, 1795847869.4555278]]) == [b"{0.5,NULL,1795847869.4555278}"]
    assert text_values([True]) is None  # not a plain int: psycopg knows its type
    assert text_values([None, "é", 7, 0.5]) == [None, "é".encode(), b"7", b"0.5"]
    assert text_values([['a"b\\', None, "NULL", "é"], [1, -2], []]) == [
        '{"a\\"b\\\\",NULL,"NULL","é"}'.encode(),
        b"{1,-2}",
        b"{}",
    ]
    head = claimed_head(store, "latin")
    with psycopg.connect(pg_url, autocommit=True, client_encoding="latin1") as conn:
        _, sql, params = next_commit(head, "s0", {})
        assert send_commit(conn, sql, params, True) is None
        assert store.backend.run_get("latin") == head  # nothing sent


def test_a_journal_name_with_a_nul_byte_fails_as_through_a_cursor(store: Store) -> None:
    """guarantee 348: a value libpq text cannot carry goes through psycopg, which refuses
    it; nothing is written."""
    run = claim_run(store, "nul", kind="test", resume=False, first_step="s0").run
    assert run is not None
    with pytest.raises(psycopg.DataError, match="NUL"):
        run.commit_sync(status="running", next_step="s1", rows=[("step", "bad\0name", {})])
    stored = store.backend.run_get("nul")
    assert stored is not None and stored.version == run.head.version


def test_a_server_error_is_psycopgs_error_with_its_sqlstate(store: Store, pg_url: str) -> None:
    """guarantee 348: a value the server refuses raises psycopg's error class for its
    SQLSTATE, as through a cursor, and the session stays usable."""
    head = claimed_head(store, "refused")
    _, sql, params = next_commit(head, "s0", {})
    params[2] = 1.5  # the new version, sent as a float to an int8 placeholder
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation) as caught:
            send_commit(conn, sql, params, True)
        assert caught.value.sqlstate == "22P02"
        assert conn.execute("SELECT 1").fetchone() == (1,)
        _, sql, params = next_commit(head, "s0", {})
        assert send_commit(conn, sql, params, True) is True


def test_a_connection_ended_by_the_server_is_reported_broken(store: Store, pg_url: str) -> None:
    """guarantee 348: a session ended under it raises psycopg's OperationalError and the
    connection reads as broken, so the backend settles the commit from the stored head."""
    head = claimed_head(store, "ended")
    _, sql, params = next_commit(head, "s0", {})
    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        psycopg.connect(pg_url, autocommit=True) as admin,
    ):
        pid = conn.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            send_commit(conn, sql, params, True)
        assert conn.broken


def test_an_async_commit_goes_the_same_way(store: Store, pg_url: str) -> None:
    """guarantee 348: the same on an async connection, awaited on the loop."""
    head = claimed_head(store, "async-wire")

    async def main() -> list[bool | None]:
        conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        try:
            _, sql, params = next_commit(head, "s0", {"i": 0})
            first = await asend(conn, sql, params, True, moved)
            return [first, await asend(conn, sql, params, True, moved)]  # stale the 2nd time
        finally:
            await conn.close()

    assert asyncio.run(main()) == [True, False]
    assert [r.name for r in store.backend.run_journal("async-wire")][-1:] == ["s0"]


def _cancel_while_locked(
    store: Store, pg_url: str, key: str, hold: float, setting: str | None = None
) -> tuple[BaseException, float, str]:
    """An async commit of one step of ``key`` sent while another session holds the run's
    head, its task cancelled twice while it waits; the lock goes after ``hold`` seconds.
    What the task raised, how long it took, and the connection's state afterwards."""
    import time

    head = claimed_head(store, key)
    _, sql, params = next_commit(head, "s0", {"i": 0})

    async def main() -> tuple[BaseException, float, str]:
        conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        blocker = await psycopg.AsyncConnection.connect(pg_url)
        try:
            if setting is not None:
                await conn.execute(setting)
            await blocker.execute("SELECT 1 FROM stepstone_runs WHERE key = %s FOR UPDATE", (key,))
            started = time.monotonic()
            task = asyncio.ensure_future(asend(conn, sql, params, True, moved))
            await asyncio.sleep(0.1)  # sent, and waiting for the lock
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # a second cancellation while it still waits
            await asyncio.sleep(hold)
            await blocker.commit()
            try:
                await task
            except BaseException as exc:  # noqa: BLE001 - what the task raised is the result
                raised = exc
            else:
                raise AssertionError("the cancelled commit returned")
            took = time.monotonic() - started
            await conn.execute("SELECT 1")  # the connection is usable again
            return raised, took, conn.info.transaction_status.name
        finally:
            await conn.close()
            await blocker.close()

    return asyncio.run(main())


def test_a_sent_async_commit_runs_to_its_answer_through_cancellations(
    store: Store, pg_url: str
) -> None:
    """guarantee 346: cancelled (twice) while the server holds it on a lock, the statement is
    not cancelled on the server: it lands once the lock goes, and then the cancellation is
    raised; the connection is idle and usable."""
    raised, took, state = _cancel_while_locked(store, pg_url, "cancel-wire", hold=0.4)
    assert isinstance(raised, asyncio.CancelledError)
    assert raised.__cause__ is None
    assert took >= 0.4  # it waited for the answer
    assert state == "IDLE"
    assert [r.name for r in store.backend.run_journal("cancel-wire")] == ["s0"]


def test_a_cancelled_async_commit_whose_answer_is_an_error_says_so(
    store: Store, pg_url: str
) -> None:
    """guarantee 346: the answer of a cancelled commit is an error (here the lock's wait
    timed out on the server): the cancellation is raised with that error as its cause,
    and nothing landed."""
    raised, _, state = _cancel_while_locked(
        store, pg_url, "cancel-wire-error", hold=0.6, setting="SET lock_timeout = '300ms'"
    )
    assert isinstance(raised, asyncio.CancelledError)
    assert isinstance(raised.__cause__, psycopg.errors.LockNotAvailable)
    assert state == "IDLE"
    assert list(store.backend.run_journal("cancel-wire-error")) == []


def test_an_interrupted_sync_commit_lands_then_the_interrupt_is_raised(
    store: Store, pg_url: str
) -> None:
    """guarantee 445: Ctrl-C while the server runs a sync commit (here: waits for a lock)
    does not cancel the statement: it lands once the lock goes, then KeyboardInterrupt is
    raised; the connection is idle and usable."""
    import os
    import signal
    import threading
    import time

    head = claimed_head(store, "interrupted")
    _, sql, params = next_commit(head, "s0", {"i": 0})
    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        psycopg.connect(pg_url) as blocker,
        psycopg.connect(pg_url, autocommit=True) as watcher,
    ):
        blocker.execute("SELECT 1 FROM stepstone_runs WHERE key = 'interrupted' FOR UPDATE")
        pid = conn.info.backend_pid

        def interrupt_then_unlock() -> None:
            deadline = time.monotonic() + 60
            waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
            while watcher.execute(waiting, (pid,)).fetchone() != ("Lock",):
                assert time.monotonic() < deadline, "the commit never waited for the lock"
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, on the main thread
            time.sleep(0.3)
            blocker.commit()

        helper = threading.Thread(target=interrupt_then_unlock)
        helper.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                send_commit(conn, sql, params, True)
        finally:
            helper.join(60)
        assert conn.info.transaction_status.name == "IDLE"
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert [r.name for r in store.backend.run_journal("interrupted")] == ["s0"]


def test_the_wire_uses_only_psycopgs_documented_modules() -> None:
    """The commit path past psycopg's cursors uses ``psycopg.pq`` (documented: libpq's
    wrapper, reached through ``Connection.pgconn``) and ``psycopg.errors``, none of
    psycopg's undocumented modules (``generators``, ``waiting``), which psycopg does not
    promise to keep."""
    import ast
    import inspect

    from stepstone.store import _postgres_wire

    tree = ast.parse(inspect.getsource(_postgres_wire))
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psycopg"):
            used |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            used |= {a.name for a in node.names if a.name.startswith("psycopg")}
    assert used == {"psycopg", "psycopg.errors", "psycopg.pq"}
    undocumented = {"generators", "waiting", "wait", "lock", "error_from_result"}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not attributes & undocumented, attributes & undocumented
