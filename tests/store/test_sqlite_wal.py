"""The SQLite commit path's disk habits: a preallocated WAL, and claims that reach the disk
with the run's first commit instead of paying an fsync of their own."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.durable import claim_run
from stepstone.exceptions import ConcurrentRunError
from stepstone.store._sqlite import SQLiteBackend


def _wal(path: Path) -> int:
    return Path(f"{path}-wal").stat().st_size


def _target(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        pages = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
    finally:
        conn.close()
    return 32 + pages * (page + 24)


def test_a_full_durability_store_preallocates_its_wal_and_commits_never_grow_it(
    tmp_path: Path,
) -> None:
    # guarantee 257
    path = tmp_path / "p.sqlite"
    with Store(db=path) as store:
        size = _wal(path)
        assert size >= _target(path) > 1_000_000
        claimed = claim_run(store, "run", kind="test", resume=False, first_step="a")
        assert claimed.run is not None
        for i in range(50):
            claimed.run.commit_sync(
                status="running", next_step="a", rows=[("step", "a", i)], writes=[(f"v{i}", i)]
            )
        claimed.run.release()
        assert _wal(path) == size  # every commit overwrote preallocated space
        assert [store.read(f"v{i}") for i in range(50)] == list(range(50))


@pytest.mark.parametrize(
    "options", [{"preallocate_wal": False}, {"durability": "normal"}], ids=["off", "normal"]
)
def test_preallocation_is_off_when_asked_and_with_normal_durability(
    tmp_path: Path, options: dict[str, object]
) -> None:
    # guarantee 257
    path = tmp_path / "n.sqlite"
    with Store(backend=SQLiteBackend(path, **options)):  # type: ignore[arg-type]
        assert _wal(path) < 100_000


def test_preallocating_keeps_the_commits_a_killed_process_left_in_the_wal(
    tmp_path: Path,
) -> None:
    # guarantee 257: only bytes past the last frame are written
    path = tmp_path / "k.sqlite"
    script = textwrap.dedent(
        f"""
        import os
        from stepstone import Store
        from stepstone.store._sqlite import SQLiteBackend
        store = Store(backend=SQLiteBackend({str(path)!r}, preallocate_wal=False))
        for i in range(40):
            store.write(f"k{{i}}", {{"i": i, "pad": "x" * 500}})
        os.kill(os.getpid(), 9)  # no checkpoint, no close: the values live in the WAL
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    frames = _wal(path)
    assert 0 < frames < _target(path)
    with Store(db=path) as store:
        assert _wal(path) >= _target(path)
        assert [store.read(f"k{i}")["i"] for i in range(40)] == list(range(40))
        store.write("after", 1)
    with Store(db=path) as store:  # the WAL was checkpointed and removed on close
        assert [store.read(f"k{i}")["i"] for i in range(40)] == list(range(40))
        assert store.read("after") == 1


def test_a_claim_is_seen_at_once_survives_a_kill_and_leaves_full_sync_on(
    tmp_path: Path,
) -> None:
    # guarantee 258
    path = tmp_path / "c.sqlite"
    script = textwrap.dedent(
        f"""
        import os, sys
        from stepstone import Store
        from stepstone.durable import claim_run
        store = Store(db={str(path)!r})
        claim_run(store, "job", kind="test", resume=False, first_step="a")
        backend = store.backend
        assert backend._conn().execute("PRAGMA synchronous").fetchone()[0] == 2
        sys.stdout.write("claimed\\n")
        sys.stdout.flush()
        sys.stdin.readline()
        os.kill(os.getpid(), 9)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "claimed\n"
        with (
            Store(db=path) as other,
            pytest.raises(ConcurrentRunError, match="owned by live run"),
        ):
            claim_run(other, "job", kind="test", resume=True, first_step="a")
        proc.communicate("\n", timeout=120)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    with Store(db=path) as store:
        head = store.backend.run_get("job")
        assert head is not None and head.status == "claimed"
        taken = claim_run(store, "job", kind="test", resume=True, first_step="a")
        assert taken.outcome == "resumed" and taken.run is not None  # its owner is gone
        taken.run.release()
