"""The kernel's record calls: read a run with its journal consistently, read a head, list
and delete runs, their async forms, and the one rule for calling backends from async code.

Every call runs over the memory backend, a real SQLite file and the real PostgreSQL server
the suite starts. The consistency tests put a real commit (or a real claim) of another
Store between the kernel's reads, at a fixed point, with a SQLite backend that runs a
callback before reading a journal.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from stepstone import Store
from stepstone.durable import (
    OwnedRun,
    aclaim_run,
    adelete_run,
    alist_runs,
    aread_run,
    blocking_call,
    claim_run,
    delete_run,
    list_runs,
    read_run,
    run_head,
)
from stepstone.exceptions import ConcurrentRunError, StoreError
from stepstone.store._base import JournalRow, RunHead
from stepstone.store._sqlite import SQLiteBackend

KIND = "records-test"


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        s = Store()
    elif request.param == "sqlite":
        s = Store(db=tmp_path / "r.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        s = Store(url=url)
        for key in s.keys():
            s.delete(key)
    with s:
        yield s


def _run(store: Store, key: str, steps: int) -> OwnedRun:
    """A run under ``key`` with ``steps`` committed steps (one journal row each)."""
    claim = claim_run(store, key, kind=KIND, resume=False, first_step="s0")
    assert claim.run is not None
    for i in range(steps):
        claim.run.commit_sync(
            status="running", next_step=f"s{i + 1}", meta={"n": i + 1}, rows=[("step", None, i)]
        )
    return claim.run


def _data(rows: Sequence[JournalRow]) -> list[str]:
    return [row.data for row in rows]


# -- reading, listing, deleting ----------------------------------------------------------
def test_read_run_gives_the_head_and_its_journal(store: Store) -> None:
    run = _run(store, "job", 3)
    found = read_run(store, "job")
    assert found is not None
    head, rows = found
    assert head == run.head == run_head(store, "job")
    assert (head.journal_len, _data(rows)) == (3, ["0", "1", "2"])
    assert [row.seq for row in rows] == [0, 1, 2]
    run.release()


def test_no_run_reads_as_none(store: Store) -> None:
    store.write("plain", {"v": 1})  # a plain value is not a run
    for key in ("missing", "plain"):
        assert read_run(store, key) is None
        assert run_head(store, key) is None
    assert store.read("plain") == {"v": 1}


def test_list_runs_by_exact_prefix_sorted_without_plain_values(store: Store) -> None:
    runs = [_run(store, key, 1) for key in ("b:2", "b:1", "a:1", "b_x")]
    store.write("b:value", 1)
    assert [h.key for h in list_runs(store, "b:")] == ["b:1", "b:2"]
    assert [h.key for h in list_runs(store)] == ["a:1", "b:1", "b:2", "b_x"]
    assert [h.status for h in list_runs(store, "b:1")] == ["running"]
    for run in runs:
        run.release()


def test_delete_run_removes_head_and_journal(store: Store) -> None:
    _run(store, "job", 2).release()
    assert delete_run(store, "job") is True
    assert read_run(store, "job") is None and store.keys() == []
    assert delete_run(store, "job") is False
    fresh = claim_run(store, "job", kind=KIND, resume=True, first_step="s0")
    assert fresh.outcome == "fresh"  # nothing of the deleted run was left to resume
    assert fresh.run is not None and fresh.run.journal() == []
    fresh.run.release()


def test_async_forms_give_what_the_sync_calls_give(store: Store) -> None:
    async def main() -> None:
        claim = await aclaim_run(store, "x:job", kind=KIND, resume=False, first_step="s0")
        assert claim.outcome == "fresh" and claim.run is not None
        await claim.run.commit(status="running", next_step="s1", rows=[("step", None, 0)])
        assert _data(await claim.run.ajournal()) == ["0"]
        assert await aread_run(store, "x:job") == read_run(store, "x:job")
        assert await alist_runs(store, "x:") == list_runs(store, "x:") != []
        claim.run.release()
        assert await adelete_run(store, "x:job") is True
        assert await aread_run(store, "x:job") is None

    asyncio.run(main())


# -- the one rule for backend calls from async code --------------------------------------
def _thread_of(store: Store, *, bulk: bool) -> str:
    async def main() -> str:
        loop_thread = threading.get_ident()
        ran_on = await blocking_call(store, threading.get_ident, bulk=bulk)
        return "loop" if ran_on == loop_thread else "worker"

    return asyncio.run(main())


def test_blocking_call_runs_where_the_backend_needs_it(store: Store) -> None:
    # memory: always on the loop; a local file: bounded calls (a commit, a claim) on the
    # loop, bulk ones (a journal, a listing) in a worker; a network server: always a worker
    name = type(store.backend).__name__
    expected = {
        "MemoryBackend": ("loop", "loop"),
        "SQLiteBackend": ("loop", "worker"),
        "PostgresBackend": ("worker", "worker"),
    }[name]
    assert (_thread_of(store, bulk=False), _thread_of(store, bulk=True)) == expected


# -- consistency while other processes write ---------------------------------------------
class _BetweenReads(SQLiteBackend):
    """A real SQLite backend that runs ``between`` before reading a journal: the kernel's
    read of a head and its read of the journal then have another Store's write between
    them, every time, instead of when the scheduler happens to allow it."""

    between: Callable[[], Any] | None = None
    commit_thread: int | None = None  # the thread of the last commit

    def run_journal(self, key: str, since_seq: int = 0) -> list[JournalRow]:
        if self.between is not None:
            self.between()
        return super().run_journal(key, since_seq)

    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        self.commit_thread = threading.get_ident()
        return super().run_commit(head, expected_version, rows, writes)


@pytest.fixture
def racing(tmp_path: Path) -> Iterator[tuple[Store, _BetweenReads, Store]]:
    """(reader store, its backend, writer store) over one SQLite file."""
    backend = _BetweenReads(tmp_path / "race.sqlite")
    with Store(backend=backend) as reader, Store(db=tmp_path / "race.sqlite") as writer:
        yield reader, backend, writer


def test_a_commit_between_the_reads_is_not_returned_with_the_older_head(
    racing: tuple[Store, _BetweenReads, Store],
) -> None:
    reader, backend, writer = racing
    run = _run(writer, "job", 2)
    step = [2]

    def commit_one() -> None:  # the owner commits its next step meanwhile
        run.commit_sync(
            status="running", next_step="next", meta={"n": step[0] + 1}, rows=[("step", None, 2)]
        )
        step[0] += 1

    backend.between = commit_one
    found = read_run(reader, "job")
    backend.between = None
    assert found is not None
    head, rows = found
    # the head read first (2 steps) with exactly its 2 rows, not the third row committed
    # after it: the head and its journal always describe the same moment
    assert (head.meta["n"], head.journal_len, _data(rows)) == (2, 2, ["0", "1"])
    now = read_run(reader, "job")
    assert now is not None and (now[0].meta["n"], _data(now[1])) == (3, ["0", "1", "2"])
    run.release()


def test_a_claim_between_the_reads_makes_the_kernel_read_the_new_run(
    racing: tuple[Store, _BetweenReads, Store],
) -> None:
    reader, backend, writer = racing
    old = _run(writer, "job", 3)
    old.commit_sync(status="failed", next_step="s3")
    old.release()
    claims: list[OwnedRun] = []

    def start_over() -> None:  # another process starts the key over (the journal resets)
        backend.between = None
        claim = claim_run(writer, "job", kind=KIND, resume=False, first_step="s0")
        assert claim.run is not None
        claims.append(claim.run)

    backend.between = start_over
    found = read_run(reader, "job")
    assert found is not None and len(claims) == 1
    head, rows = found
    assert (head.run_uid, head.journal_len, rows) == (claims[0].run_uid, 0, [])
    claims[0].release()


def test_a_run_claimed_again_on_every_read_is_an_error_naming_it(
    racing: tuple[Store, _BetweenReads, Store],
) -> None:
    reader, backend, writer = racing
    _run(writer, "job", 1).release()

    def delete_and_claim() -> None:
        delete_run(writer, "job")
        claim = claim_run(writer, "job", kind=KIND, resume=False, first_step="s0")
        assert claim.run is not None
        claim.run.release()

    backend.between = delete_and_claim
    with pytest.raises(StoreError, match=r"run 'job' was claimed again while being read"):
        read_run(reader, "job")


def test_on_a_local_file_journals_are_read_off_the_loop_and_commits_go_to_the_writer(
    racing: tuple[Store, _BetweenReads, Store],
) -> None:
    """guarantee 256: a commit that another run of the loop's group does not wait for is
    written by the writer thread (that run's steps go on during the fsync); one that every
    run of the group waits for is written on the loop's thread."""
    reader, backend, _ = racing
    threads: list[int] = []
    backend.between = lambda: threads.append(threading.get_ident())

    async def main() -> int:
        claim = await aclaim_run(reader, "job", kind=KIND, resume=False, first_step="s0")
        other = await aclaim_run(reader, "other", kind=KIND, resume=False, first_step="s0")
        assert claim.run is not None and other.run is not None
        await claim.run.commit(status="running", next_step="s1", rows=[("step", None, 0)])
        # "other" waits for nothing: the writer thread, and the loop runs on meanwhile
        assert backend.commit_thread not in (None, threading.get_ident())
        other.run.release()  # now "job" is the group's only run: nothing else to run
        await claim.run.commit(status="running", next_step="s2", rows=[("step", None, 1)])
        assert backend.commit_thread == threading.get_ident()
        assert threads == []  # claims and commits read no journal
        assert (await aread_run(reader, "job")) is not None
        assert _data(await claim.run.ajournal()) == ["0", "1"]
        claim.run.release()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(threads) == 2 and loop_thread not in threads


def test_a_claim_that_starts_no_run_leaves_no_member_in_the_group(
    racing: tuple[Store, _BetweenReads, Store],
) -> None:
    """guarantee 256: a claim that finds its run done, or is refused, does not count as a
    run of the loop's group: a lone run's commits are then still written on the loop's
    thread."""
    reader, backend, writer = racing
    done = _run(writer, "done", 1)
    done.commit_sync(status="done", next_step=None)
    done.release()
    live = _run(writer, "live", 0)  # owned by this process, alive: a claim is refused

    async def main() -> None:
        found = await aclaim_run(reader, "done", kind=KIND, resume=True, first_step="s0")
        assert found.outcome == "done" and found.run is None
        with pytest.raises(ConcurrentRunError):
            await aclaim_run(reader, "live", kind=KIND, resume=True, first_step="s0")
        claim = await aclaim_run(reader, "job", kind=KIND, resume=False, first_step="s0")
        assert claim.run is not None
        await claim.run.commit(status="running", next_step="s1", rows=[("step", None, 0)])
        assert backend.commit_thread == threading.get_ident()
        claim.run.release()

    asyncio.run(main())
    live.release()
