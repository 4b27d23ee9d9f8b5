"""The SQLite commit path's disk habits: a preallocated WAL, and claims that reach the disk
with the run's first commit instead of paying an fsync of their own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.durable import claim_run
from stepstone.exceptions import ConcurrentRunError
from stepstone.store._sqlite import SQLiteBackend
from stepstone.store._sqlite_wal import FIRST_CHUNK


def _wal(path: Path) -> int:
    return Path(f"{path}-wal").stat().st_size


def _commits_growing_the_wal(store: Store, path: Path, n: int) -> int:
    """How many of ``n`` step commits (each ~3 pages) left the WAL file longer."""
    claimed = claim_run(store, "run", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    grew = 0
    for i in range(n):
        before = _wal(path)
        claimed.run.commit_sync(
            status="running", next_step="a", rows=[("step", "a", i)], writes=[(f"v{i}", "x" * 900)]
        )
        grew += _wal(path) > before
    claimed.run.release()
    assert [store.read(f"v{i}") for i in range(n)] == ["x" * 900] * n
    return grew


def test_a_full_durability_store_keeps_its_wal_allocated_ahead_of_the_commits(
    tmp_path: Path,
) -> None:
    # guarantee 257
    path = tmp_path / "p.sqlite"
    with Store(db=path) as store:
        assert _wal(path) >= FIRST_CHUNK
        grew = _commits_growing_the_wal(store, path, 250)
        # 512 KB doubled twice or three times (each: the commit that outgrew the space,
        # then the extension), instead of a growth on every commit
        assert grew <= 6 and _wal(path) > 2_000_000
    with Store(backend=SQLiteBackend(tmp_path / "g.sqlite", preallocate_wal=False)) as store:
        # without it, every commit grows the file until the first checkpoint (~180 here)
        assert _commits_growing_the_wal(store, tmp_path / "g.sqlite", 250) > 150


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
    assert frames > 0
    with Store(db=path) as store:
        assert _wal(path) >= max(frames, FIRST_CHUNK)
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
