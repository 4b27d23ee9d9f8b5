"""A WAL whose committed frames SQLite would drop is refused, not read as an older store
(guarantee 356). Stores are written by real subprocesses killed with SIGKILL, so their WAL
holds every commit (no checkpoint ran), as after a crash."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.exceptions import StoreDamagedError
from stepstone.store._sqlite import SQLiteBackend
from stepstone.store._sqlite_wal import wal_checksum, wal_damage
from tests.store.test_sqlite_layout import wal_commits

WRITER = """
import os, signal, sys
from stepstone import Store
store = Store(db=sys.argv[1])
for i in range(int(sys.argv[2])):
    store.write(f"v{i}", {"i": i, "text": "x" * 3000})
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_writer(path: Path, n: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(path), str(n)], timeout=120
    )
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wal") / "crashed.sqlite"
    _killed_writer(path, 40)
    return path


def _copy(src: Path, dst: Path) -> Path:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copy(f"{src}{suffix}", f"{dst}{suffix}")
    return dst


def _frames(path: Path) -> tuple[int, int]:
    """(page size, committed frames) of ``path``'s WAL."""
    page = int.from_bytes(Path(f"{path}-wal").read_bytes()[8:12], "big")
    return page, sum(map(len, wal_commits(path)))


def _flip(path: Path, offset: int) -> None:
    wal = Path(f"{path}-wal")
    data = bytearray(wal.read_bytes())
    data[offset] ^= 0x01
    wal.write_bytes(bytes(data))


def test_the_checksum_is_sqlites(crashed: Path) -> None:
    data = Path(f"{crashed}-wal").read_bytes()
    big = int.from_bytes(data[:4], "big") & 1 == 1
    assert wal_checksum(data[:24], (0, 0), big) == (
        int.from_bytes(data[24:28], "big"),
        int.from_bytes(data[28:32], "big"),
    )
    assert wal_damage(crashed) is None  # every frame checks out
    with Store(db=_copy(crashed, crashed.with_name("whole.sqlite")), read_only=True) as store:
        assert store.read("v39") == {"i": 39, "text": "x" * 3000}


@pytest.mark.parametrize("where", ["frame", "header", "magic"])
def test_a_changed_byte_in_the_wal_is_refused_and_left_as_it_was(
    crashed: Path, tmp_path: Path, where: str
) -> None:
    # guarantee 356: before, the store opened as it was before the damaged frame (or as an
    # empty store: a damaged header), finished runs read as unfinished, and the first
    # write (or the close) destroyed the commits for good
    path = _copy(crashed, tmp_path / "s.sqlite")
    page, n = _frames(path)
    frame = n // 2
    offset = {"header": 12, "magic": 3}.get(where, 32 + frame * (24 + page) + 24 + 1000)
    _flip(path, offset)
    before = Path(f"{path}-wal").read_bytes()
    for read_only in (True, False):
        with pytest.raises(StoreDamagedError) as info:
            Store(db=path, read_only=read_only)
        message = str(info.value)
        assert "holds committed transactions that SQLite would drop" in message
        damaged = f"frame {frame + 1} is damaged" if where == "frame" else "header is damaged"
        assert damaged in message
        assert "move" in message and "-wal" in message
    assert Path(f"{path}-wal").read_bytes() == before  # nothing written, nothing deleted
    check = subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "check", "--db", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert check.returncode == 1 and "SQLite would drop" in check.stdout


def test_commits_a_checkpoint_already_copied_are_not_lost(crashed: Path, tmp_path: Path) -> None:
    # guarantee 356: a WAL damaged after its frames were copied into the main file, where
    # SQLite then reads them from (it ignores a WAL whose header fails), loses nothing; the
    # store opens and reads every value. (A frame damaged in the middle of such a WAL is
    # still a loss: SQLite would read the pages of the frames before it, older versions.)
    path = _copy(crashed, tmp_path / "c.sqlite")
    import sqlite3

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0] == 0
    shutil.copy(f"{path}-wal", tmp_path / "kept-wal")  # the checkpointed WAL, as it was
    conn.close()  # (the last connection deletes the WAL; put the copy back)
    shutil.copy(tmp_path / "kept-wal", f"{path}-wal")
    page, n = _frames(path)
    _flip(path, 32 + (n // 2) * (24 + page) + 24 + 1000)
    assert wal_damage(path) is not None
    _flip(path, 32 + (n // 2) * (24 + page) + 24 + 1000)  # undone
    _flip(path, 12)  # the header
    assert wal_damage(path) is None
    with Store(db=path, read_only=True) as store:
        assert store.read("v39") == {"i": 39, "text": "x" * 3000}


def test_opens_beside_a_live_writer_never_see_damage(tmp_path: Path) -> None:
    # guarantee 356: frames being written, a WAL started over after a checkpoint, zeros
    # kept ahead of the commits: none of them is damage
    path = tmp_path / "live.sqlite"
    stop = threading.Event()
    with Store(backend=SQLiteBackend(path, checkpoint_pages=50)) as writer:
        written = [0]

        def write() -> None:
            i = 0
            while not stop.is_set():
                writer.write(f"k{i % 300}", "y" * (500 + i % 4000))
                i += 1
                written[0] = i

        thread = threading.Thread(target=write)
        thread.start()
        try:
            # at least 100 opens, and on until the writer has started its WAL over a few
            # times (~2.5 KB a write, a checkpoint every 50 pages)
            opens = 0
            while opens < 100 or written[0] < 400:
                Store(db=path, read_only=opens % 2 == 0).close()
                opens += 1
        finally:
            stop.set()
            thread.join()
