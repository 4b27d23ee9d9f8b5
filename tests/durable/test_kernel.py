"""The durable kernel on its own: claims, leases, the commit compare-and-swap and dead-owner
takeover, driven through ``stepstone.durable`` with a neutral run kind (no engine).

Engines' own tests check what they build on top; these check the calls every engine
relies on, on real SQLite files and real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import Store
from stepstone.core._ids import host_id, process_alive, process_start_time
from stepstone.durable import claim_run, owner_alive
from stepstone.exceptions import ConcurrentRunError, StoreKeyConflictError
from stepstone.store._base import RunHead

KIND = "kernel-test"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(db=tmp_path / "k.sqlite") as s:
        yield s


# -- claims ------------------------------------------------------------------------------
def test_fresh_claim_records_owner_and_lease(store: Store) -> None:
    before = time.time()
    claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a", meta={"x": 1})
    assert claim.outcome == "fresh" and claim.previous is None and claim.run is not None
    head = store.backend.run_get("job")
    assert head is not None
    assert (head.status, head.next_step, head.version, head.journal_len) == ("claimed", "a", 1, 0)
    assert head.run_uid == claim.run.run_uid and len(head.run_uid) == 32
    assert (head.host, head.pid) == (host_id(), os.getpid())
    assert head.pid_start == process_start_time(os.getpid()) is not None
    assert head.lease_until >= before + store.lease_seconds - 1
    # a stamp of this run of the key: kept by resumes, new for the next fresh start
    origin = head.meta["origin"]
    assert head.meta == {"origin": origin, "x": 1} and len(origin) == 12
    claim.run.release()
    resumed = claim_run(store, "job", kind=KIND, resume=True, first_step="a")
    assert resumed.head.meta == {"origin": origin, "x": 1} and resumed.run is not None
    resumed.run.release()
    again = claim_run(store, "job", kind=KIND, resume=False, first_step="a").head.meta
    assert again["origin"] != origin
    claim.run.release()


def test_a_live_owner_is_never_displaced(store: Store, tmp_path: Path) -> None:
    # guarantee 27 for every engine: neither a fresh run nor a resume takes a live run
    first = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert first.run is not None
    with Store(db=tmp_path / "k.sqlite") as other:  # another Store object on the same file
        for resume in (False, True):
            with pytest.raises(ConcurrentRunError, match=first.run.run_uid) as info:
                claim_run(other, "job", kind=KIND, resume=resume, first_step="a")
            assert "'job'" in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    assert store.backend.run_get("job") == first.run.head  # nothing was written
    first.run.release()


def test_a_key_of_another_kind_or_a_plain_value_is_refused(store: Store) -> None:
    claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert claim.run is not None
    claim.run.commit_sync(status="failed", next_step="a")
    claim.run.release()
    with pytest.raises(StoreKeyConflictError, match="holds a kernel-test run, not a other run"):
        claim_run(store, "job", kind="other", resume=True, first_step="a")
    store.write("plain", {"v": 1})
    with pytest.raises(StoreKeyConflictError, match=r"store\.delete\('plain'\)"):
        claim_run(store, "plain", kind=KIND, resume=False, first_step="a")
    assert store.read("plain") == {"v": 1}


def test_resume_takes_over_where_the_run_stopped_and_fresh_resets(store: Store) -> None:
    first = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert first.run is not None
    first.run.commit_sync(status="running", next_step="b", iteration=1, rows=[("step", "a", 1)])
    first.run.commit_sync(status="failed", next_step="b", meta={"error": "boom"})
    first.run.release()
    resumed = claim_run(store, "job", kind=KIND, resume=True, first_step="a", meta={"y": 2})
    assert resumed.outcome == "resumed" and resumed.run is not None
    assert resumed.previous is not None and resumed.previous.run_uid == first.run.run_uid
    head = resumed.run.head
    assert (head.next_step, head.iteration, head.journal_len) == ("b", 1, 1)
    assert head.run_uid != first.run.run_uid  # a new owner stamp
    # an engine's commit replaces the meta but keeps the run's origin; a resume keeps it
    origin = first.run.head.meta["origin"]
    assert head.meta == {"error": "boom", "y": 2, "origin": origin}
    resumed.run.commit_sync(status="failed", next_step="b")
    resumed.run.release()
    fresh = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert fresh.outcome == "fresh" and fresh.run is not None
    assert (fresh.run.head.next_step, fresh.run.head.journal_len) == ("a", 0)
    assert fresh.run.journal() == []  # the old journal is gone with the fresh start
    assert fresh.run.head.meta["origin"] != origin
    fresh.run.release()


def test_resume_of_a_done_run_claims_nothing(store: Store) -> None:
    first = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert first.run is not None
    first.run.commit_sync(status="done", next_step=None)
    first.run.release()
    done_head = store.backend.run_get("job")
    again = claim_run(store, "job", kind=KIND, resume=True, first_step="a")
    assert again.outcome == "done" and again.run is None
    assert store.backend.run_get("job") == done_head  # not even the lease was touched


def test_check_resume_can_refuse_before_anything_is_written(store: Store) -> None:
    first = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert first.run is not None
    first.run.commit_sync(status="paused", next_step="gone")
    first.run.release()
    before = store.backend.run_get("job")

    def refuse(head: RunHead) -> None:
        raise LookupError(f"step {head.next_step!r} no longer exists")

    with pytest.raises(LookupError, match="'gone'"):
        claim_run(store, "job", kind=KIND, resume=True, first_step="a", check_resume=refuse)
    assert store.backend.run_get("job") == before


# -- the commit compare-and-swap ----------------------------------------------------------
def test_commit_writes_head_journal_and_values_together(store: Store) -> None:
    claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    run = claim.run
    assert run is not None
    run.commit_sync(
        status="running",
        next_step="b",
        iteration=1,
        rows=[("step", "a", {"out": 1}), ("note", None, [1, 2])],
        writes=[("job-out", {"out": 1})],
    )
    head = store.backend.run_get("job")
    assert head is not None and (head.version, head.journal_len, head.status) == (2, 2, "running")
    rows = run.journal()
    assert [(r.seq, r.kind, r.name) for r in rows] == [(0, "step", "a"), (1, "note", None)]
    assert store.read("job-out") == {"out": 1}
    assert run.journal(since_seq=1)[0].kind == "note"
    run.release()


def test_a_stale_owner_commits_nothing(store: Store) -> None:
    # the run's lease expired and another run took the key over: the old owner's next commit
    # is refused by the compare-and-swap, and it writes neither journal rows nor values
    old = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert old.run is not None
    old.run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)])
    old.run.release()  # stops renewing: from now on the lease runs out
    expired = old.run.head.replace(lease_until=time.time() - 1, host="elsewhere")
    store.backend.run_commit(expired, old.run.head.version, [], [])  # as if 30 s passed
    old.run.head = expired
    new = claim_run(store, "job", kind=KIND, resume=True, first_step="a")
    assert new.outcome == "resumed" and new.run is not None
    with pytest.raises(ConcurrentRunError, match=f"lost checkpoint 'job' to run {new.run.run_uid}"):
        old.run.commit_sync(
            status="running", next_step="c", rows=[("step", "b", 2)], writes=[("w", 1)]
        )
    assert store.read("w") is None
    assert [r.name for r in new.run.journal()] == ["a"]
    assert store.backend.run_get("job") == new.run.head
    new.run.release()


def test_a_deleted_run_cannot_be_committed_to(store: Store) -> None:
    claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
    assert claim.run is not None
    store.delete("job")
    with pytest.raises(ConcurrentRunError, match="to a delete"):
        claim.run.commit_sync(status="running", next_step="b", writes=[("w", 1)])
    assert store.read("w") is None and store.backend.run_get("job") is None
    claim.run.release()


# -- leases -------------------------------------------------------------------------------
def test_the_keeper_renews_a_live_lease(tmp_path: Path) -> None:
    with Store(db=tmp_path / "l.sqlite", lease_seconds=0.9) as store:
        claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
        assert claim.run is not None
        first_until = claim.run.head.lease_until
        deadline = time.monotonic() + 30
        while True:  # the keeper thread renews every third of the lease
            head = store.backend.run_get("job")
            assert head is not None
            if head.lease_until > first_until + 0.5:
                break
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.1)
        assert owner_alive(head)
        claim.run.release()


def test_an_expired_lease_on_another_host_is_dead() -> None:
    now = time.time()
    head = RunHead(
        key="k", kind=KIND, status="running", next_step="a", run_uid="u", version=3,
        iteration=0, journal_len=0, host="another-host", pid=1, pid_start=None,
        lease_until=now + 10, meta={}, created_at=now, updated_at=now,
    )  # fmt: skip
    assert owner_alive(head, now=now)  # another host: only the lease can tell
    assert not owner_alive(head, now=now + 11)
    for status in ("paused", "failed", "done"):
        assert not owner_alive(head.replace(status=status), now=now)


def test_process_identity_detects_gone_recycled_and_zombie_processes() -> None:
    me = os.getpid()
    assert process_alive(me, process_start_time(me))
    assert not process_alive(me, (process_start_time(me) or 0) + 1)  # a recycled pid
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start_time(child.pid)
    deadline = time.monotonic() + 30
    while process_alive(child.pid, start):  # exited but not reaped: a zombie is dead
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.wait()
    assert not process_alive(child.pid, start)
    assert not process_alive(0, None)


_STEPPED = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import psutil
    from stepstone.core._ids import process_alive, process_start_time

    me, fake = os.getpid(), Path(sys.argv[1])
    before = process_start_time(me)
    stat = Path("/proc/stat").read_text()
    btime = next(int(ln.split()[1]) for ln in stat.splitlines() if ln.startswith("btime"))
    (fake / "stat").write_text(stat.replace(f"btime {btime}", f"btime {btime + 50}"))
    (fake / str(me)).symlink_to(f"/proc/{me}")
    psutil.PROCFS_PATH = str(fake)
    assert psutil.boot_time() == btime + 50, "psutil reads the stepped clock"
    after = process_start_time(me)
    assert after == before is not None, (before, after)
    assert process_alive(me, before)
    """
)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux's /proc")
def test_a_process_start_time_ignores_a_step_of_the_wall_clock(tmp_path: Path) -> None:
    """Guarantee 121: the kernel's boot time (/proc/stat btime) follows every step of the
    wall clock, so a start time derived from wall-clock creation time would move under a
    live owner. A child points psutil at a /proc whose btime moved by 50 s (in its own
    process: psutil's /proc path is global); its start time must not move."""
    done = subprocess.run(
        [sys.executable, "-c", _STEPPED, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# -- dead-owner takeover across processes ----------------------------------------------------
_OWNER = textwrap.dedent(
    """
    import sys, time
    from stepstone import Store
    from stepstone.durable import claim_run
    store = Store(db=sys.argv[1], lease_seconds=float(sys.argv[2]))
    run = claim_run(store, "job", kind="kernel-test", resume=False, first_step="a").run
    run.commit_sync(status="running", next_step="b", rows=[("step", "a", 1)], writes=[("wa", 1)])
    print("ready", flush=True)
    time.sleep(600)  # a long step, killed by the test
    """
)


@pytest.mark.crash
def test_a_killed_owner_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    # the lease is long (300 s): only the dead pid tells that the owner is gone
    db = tmp_path / "kill.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(db), "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        with Store(db=db, lease_seconds=300) as store:
            with pytest.raises(ConcurrentRunError, match=f"pid {proc.pid}"):
                claim_run(store, "job", kind=KIND, resume=True, first_step="a")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            taken = claim_run(store, "job", kind=KIND, resume=True, first_step="a")
            assert taken.outcome == "resumed" and taken.run is not None
            assert taken.previous is not None and taken.previous.pid == proc.pid
            assert taken.run.head.next_step == "b"  # the committed step is not lost
            assert [r.name for r in taken.run.journal()] == ["a"] and store.read("wa") == 1
            taken.run.release()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
