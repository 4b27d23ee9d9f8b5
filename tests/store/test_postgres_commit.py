"""The PostgreSQL commit path: a step commit as one statement per shape (scalar parameters
for small commits, arrays for large ones), the run-or-value rule of a key when a commit
and a claim race for it, the pipelined claim, and the upgrade of an older schema."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from stepstone.durable import claim_run
from stepstone.durable._kernel import ClaimResult
from stepstone.exceptions import ConcurrentRunError, StoreKeyConflictError
from stepstone.store import Store
from stepstone.store._postgres import MIGRATIONS, PostgresBackend, migrate
from stepstone.store._postgres_commit import SCALAR_LIMIT
from stepstone.store._postgres_schema import KEY_LOCK_CLASS, lock_id
from tests.pgserver import CutProxy, PgServer

pytestmark = pytest.mark.postgres


@pytest.fixture(params=[True, False], ids=["prepared", "unprepared"])
def store(pg_url: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    with Store(backend=PostgresBackend(pg_url, prepare=request.param)) as s:
        for key in s.keys():
            s.delete(key)
        yield s


# -- shapes ---------------------------------------------------------------------------------
def test_every_commit_shape_lands_exactly(store: Store) -> None:
    """guarantee 250: commits with 0 to SCALAR_LIMIT + 2 journal rows and as many writes
    (scalar parameters up to the limit, arrays above it), repeated write keys (the last one
    wins), NULL names, non-ASCII text and the characters an array literal quotes or
    escapes (braces, commas, quotes, backslashes, the word NULL) all land exactly, prepared
    or not."""
    sizes = range(SCALAR_LIMIT + 3)
    claimed = claim_run(store, "shapes", kind="test", resume=False, first_step="a")
    run = claimed.run
    assert run is not None
    expected_rows: list[tuple[int, str, str | None, Any]] = []
    expected_values: dict[str, Any] = {}
    try:
        for n_rows in sizes:
            for n_writes in sizes:
                tag = f"{n_rows}-{n_writes}"
                rows = [
                    (
                        "step",
                        None if i % 2 else f"s{tag}-{i} é" if i % 3 else f'NULL{i}" {{a,b}}\\',
                        {"n": i, "tag": tag, "t": "ü\n'\""},
                    )
                    for i in range(n_rows)
                ]
                writes: list[tuple[str, Any]] = [
                    (f'w{tag}-{i % max(1, n_writes - 1)} ✓ {{"NULL"}},\\', {"i": i, "tag": tag})
                    for i in range(n_writes)
                ]
                for i, (kind, name, data) in enumerate(rows):
                    expected_rows.append((run.head.journal_len + i, kind, name, data))
                expected_values.update(dict(writes))
                version = run.head.version
                run.commit_sync(status="running", next_step=tag, rows=rows, writes=writes)
                head = store.backend.run_get("shapes")
                assert head is not None and head.version == version + 1
                assert head.next_step == tag and head.journal_len == len(expected_rows)
    finally:
        run.release()
    journal = store.backend.run_journal("shapes")
    assert [(r.seq, r.kind, r.name) for r in journal] == [r[:3] for r in expected_rows]
    assert [json.loads(r.data) for r in journal] == [r[3] for r in expected_rows]
    for key, value in expected_values.items():
        assert store.read(key) == value, key


def test_an_unprepared_commit_is_one_call_of_the_server_function(pg_server: PgServer) -> None:
    """guarantee 390: with prepare=False every step commit (a small one, and one whose rows
    and writes are past the scalar limit) is one call of stepstone_step_commit, counted by
    the server, and no statement is prepared on the connection."""
    url = pg_server.create_database("t_commit_fn")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER DATABASE t_commit_fn SET track_functions = 'pl'")
        with Store(backend=PostgresBackend(url, prepare=False)) as store:
            run = claim_run(store, "fn", kind="test", resume=False, first_step="a").run
            assert run is not None
            many = range(SCALAR_LIMIT + 1)
            run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)])
            run.commit_sync(
                status="running", next_step="c", rows=[("step", "b", 2)], writes=[("v", 2)]
            )
            run.commit_sync(
                status="done",
                next_step=None,
                rows=[("step", f"c{i}", i) for i in many],
                writes=[(f"v{i}", i) for i in many],
            )
            run.release()
            with store.backend._connection(5.0) as conn:
                prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            assert store.read("v") == 2 and store.read(f"v{SCALAR_LIMIT}") == SCALAR_LIMIT
            assert [r.name for r in store.backend.run_journal("fn")][-1] == f"c{SCALAR_LIMIT}"
        assert prepared == (0,)
        # the store's connections have ended, which sends the server their statistics
        calls = None
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(100):
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(
                    "SELECT calls FROM pg_stat_user_functions WHERE funcname = %s",
                    ("stepstone_step_commit",),
                ).fetchone()
                calls = row and row[0]
                if calls == 3:
                    break
                time.sleep(0.1)
        assert calls == 3
    finally:
        pg_server.drop_database("t_commit_fn")


@pytest.mark.parametrize("n_writes", [1, 2, SCALAR_LIMIT + 1])
def test_a_write_key_holding_a_run_fails_the_commit_and_writes_nothing(
    store: Store, n_writes: int
) -> None:
    """guarantee 250: in every shape, a write key that holds a run fails the step's commit
    with StoreKeyConflictError naming it, and nothing of the commit is written."""
    other = claim_run(store, "taken", kind="test", resume=False, first_step="a").run
    run = claim_run(store, "writer", kind="test", resume=False, first_step="a").run
    assert other is not None and run is not None
    try:
        writes = [(f"free{i}", i) for i in range(n_writes - 1)] + [("taken", "x")]
        with pytest.raises(StoreKeyConflictError, match="'taken'"):
            run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)], writes=writes)
        head = store.backend.run_get("writer")
        assert head is not None and head.version == run.head.version and head.journal_len == 0
        assert store.backend.run_journal("writer") == []
        assert all(store.read(f"free{i}") is None for i in range(n_writes - 1))
    finally:
        run.release()
        other.release()


# -- a key holds a run or a value, never both, when a claim and a write race ---------------
def _hold_lock_then(
    url: str, key: str, sql: str, params: tuple[Any, ...]
) -> psycopg.Connection[Any]:
    """An open transaction that holds ``key``'s advisory lock (as a claim or a write of it
    would) and has run ``sql``, not yet committed."""
    conn = psycopg.connect(url)
    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id(key)))
    conn.execute(sql.encode(), params)
    return conn


def _race(
    url: str,
    holder: psycopg.Connection[Any],
    call: Callable[[], Any],
    lock: str | None = "advisory",
) -> Any:
    """Start ``call`` in a thread, wait until it waits for a lock the holder holds (of type
    ``lock`` in ``pg_locks``: the key's advisory lock, ``transactionid`` for a row the holder
    changed, None for any), commit the holder, and return what ``call`` returned or
    raised."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        with psycopg.connect(url, autocommit=True) as watcher:
            deadline = time.monotonic() + 60
            while True:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE NOT l.granted AND a.datname = current_database() "
                    "AND l.locktype = coalesce(%s, l.locktype)",
                    (lock,),
                ).fetchone()
                if row and row[0] >= 1:
                    break
                assert thread.is_alive(), out
                assert time.monotonic() < deadline, f"the call never waited for a {lock} lock"
                time.sleep(0.01)
        holder.commit()
    finally:
        holder.close()  # a rollback, if the call never waited
        thread.join(60)
    assert not thread.is_alive()
    return out[0]


