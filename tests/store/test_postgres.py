"""PostgreSQL backend specifics: schema setup and migrations, exact prefixes, URLs, the
key-kind invariant under cross-process races, and exactly-once retries after a lost
connection (a real TCP cut between client and server, around one exact message)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from stepstone.durable import claim_run
from stepstone.exceptions import MissingExtraError, StoreError
from stepstone.store import Store
from stepstone.store._postgres import MIGRATIONS, PostgresBackend, migrate
from stepstone.store._postgres_schema import SCHEMA_LOCK, prefix_bounds
from tests.pgserver import PASSWORD, CutProxy, PgServer

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    with Store(url=pg_url) as s:
        for key in s.keys():
            s.delete(key)
        yield s


def _schema_versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM stepstone_schema ORDER BY 1")]


# -- schema --------------------------------------------------------------------------------
def test_setup_is_explicit_idempotent_and_versioned(pg_server: PgServer) -> None:
    url = pg_server.create_database("t_setup")
    backend = PostgresBackend(url)
    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT to_regclass('stepstone_kv')").fetchone()
            assert row == (None,)  # constructing a backend does not touch the database
        backend.setup()
        Store(backend=backend).setup()  # the facade's setup() is the backend's
        assert _schema_versions(url) == list(range(1, len(MIGRATIONS) + 1))
    finally:
        backend.close()
        pg_server.drop_database("t_setup")


def test_first_use_runs_setup(pg_server: PgServer) -> None:
    url = pg_server.create_database("t_first_use")
    try:
        with Store(url=url) as store:
            store.write("a", 1)
            assert store.read("a") == 1
        assert _schema_versions(url) == list(range(1, len(MIGRATIONS) + 1))
    finally:
        pg_server.drop_database("t_first_use")


def test_migrations_upgrade_an_old_database_and_refuse_a_newer_one(pg_server: PgServer) -> None:
    url = pg_server.create_database("t_migrate")
    try:
        with Store(url=url) as store:
            store.write("kept", {"v": 1})
        later = [*MIGRATIONS, "ALTER TABLE stepstone_kv ADD COLUMN note TEXT"]
        with psycopg.connect(url, autocommit=True) as conn:
            assert migrate(conn, later) == 1  # only the new migration runs
            assert migrate(conn, later) == 0
            cols = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'stepstone_kv' ORDER BY ordinal_position"
            ).fetchall()
            kept = conn.execute("SELECT value FROM stepstone_kv WHERE key = 'kept'").fetchone()
        assert [c[0] for c in cols] == ["key", "value", "updated_at", "note"]
        assert kept == ('{"v":1}',)  # the data survived the upgrade
        assert _schema_versions(url) == list(range(1, len(later) + 1))
        # This stepstone knows fewer migrations than the database has: refuse, say why.
        with pytest.raises(
            StoreError, match=rf"schema version {len(later)}, newer than this stepstone"
        ):
            PostgresBackend(url).setup()
        with Store(url=url) as store, pytest.raises(StoreError, match="upgrade stepstone"):
            store.read("kept")
    finally:
        pg_server.drop_database("t_migrate")


_SETUP_WORKER = textwrap.dedent(
    """
    import sys, time
    from stepstone.store._postgres import PostgresBackend
    url, start = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))
    backend = PostgresBackend(url)
    backend.setup()
    backend.close()
    """
)


def test_concurrent_setup_from_many_processes(pg_server: PgServer) -> None:
    """Several processes set up one empty database at the same instant: all succeed and
    every migration is applied exactly once (the schema advisory lock)."""
    url = pg_server.create_database("t_concurrent_setup")
    try:
        start = time.time() + 1.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _SETUP_WORKER, url, str(start)],
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "error"},
            )
            for _ in range(6)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        assert _schema_versions(url) == list(range(1, len(MIGRATIONS) + 1))
    finally:
        pg_server.drop_database("t_concurrent_setup")


def test_a_process_stalled_in_its_setup_blocks_no_other_opener(pg_url: str) -> None:
    # guarantee 394: a process holding the schema lock (as one SIGSTOPped inside its own
    # setup() does) kept every other process from opening the store, for as long as it
    # stayed stopped
    Store(url=pg_url).setup()
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        opened = threading.Event()

        def open_store() -> None:
            with Store(url=pg_url) as store:
                store.setup()
                store.write("stalled-setup", 1)
            opened.set()

        opener = threading.Thread(target=open_store, daemon=True)
        opener.start()
        try:
            assert opened.wait(60), "the opener waited on the stalled process's lock"
        finally:
            holder.rollback()  # lets an opener still waiting go on
            opener.join(60)
    with Store(url=pg_url) as store:
        assert store.read("stalled-setup") == 1


# -- URLs and errors -----------------------------------------------------------------------
def test_url_with_hostile_password_and_describe_hides_it(pg_url: str) -> None:
    assert "%40" in pg_url and "%23" in pg_url  # the password really is percent-encoded
    with Store(url=pg_url) as store:
        store.write("x", 1)
        text = repr(store)
    assert text.startswith("Store(postgresql://stepstone@127.0.0.1:")
    assert PASSWORD not in text and "p%40ss" not in text
    # postgres:// is accepted too
    with Store(url="postgres://" + pg_url.split("://", 1)[1]) as store:
        assert store.read("x") == 1


def test_wrong_password_fails_fast_with_the_cause(pg_server: PgServer) -> None:
    url = pg_server.url("postgres").replace("p%40ss", "wrong")
    started = time.monotonic()
    with Store(url=url) as store, pytest.raises(StoreError, match="password authentication"):
        store.read("x")
    assert time.monotonic() - started < 10  # no minute of reconnect attempts


def test_missing_psycopg_raises_missing_extra_error() -> None:
    # A real interpreter in which psycopg cannot be imported.
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("psycopg", "psycopg_pool"):
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from stepstone.exceptions import MissingExtraError
        from stepstone.store import Store
        for attempt in (lambda: Store(url="postgresql://u@h/db"),
                        lambda: __import__("stepstone.store._postgres")):
            try:
                attempt()
            except MissingExtraError as exc:
                print(exc)
            else:
                raise SystemExit("no MissingExtraError")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    assert all("pip install stepstone[postgres]" in line for line in lines)
    assert issubclass(MissingExtraError, ImportError)


def test_closed_store_refuses(pg_url: str) -> None:
    store = Store(url=pg_url)
    store.write("c", 1)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.read("c")


# -- keys ----------------------------------------------------------------------------------
def test_prefix_bounds_are_exact_at_the_edges(store: Store) -> None:
    top = "\U0010ffff"
    keys = ["a", "a" + top, "a" + top + "z", "a\ud7ff", "a\ue000", "ab", "b", top, top + "x"]
    for key in keys:
        store.write(key, key)
    assert store.keys() == sorted(keys)  # code point order, as Python sorts
    for prefix in ["a", "a" + top, "a\ud7ff", top, "", "ab", "zz"]:
        expected = sorted(k for k in keys if k.startswith(prefix))
        assert store.keys(prefix=prefix) == expected, prefix
        assert [k for k, _ in store.items(prefix=prefix)] == expected, prefix
    assert prefix_bounds("a\ud7ff") == ("a\ud7ff", "a\ue000")
    assert prefix_bounds(top) == (top, None)


def test_run_list_by_prefix(store: Store) -> None:
    for key in ("job_1", "job%2", "jobx", "Job_3"):
        claimed = claim_run(store, key, kind="test", resume=False, first_step="a")
        assert claimed.run is not None
        claimed.run.release()
    assert [h.key for h in store.backend.run_list("job_")] == ["job_1"]
    assert [h.key for h in store.backend.run_list("job")] == ["job%2", "job_1", "jobx"]
    assert [h.key for h in store.backend.run_list(None)] == ["Job_3", "job%2", "job_1", "jobx"]


_RACE_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from stepstone.durable import claim_run
    from stepstone.exceptions import ConcurrentRunError, StoreKeyConflictError
    from stepstone.store import Store
    url, role, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    store = Store(url=url)
    store.read("warm-up")
    time.sleep(max(0.0, start - time.time()))
    won = []
    for i in range(n):
        key = f"k{i}"
        try:
            if role == "claim":
                claimed = claim_run(store, key, kind="race", resume=False, first_step="a")
                claimed.run.commit_sync(status="done", next_step=None)
                claimed.run.release()
            elif role == "write":
                store.write(key, role)
            else:
                store.compare_and_swap(key, None, role)
            won.append(key)
        except (StoreKeyConflictError, ConcurrentRunError):
            pass
    print(json.dumps(won))
    store.close()
    """
)


