"""The SQLite backend itself: the file it opens, its durability settings, its locking and its
schema versions. Behaviour every backend shares is in the conformance suite
(tests/store/test_conformance.py); this file holds what only SQLite does."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.exceptions import StoreError
from stepstone.store._sqlite import MIGRATIONS, SQLiteBackend


def _pragma(store: Store, name: str) -> object:
    backend = store.backend
    assert isinstance(backend, SQLiteBackend)
    return backend._conn().execute(f"PRAGMA {name}").fetchone()[0]


def test_file_is_created_in_wal_mode_with_full_sync(tmp_path: Path) -> None:
    # guarantee 45: Store(db=path) is a SQLite file in WAL mode
    path = tmp_path / "s.sqlite"
    with Store(db=path) as store:
        store.write("k", {"v": 1})
        assert str(_pragma(store, "journal_mode")).lower() == "wal"
        assert _pragma(store, "synchronous") == 2  # FULL: a commit survives power loss
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"  # persistent
        assert (
            raw.execute("SELECT value FROM stepstone_kv WHERE key = 'k'").fetchone()[0] == '{"v":1}'
        )
    finally:
        raw.close()


def test_durability_normal_is_opt_in(tmp_path: Path) -> None:
    with Store(db=tmp_path / "n.sqlite", durability="normal") as store:
        assert _pragma(store, "synchronous") == 1  # NORMAL


def test_busy_timeout_is_set_on_every_connection(tmp_path: Path) -> None:
    with Store(db=tmp_path / "b.sqlite", busy_timeout=2.5) as store:
        assert _pragma(store, "busy_timeout") == 2500


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"durability": "fsync"}, "durability must be 'full'"),
        ({"busy_timeout": 0}, "busy_timeout must be a finite number of seconds > 0"),
        ({"busy_timeout": float("nan")}, "busy_timeout must be a finite number"),
    ],
)
def test_bad_settings_name_the_value(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    # guarantee 355
    with pytest.raises(ValueError, match=message):
        Store(db=tmp_path / "x.sqlite", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "x.sqlite").exists()  # refused before anything was created


def test_missing_directory_is_an_error_not_a_new_tree(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "s.sqlite"
    with pytest.raises(StoreError, match="does not exist; create it first"):
        Store(db=missing)
    assert not missing.parent.exists()


@pytest.mark.parametrize("given", ["sqlite:///s.sqlite", "postgresql://me@db/s"])
def test_a_url_given_as_a_file_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """guarantee 355: a URL passed to db= would name a file in a directory called "sqlite:" or
    "postgresql:": where that directory exists, a store would silently live there, and the
    caller would believe they were on another database."""
    monkeypatch.chdir(tmp_path)
    scheme_dir = tmp_path / given.split("/")[0]
    (scheme_dir / "me@db").mkdir(parents=True)
    for path in (given, Path(given)):
        with pytest.raises(ValueError, match=r"is a store URL, not a SQLite file path.*url="):
            Store(db=path)
    assert [p.name for p in scheme_dir.rglob("*")] == (["me@db"])
    # a directory really named so is reached with a relative path
    with Store(db=f"./{given.split('/')[0]}/local.sqlite") as store:
        store.write("k", 1)
    assert (scheme_dir / "local.sqlite").exists()


def test_a_path_of_another_type_is_a_type_error() -> None:
    # guarantee 355
    with pytest.raises(TypeError, match="must be a str or a path, got 3"):
        Store(db=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path is empty"):
        Store(db="")


def test_a_prefix_of_another_type_is_a_type_error(tmp_path: Path) -> None:
    # guarantee 355
    with Store(db=tmp_path / "p.sqlite") as store:
        store.write("k3", 1)
        for call in (store.keys, store.items):
            with pytest.raises(TypeError, match=r"prefix must be a str .* got int 3"):
                call(prefix=3)  # type: ignore[arg-type]
        assert store.keys(prefix="k") == ["k3"]


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="is not a SQLite database"):
        Store(db=path)
    assert path.read_bytes() == before


def test_url_and_db_open_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite"
    with Store(db=path) as a:
        a.write("k", 1)
    with Store(url=f"sqlite:///{path}") as b:
        assert b.read("k") == 1
    with pytest.raises(ValueError, match="names no file"):
        Store(url="sqlite://")


@pytest.mark.parametrize("where", [{"db": ":memory:"}, {"url": "sqlite:///:memory:"}])
def test_an_in_memory_sqlite_database_is_refused(where: dict[str, str]) -> None:
    # guarantee 355: before, it was accepted and every thread got its own empty database
    with pytest.raises(ValueError, match=r"':memory:'.*use Store\(\) for a store in memory"):
        Store(**where)  # type: ignore[arg-type]


def test_a_url_or_backend_of_the_wrong_type_is_refused() -> None:
    # guarantee 355: before, url=5 raised from inside and backend=5 failed on first use
    with pytest.raises(TypeError, match="url= takes a str"):
        Store(url=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"backend= takes a stepstone\.store\.Backend, got 5"):
        Store(backend=5)  # type: ignore[arg-type]


def test_schema_versions_are_recorded_and_a_newer_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    Store(db=path).close()
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        versions = [r[0] for r in raw.execute("SELECT version FROM stepstone_schema")]
        assert max(versions) == len(MIGRATIONS)  # a new file is created at the newest schema
        Store(db=path).close()  # reopening applies nothing twice
        assert raw.execute("SELECT COUNT(*) FROM stepstone_schema").fetchone()[0] == len(versions)
        raw.execute("INSERT INTO stepstone_schema VALUES (?, 0)", (len(MIGRATIONS) + 1,))
    finally:
        raw.close()
    with pytest.raises(StoreError, match="newer than this stepstone"):
        Store(db=path)


def test_a_long_foreign_write_lock_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "lock.sqlite"
    store = Store(db=path, busy_timeout=0.2)
    store.write("k", 1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    try:
        with pytest.raises(StoreError, match=r"could not lock .* within 0\.2s"):
            store.write("k", 2)
        assert store.read("k") == 1  # readers are not blocked (WAL), nothing half-written
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.write("k", 3)  # the lock is gone: writes work again
    assert store.read("k") == 3
    store.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from stepstone import Store
    store = Store(db=sys.argv[1])
    for _ in range(int(sys.argv[2])):
        while True:
            n = store.read("counter")
            if store.compare_and_swap("counter", n, (n or 0) + 1):
                break
    store.close()
    """
)