_INSERT_RUN = (
    "INSERT INTO stepstone_runs VALUES (%s, 'test', 'running', 'a', 'u', 1, 0, 0, 'h', 1, "
    "NULL, 1e12, '{}', 0, 0)"
)
_INSERT_VALUE = "INSERT INTO stepstone_kv VALUES (%s, '1', 0)"


def test_a_commit_waiting_on_a_claim_of_its_write_key_sees_the_run(
    store: Store, pg_url: str
) -> None:
    """guarantee 251: a step commit whose writes= key is being claimed as a run at that
    moment waits for the claim, then fails with StoreKeyConflictError and writes nothing:
    the check runs after the lock is granted, not on a snapshot taken before it."""
    run = claim_run(store, "committer", kind="test", resume=False, first_step="a").run
    assert run is not None
    try:
        holder = _hold_lock_then(pg_url, "contested", _INSERT_RUN, ("contested",))
        result = _race(
            pg_url,
            holder,
            lambda: run.commit_sync(
                status="running", next_step="b", rows=[("step", "a", 1)], writes=[("contested", 1)]
            ),
        )
        assert isinstance(result, StoreKeyConflictError), result
        assert store.backend.kv_get("contested") is None
        assert store.backend.run_get("contested") is not None
        head = store.backend.run_get("committer")
        assert head is not None and head.version == run.head.version
        assert store.backend.run_journal("committer") == []
    finally:
        run.release()