def test_a_key_is_never_both_a_value_and_a_run_across_processes(store: Store, pg_url: str) -> None:
    """Processes race to claim, write and CAS the same keys: per key, the advisory lock
    lets exactly one kind win, never both (SQLite gets this from its file lock)."""
    n, start = 60, time.time() + 1.2
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE_WORKER, pg_url, role, str(n), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        for role in ("claim", "write", "cas", "claim")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        json.loads(out)
    values = dict(store.backend.kv_items(None))
    runs = {h.key for h in store.backend.run_list(None)}
    assert not set(values) & runs
    assert set(values) | runs == {f"k{i}" for i in range(n)}


# -- exactly once after a lost connection (guarantee 39, 40) ------------------------------------


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("with_writes", [False, True])
def test_commit_whose_answer_is_lost_is_applied_exactly_once(
    store: Store, pg_url: str, cut_proxy: CutProxy, mode: str, with_writes: bool
) -> None:
    """guarantee 39/40: the connection is cut just before the server gets a step's commit, or
    just after it ran it (the answer never comes back). The commit reconnects, reads the
    head to learn what happened, and the step is in the store exactly once."""
    with Store(url=cut_proxy.url_for(pg_url)) as via:
        claimed = claim_run(via, "cut", kind="test", resume=False, first_step="a")
        run = claimed.run
        assert run is not None
        try:
            run.commit_sync(status="running", next_step="b", rows=[("step", "a", {})])
            marker = f"MARK-{mode}-{with_writes}"
            cut_proxy.arm(marker.encode(), mode)
            run.commit_sync(
                status="running",
                next_step="c",
                rows=[("step", "b", {"m": marker})],
                writes=[("w", marker)] if with_writes else [],
            )
            assert cut_proxy.cuts == 1
            # "after": it had committed and the head said so, so it was not sent again.
            # "before": the server never committed it, so it was sent (once) again.
            assert cut_proxy.seen(marker.encode()) == 1
            run.commit_sync(status="done", next_step=None, rows=[("step", "c", {})])
        finally:
            run.release()
    head = store.backend.run_get("cut")
    assert head is not None and head.version == 4 and head.journal_len == 3
    assert [(r.seq, r.name) for r in store.backend.run_journal("cut")] == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]
    assert store.read("w") == (marker if with_writes else None)


