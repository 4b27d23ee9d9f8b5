"""The SQLite commit path's disk habits: a preallocated WAL, and claims that reach the disk
with the run's first commit instead of paying an fsync of their own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
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


def test_checkpoint_pages_sets_how_long_the_wal_runs_between_checkpoints(tmp_path: Path) -> None:
    # guarantee 352
    value = "v" * 20_000  # about 7 pages a commit: the value's leaf, index and overflow pages
    wal_bytes = {}
    for pages in (1000, 4000):
        path = tmp_path / f"c{pages}.sqlite"
        backend = SQLiteBackend(path, checkpoint_pages=pages)
        with Store(backend=backend) as store:
            seen: list[int] = []
            reader = threading.Thread(target=_autocheckpoint_of, args=(backend, seen))
            reader.start()
            reader.join()
            assert seen == [pages]  # every connection of the store, in every thread
            for i in range(250):
                store.write(f"k{i}", value)
            assert all(store.read(f"k{i}") == value for i in range(250))
            wal_bytes[pages] = _wal(path)
    assert wal_bytes[1000] < 5_000_000  # checkpointed at ~1,000 pages and reused from the start
    assert wal_bytes[4000] > 6_000_000  # ~1,750 pages and no checkpoint yet


def _autocheckpoint_of(backend: SQLiteBackend, out: list[int]) -> None:
    """The setting on ``backend``'s connection of the calling thread (a new one)."""
    out.append(int(backend._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0]))


@pytest.mark.parametrize("bad", [0, -5, True, 2.5, "4000"])
def test_checkpoint_pages_must_be_a_whole_number_of_pages(tmp_path: Path, bad: object) -> None:
    # guarantee 352
    with pytest.raises(
        ValueError, match=rf"checkpoint_pages must be .* got {re.escape(repr(bad))}"
    ):
        SQLiteBackend(tmp_path / "x.sqlite", checkpoint_pages=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "x.sqlite").exists()