def test_a_plain_write_waiting_on_a_claim_of_its_key_sees_the_run(
    store: Store, pg_url: str
) -> None:
    """guarantee 252: a plain write racing a claim of its key sees the run."""
    holder = _hold_lock_then(pg_url, "contested", _INSERT_RUN, ("contested",))
    result = _race(pg_url, holder, lambda: store.write("contested", 1))
    assert isinstance(result, StoreKeyConflictError), result
    assert store.backend.kv_get("contested") is None


@pytest.mark.parametrize("how", ["claim", "cas"])
def test_a_claim_or_cas_waiting_on_a_write_of_its_key_sees_the_value(
    store: Store, pg_url: str, how: str
) -> None:
    """guarantee 252: a claim (and a compare-and-swap) racing a plain write of its key sees
    the value once the write commits: the claim refuses to overwrite it."""
    holder = _hold_lock_then(pg_url, "contested", _INSERT_VALUE, ("contested",))
    if how == "claim":
        result = _race(
            pg_url,
            holder,
            lambda: claim_run(store, "contested", kind="test", resume=False, first_step="a"),
        )
        assert isinstance(result, StoreKeyConflictError), result
        assert store.backend.run_get("contested") is None
    else:
        assert _race(pg_url, holder, lambda: store.compare_and_swap("contested", None, 2)) is False
    assert store.read("contested") == 1


def test_a_commit_never_writes_a_value_under_a_key_claimed_after_it(
    store: Store, pg_url: str
) -> None:
    """guarantee 251: the other order: a claim of a key waits for a step commit that writes
    that key, then refuses (the key now holds a value)."""
    run = claim_run(store, "committer", kind="test", resume=False, first_step="a").run
    assert run is not None
    try:
        with psycopg.connect(pg_url) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id("v")))
            result = _race(
                pg_url,
                conn,
                lambda: run.commit_sync(
                    status="running", next_step="b", rows=[("step", "a", 1)], writes=[("v", 1)]
                ),
            )
        assert result is None  # committed once the lock was free
        with pytest.raises(StoreKeyConflictError):
            claim_run(store, "v", kind="test", resume=False, first_step="a")
        assert store.read("v") == 1
    finally:
        run.release()


def _commit_writing(run: Any, key: str) -> Callable[[], None]:
    return lambda: run.commit_sync(
        status="running", next_step="b", rows=[("step", "a", 1)], writes=[(key, 2)]
    )


def test_a_commit_rewriting_a_value_needs_no_key_lock(store: Store, pg_url: str) -> None:
    """guarantee 357: a step commit whose one writes= key already holds a value does not
    wait for that key's advisory lock (it locks the value's row instead): it lands while
    another transaction holds the key's lock."""
    store.write("v", 1)
    run = claim_run(store, "committer", kind="test", resume=False, first_step="a").run
    assert run is not None
    done: list[BaseException | None] = []

    def commit() -> None:
        try:
            _commit_writing(run, "v")()
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            done.append(exc)

    try:
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id("v")))
            thread = threading.Thread(target=commit)
            thread.start()
            thread.join(60)
            finished_under_lock = not thread.is_alive()
        thread.join(60)
        assert finished_under_lock, "the commit waited for the key's advisory lock"
        assert done == [None]
        assert store.read("v") == 2
    finally:
        run.release()