@pytest.mark.parametrize("mode", ["before", "after"])
def test_cas_whose_commit_answer_is_lost_reports_the_truth(
    store: Store, pg_url: str, cut_proxy: CutProxy, mode: str
) -> None:
    """A CAS whose COMMIT got no answer asks the server (txid_status) whether it
    committed: a blind retry would see its own write and wrongly report a lost race."""
    store.write("n", 0)
    with Store(url=cut_proxy.url_for(pg_url)) as via:
        via.read("n")  # warm the pool: the cut hits the CAS's own COMMIT
        cut_proxy.arm(b"COMMIT", mode)
        assert via.compare_and_swap("n", 0, 1) is True
        assert cut_proxy.cuts == 1
    assert store.read("n") == 1


def test_delete_whose_commit_answer_is_lost_reports_the_truth(
    store: Store, pg_url: str, cut_proxy: CutProxy
) -> None:
    store.write("gone", 1)
    with Store(url=cut_proxy.url_for(pg_url)) as via:
        via.read("gone")
        cut_proxy.arm(b"COMMIT", "after")
        assert via.delete("gone") is True
        assert cut_proxy.cuts == 1
    assert store.read("gone") is None


def test_gives_up_after_reconnect_timeout_with_a_clear_error(
    store: Store, pg_url: str, cut_proxy: CutProxy
) -> None:
    backend = PostgresBackend(cut_proxy.url_for(pg_url), reconnect_timeout=1.0)
    try:
        backend.kv_put("r", "1")
        cut_proxy.close()  # the "server" is gone for good
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"reconnect_timeout=1.0s") as info:
            backend.kv_get("r")
        assert time.monotonic() - started < 8
        assert PASSWORD not in str(info.value)
    finally:
        backend.close()