@pytest.mark.slow
def test_processes_sharing_one_file_lose_no_update(tmp_path: Path) -> None:
    # three processes increment one counter through compare_and_swap on one file
    path = tmp_path / "shared.sqlite"
    Store(db=path).close()
    per_process, procs = 40, []
    for _ in range(3):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(path), str(per_process)],
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    for proc in procs:
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.returncode == 0, err
    with Store(db=path) as store:
        assert store.read("counter") == 3 * per_process


def _open_at_once(barrier: Any, paths: list[str], errors: Any) -> None:
    """In a process of its own: open each new file in ``paths`` with the others at once."""
    for path in paths:
        barrier.wait(timeout=60)
        try:
            with Store(db=path) as store:
                store.write("k", {"pid": os.getpid()})
        except StoreError as exc:
            errors.put(f"{path}: {exc}")


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # guarantee 393: each switched the new file to WAL from a read lock, and SQLite
    # answers the second upgrade with SQLITE_BUSY at once; that was reported as
    # "not a SQLite database" in about half of the rounds
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(3), ctx.Queue()
    paths = [str(tmp_path / f"new-{i}.sqlite") for i in range(15)]
    procs = [ctx.Process(target=_open_at_once, args=(barrier, paths, errors)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []
    for path in paths:
        with Store(db=path) as store:
            assert store.read("k")["pid"] in {proc.pid for proc in procs}