def test_a_commit_whose_value_is_deleted_and_claimed_meanwhile_writes_nothing(
    store: Store, pg_url: str
) -> None:
    """guarantee 357: a step commit rewriting a value that another transaction is deleting
    (and claiming as a run) waits for it, then fails with StoreKeyConflictError and writes
    nothing; it never writes a value beside the run."""
    store.write("v", 1)
    run = claim_run(store, "committer", kind="test", resume=False, first_step="a").run
    assert run is not None
    try:
        holder = psycopg.connect(pg_url)
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id("v")))
        holder.execute("DELETE FROM stepstone_kv WHERE key = 'v'")
        holder.execute(_INSERT_RUN.encode(), ("v",))
        result = _race(pg_url, holder, _commit_writing(run, "v"), lock=None)
        assert isinstance(result, StoreKeyConflictError), result
        assert store.backend.kv_get("v") is None and store.backend.run_get("v") is not None
        head = store.backend.run_get("committer")
        assert head is not None and head.version == run.head.version
        assert store.backend.run_journal("committer") == []
    finally:
        run.release()


def test_a_claim_waits_for_a_commit_rewriting_the_value_under_its_key(
    store: Store, pg_url: str
) -> None:
    """guarantee 357: a claim of a key whose value a step commit is rewriting (holding the
    value's row, not the key's lock) waits for that commit and reads what it wrote."""
    store.write("v", 1)
    holder = psycopg.connect(pg_url)
    holder.execute("SELECT 1 FROM stepstone_kv WHERE key = 'v' FOR KEY SHARE")
    holder.execute("UPDATE stepstone_kv SET value = '2' WHERE key = 'v'")
    result = _race(
        pg_url,
        holder,
        lambda: claim_run(store, "v", kind="test", resume=False, first_step="a"),
        lock="transactionid",
    )
    assert isinstance(result, StoreKeyConflictError), result
    assert store.backend.run_get("v") is None and store.read("v") == 2


# -- lost connections around the pipelined claim ------------------------------------------
@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("taken", ["empty key", "over a done run"])
def test_a_claim_whose_commit_answer_is_lost_is_applied_once(
    cut_proxy: CutProxy, pg_url: str, mode: str, taken: str
) -> None:
    """guarantee 254: the claim's commit is cut off before the server gets it, or after it
    ran (no answer): the claim learns the truth (its own run stamp under the key, or
    txid_status) or runs again, and the run is claimed exactly once, by this call. A claim
    of an empty key is one statement; one over an existing run is a transaction."""
    key = f"cut-claim-{mode}-{taken.replace(' ', '-')}"
    with Store(url=cut_proxy.url_for(pg_url)) as via:
        via.read("warm")
        if taken == "over a done run":
            old = claim_run(via, key, kind="test", resume=False, first_step="a").run
            assert old is not None
            old.commit_sync(status="done", next_step=None)
            old.release()
        cut_proxy.arm(b"COMMIT" if taken == "over a done run" else b"claim_fresh", mode)
        claimed = claim_run(via, key, kind="test", resume=False, first_step="a")
        assert cut_proxy.cuts == 1
        claimed_once(pg_url, key, claimed)


def claimed_once(pg_url: str, key: str, claimed: ClaimResult) -> None:
    """``claimed`` is a fresh claim of ``key``, and the only one: its run (its store still
    open) commits one step and ends, and the store holds exactly that run (then the key is
    deleted)."""
    assert claimed.outcome == "fresh" and claimed.run is not None
    claimed.run.commit_sync(status="done", next_step=None, rows=[("step", "a", 1)])
    claimed.run.release()
    with Store(url=pg_url) as store:
        head = store.backend.run_get(key)
        assert head is not None and head.run_uid == claimed.head.run_uid
        assert head.status == "done" and head.version == claimed.head.version + 1
        assert [r.name for r in store.backend.run_journal(key)] == ["a"]
        store.delete(key)