def test_the_connection_returned_last_serves_the_next_statement(store: Store) -> None:
    # A run commits its steps one after another. Once its pool holds two idle connections
    # (a second opened while the first was busy), psycopg_pool's own order would alternate
    # its commits between two server processes, each with cold caches.
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    store.write("warm", 1)
    with backend._connection(5.0) as first, backend._connection(5.0) as second:
        pids = {first.info.backend_pid, second.info.backend_pid}
    assert len(pids) == 2  # both idle now, the first returned last
    served = []
    for _ in range(4):
        with backend._connection(5.0) as conn:
            served.append(conn.info.backend_pid)
    assert served == [first.info.backend_pid] * 4


def test_a_run_commits_its_steps_on_one_connection_past_the_pool(store: Store) -> None:
    # guarantee 395
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    run = claim_run(store, "spare", kind="test", resume=False, first_step="s0").run
    assert run is not None
    run.commit_sync(status="running", next_step="s1", rows=[("step", "s0", {"n": 0})])
    pool = backend._pool_here()
    before = pool.get_stats().get("requests_num", 0)
    pids = set()
    for i in range(1, 20):
        run.commit_sync(status="running", next_step=f"s{i + 1}", rows=[("step", f"s{i}", {})])
        with backend._connection(5.0) as conn:
            pids.add(conn.info.backend_pid)
    run.commit_sync(status="done", next_step=None)
    run.release()
    assert pool.get_stats().get("requests_num", 0) == before  # the pool was never asked
    assert len(pids) == 1
    assert [r.name for r in backend.run_journal("spare")] == [f"s{i}" for i in range(20)]


def test_a_connection_left_in_a_transaction_is_never_kept_aside(store: Store) -> None:
    # guarantee 395: the pool rolls it back, and the next statement never runs inside it
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    store.write("k", 1)
    with backend._connection(5.0) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO stepstone_kv VALUES ('uncommitted', '1', 0)")
    for _ in range(3):
        with backend._connection(5.0) as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    store.write("k", 2)
    assert store.read("k") == 2
    assert store.read("uncommitted") is None  # rolled back, never committed by a later write


def test_closing_the_store_closes_the_connection_kept_aside(pg_url: str) -> None:
    # guarantee 395
    backend = PostgresBackend(pg_url)
    backend.kv_put("a", "1")
    backend.kv_put("a", "2")
    with backend._connection(5.0) as conn:
        kept = conn
    backend.close()
    assert kept.closed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_uses_the_connection_its_parent_kept(store: Store) -> None:
    # guarantee 395: the child opens its own; the parent's session goes on undisturbed
    backend = store.backend
    assert isinstance(backend, PostgresBackend)
    store.write("parent", 1)
    store.write("parent", 2)
    with backend._connection(5.0) as conn:
        parents = conn.info.backend_pid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the server process that served it, then write
        code = 1
        try:
            os.close(read)
            with backend._connection(5.0) as conn:
                os.write(write, str(conn.info.backend_pid).encode())
            store.write("child", 1)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        childs = int(fh.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert childs != parents
    with backend._connection(5.0) as conn:
        assert conn.info.backend_pid == parents
    assert store.read("child") == 1
    store.write("parent", 3)
    assert store.read("parent") == 3