@pytest.mark.parametrize("awaited", [False, True])
def test_a_commit_cut_while_its_session_still_runs_it_is_found_landed(
    cut_proxy: CutProxy, pg_url: str, awaited: bool
) -> None:
    """guarantee 254: a step commit held back by a lock on its `writes=` key when its
    connection is cut (sync, or awaited on an async connection); the server session goes on
    and commits it once the lock is freed. The commit waits for that session to end before
    it reads the head, so it finds its step landed, once, instead of sending it again and
    reporting the run lost."""
    key, wkey = f"held-commit-{awaited}", f"held-commit-w-{awaited}"
    with Store(backend=PostgresBackend(cut_proxy.url_for(pg_url), prepare=False)) as via:
        run = claim_run(via, key, kind="test", resume=False, first_step="a").run
        assert run is not None
        step = {"status": "done", "next_step": None, "rows": [("step", "a", 1)]}
        with psycopg.connect(pg_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s, %s)", (KEY_LOCK_CLASS, lock_id(wkey)))
            timer = threading.Timer(1.0, holder.execute, ("SELECT pg_advisory_unlock_all()",))
            timer.start()
            cut_proxy.arm(b"stepstone_step_commit", "after")
            try:
                if awaited:
                    asyncio.run(run.commit(**step, writes=[(wkey, 7)]))  # type: ignore[arg-type]
                else:
                    run.commit_sync(**step, writes=[(wkey, 7)])  # type: ignore[arg-type]
            finally:
                timer.join()
        assert cut_proxy.cuts == 1
        run.release()
    with Store(url=pg_url) as store:
        head = store.backend.run_get(key)
        assert head is not None and head.status == "done"
        assert [r.name for r in store.backend.run_journal(key)] == ["a"]
        assert store.read(wkey) == 7
        store.delete(key)
        store.delete(wkey)


def test_a_claim_of_an_empty_key_is_one_statement(cut_proxy: CutProxy, pg_url: str) -> None:
    """guarantee 340: a claim of a key that holds nothing sends one statement, no
    transaction; a claim over an existing run (resumed, or started over) is a transaction;
    a done run found by a resume is answered from the one statement."""

    def sent() -> tuple[int, int, int]:
        return tuple(cut_proxy.seen(m) for m in (b"claim_fresh", b"BEGIN", b"COMMIT"))  # type: ignore[return-value]

    with Store(url=cut_proxy.url_for(pg_url)) as via:
        via.read("warm")
        claims, begins, commits = sent()
        run = claim_run(via, "one-trip", kind="test", resume=False, first_step="a").run
        assert run is not None
        assert sent() == (claims + 1, begins, commits)  # one statement, no transaction
        run.commit_sync(status="done", next_step=None, rows=[("step", "a", 1)])
        run.release()
        claims, begins, commits = sent()
        done = claim_run(via, "one-trip", kind="test", resume=True, first_step="a")
        assert done.outcome == "done" and done.run is None
        assert sent() == (claims + 1, begins, commits)
        again = claim_run(via, "one-trip", kind="test", resume=False, first_step="a")
        assert again.outcome == "fresh" and again.run is not None
        assert sent()[2] == commits + 1  # over an existing run: a transaction
        assert via.backend.run_journal("one-trip") == []  # started over
        again.run.release()
        via.delete("one-trip")


def test_claims_of_one_empty_key_from_many_threads_have_one_winner(store: Store) -> None:
    """guarantee 340: claims of one empty key sent at the same moment from many threads
    (each one statement, on its own connection): exactly one gets the run, every other one
    is refused as a live run's, and the head is the winner's."""
    threads = 6
    for round_ in range(5):
        key = f"contested-claim-{round_}"
        barrier = threading.Barrier(threads)
        won: list[Any] = []
        refused: list[BaseException] = []

        def claim(key: str, barrier: threading.Barrier, won: list[Any], refused: list[Any]) -> None:
            barrier.wait(timeout=60)
            try:
                won.append(claim_run(store, key, kind="test", resume=False, first_step="a").run)
            except ConcurrentRunError as exc:
                refused.append(exc)

        workers = [
            threading.Thread(target=claim, args=(key, barrier, won, refused))
            for _ in range(threads)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        assert len(won) == 1 and len(refused) == threads - 1
        assert store.backend.run_get(key) == won[0].head
        won[0].release()


# -- upgrade ------------------------------------------------------------------------------
@pytest.mark.parametrize("previous", [3, 4, 5, 6])
def test_a_store_of_the_previous_schema_upgrades_and_its_runs_go_on(
    pg_server: PgServer, previous: int
) -> None:
    """guarantee 253: a database at an earlier schema version, with a run half done, is
    upgraded by setup(); the run then commits its next steps (with writes=) under the new
    commit statements, a new run's key is claimed in one statement, and the old commit
    function is gone."""
    url = pg_server.create_database("t_commit_upgrade")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn, MIGRATIONS[:previous])
            conn.execute(
                "INSERT INTO stepstone_runs VALUES ('old', 'test', 'paused', 'b', 'u0', 2, 1, 1, "
                "'h', 1, NULL, 0, '{}', 0, 0)"
            )
            conn.execute(
                "INSERT INTO stepstone_journal VALUES ('old', 0, 'step', 'a', '{\"x\":1}')"
            )
        with Store(url=url) as store:
            claimed = claim_run(store, "old", kind="test", resume=True, first_step="a")
            assert claimed.outcome == "resumed" and claimed.run is not None
            claimed.run.commit_sync(
                status="done", next_step=None, rows=[("step", "b", 2)], writes=[("out", 3)]
            )
            claimed.run.release()
            assert [r.name for r in store.backend.run_journal("old")] == ["a", "b"]
            assert store.read("out") == 3
            new = claim_run(store, "new", kind="test", resume=False, first_step="a").run
            assert new is not None and store.backend.run_get("new") == new.head
            new.release()
        with psycopg.connect(url) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM stepstone_schema")]
            gone = conn.execute("SELECT to_regproc('stepstone_commit')").fetchone()
        assert versions == list(range(1, len(MIGRATIONS) + 1))
        assert gone == (None,)
    finally:
        pg_server.drop_database("t_commit_upgrade")


def test_a_group_commit_with_a_failing_statement_lands_the_others(store: Store) -> None:
    """guarantee 250: in a group commit (several runs' commits in one pipelined
    transaction), a commit whose statement fails outright (here a journal row whose seq is
    already taken) rolls the batch back; each commit is then sent on its own, so the
    failing run gets the error and the others land."""
    from stepstone.durable._group import commit_many
    from stepstone.store._base import JournalRow

    runs = [
        claim_run(store, f"g{i}", kind="test", resume=False, first_step="a").run for i in range(3)
    ]
    assert all(r is not None for r in runs)
    try:
        bad = runs[1]
        assert bad is not None
        bad.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)])
        items = []
        for i, run in enumerate(runs):
            assert run is not None
            new, rows, _ = run._prepare("running", "c", None, None, [("step", "b", i)], [])
            if run is bad:  # seq 0 is already in its journal
                rows = [JournalRow(0, "step", "b", "1")]
            items.append((new, run.head.version, rows, [(f"g{i}-value", str(i))]))
        outcomes = commit_many(store.backend, items)
        assert outcomes[0] is True and outcomes[2] is True
        assert isinstance(outcomes[1], psycopg.errors.UniqueViolation)
        assert store.read("g0-value") == 0 and store.read("g2-value") == 2
        assert store.read("g1-value") is None
        assert [r.seq for r in store.backend.run_journal("g1")] == [0]
        head = store.backend.run_get("g1")
        assert head is not None and head.version == bad.head.version
    finally:
        for run in runs:
            assert run is not None
            run.release()
