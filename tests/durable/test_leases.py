"""The kernel's lease policy: one rule for how long a lease holds, when it is renewed and
when it ran out, used by run claims, the lease keeper, prune and the workers."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stepstone import Store, Worker
from stepstone.cli import app
from stepstone.durable import (
    LeasePolicy,
    cancel_run,
    claim_run,
    owner_alive,
    prune_run,
    retry_run,
)
from stepstone.durable._inspect import query_runs, run_detail, stranded_runs
from stepstone.durable._queue import queue_backend
from stepstone.exceptions import (
    ConcurrentRunError,
    ConfigurationError,
    ConfigurationTypeError,
    UserError,
)
from stepstone.store import SQLiteBackend
from stepstone.store._base import Claim, RunHead
from tests.workers import targets
from tests.workers.targets import task

KIND = "lease-test"

BAD_NUMBERS = [0, -1, -0.5, math.nan, math.inf, -math.inf]
BAD_TYPES: list[Any] = ["30", None, True, [30]]


class _BehindSQLite(SQLiteBackend):
    """A SQLite backend whose "database clock" is an hour behind this host's."""

    def clock(self) -> float:
        return time.time() - 3600


# -- the policy value ----------------------------------------------------------------------
def test_the_policy_arithmetic() -> None:
    # guarantee 311: renewed once a third of the lease has passed, expired only after all
    # of it; every time is the caller's (the database's) clock
    lease = LeasePolicy(9.0)
    assert lease.seconds == 9.0 and LeasePolicy().seconds == 30.0
    assert lease.renew_every == 3.0 and lease.until(100.0) == 109.0
    assert not lease.due(109.0, 100.0) and not lease.due(109.0, 102.9)
    assert lease.due(109.0, 103.1)
    assert not lease.expired(109.0, 109.0) and lease.expired(109.0, 109.1)
    assert lease.retry_after == 3.0 and LeasePolicy(60).retry_after == 5.0
    fields = lease.claim(100.0, "uid-1")
    assert fields["run_uid"] == "uid-1" and fields["status"] == "claimed"
    assert fields["lease_until"] == 109.0 and fields["updated_at"] == 100.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        lease.seconds = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_a_lease_must_be_a_finite_number_above_zero(bad: float, tmp_path: Path) -> None:
    # guarantee 310
    path = tmp_path / "never.sqlite"
    for build in (
        lambda: LeasePolicy(bad),
        lambda: Store(db=path, lease_seconds=bad),
    ):
        with pytest.raises(ConfigurationError, match=f"lease_seconds must be a finite .*{bad}"):
            build()
    with pytest.raises(ValueError, match="lease_seconds"):  # still a ValueError
        Store(lease_seconds=bad)
    assert not path.exists()  # refused before anything was opened
    with (
        Store(db=tmp_path / "q.sqlite") as store,
        pytest.raises(UserError, match="lease_seconds"),  # still a UserError
    ):
        Worker(store, lease_seconds=bad)


@pytest.mark.parametrize("bad", BAD_TYPES)
def test_a_lease_that_is_not_a_number_is_refused(bad: Any) -> None:
    # guarantee 310
    with pytest.raises(ConfigurationTypeError, match="lease_seconds must be a number"):
        Store(lease_seconds=bad)
    with pytest.raises(TypeError, match=re.escape(f"got {bad!r}")):
        LeasePolicy(bad)


def test_the_worker_command_refuses_a_bad_lease(tmp_path: Path) -> None:
    # guarantee 310
    db = tmp_path / "q.sqlite"
    Store(db=db).close()
    for bad in ("0", "-3", "nan", "inf"):
        result = CliRunner().invoke(app, ["worker", "--db", str(db), "--lease-seconds", bad])
        assert result.exit_code == 2, result.output
        assert "error: lease_seconds must be a finite number of seconds > 0" in result.output


def test_store_worker_and_cli_default_to_the_policy_default(tmp_path: Path) -> None:
    import inspect

    from stepstone.cli._worker import worker as worker_command

    default = LeasePolicy().seconds
    assert Store().lease_seconds == default
    for fn in (Store.__init__, Worker.__init__, worker_command):
        param = inspect.signature(fn).parameters["lease_seconds"]
        assert param.default == default, fn


def test_store_and_worker_carry_their_lease_to_the_kernel(tmp_path: Path) -> None:
    with Store(db=tmp_path / "q.sqlite", lease_seconds=12) as store:
        assert store.lease_seconds == 12.0 and LeasePolicy.of(store) == LeasePolicy(12)
        claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
        assert claim.run is not None
        assert claim.run.lease == LeasePolicy(12)
        claim.run.release()
        worker = Worker(store, lease_seconds=7)
        assert worker.lease == LeasePolicy(7) and worker.lease_seconds == 7.0


# -- the policy at work ------------------------------------------------------------------------
@pytest.fixture
def behind(tmp_path: Path) -> Iterator[Store]:
    with Store(backend=_BehindSQLite(tmp_path / "b.sqlite"), lease_seconds=0.9) as store:
        yield store


def test_the_keeper_renews_by_the_database_clock(behind: Store) -> None:
    # guarantees 311, 242: the database's clock is an hour behind this host's, so every
    # lease it sets has "run out" by this host's clock; the keeper still renews it every
    # third of the lease, and the run stays live by the database's clock
    claim = claim_run(behind, "job", kind=KIND, resume=False, first_step="a")
    assert claim.run is not None
    try:
        first = claim.run.head.lease_until
        assert first < time.time() - 3000
        deadline = time.monotonic() + 30
        renewals = set()
        while len(renewals) < 3:
            head = behind.backend.run_get("job")
            assert head is not None
            if head.lease_until > first:
                renewals.add(head.lease_until)
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        now = behind.backend.clock()
        assert owner_alive(head.replace(host="another-host"), now=now)
        assert not owner_alive(head.replace(host="another-host"), now=now + 1.0)
        assert not claim.run.lease_due()  # just renewed
    finally:
        claim.run.release()


def test_claims_stamp_the_lease_by_the_database_clock(behind: Store) -> None:
    # guarantee 242: the claim's lease is the database's now + lease_seconds, and a prune
    # (which claims the run it deletes, with the same policy) works on that clock too
    claim = claim_run(behind, "job", kind=KIND, resume=False, first_step="a")
    assert claim.run is not None
    assert abs(claim.head.lease_until - (behind.backend.clock() + 0.9)) < 0.5
    claim.run.commit_sync(status="done", next_step=None)
    claim.run.release()
    head = behind.backend.run_get("job")
    assert head is not None
    assert prune_run(behind, head) == [] and behind.backend.run_get("job") is None


def test_operators_judge_an_owner_by_the_database_clock(tmp_path: Path) -> None:
    # guarantee 242: a run live by the database's clock, whose owner is on another host,
    # is asked to stop by cancel and refused by retry, though by this host's clock (an
    # hour ahead of the database's) its lease ran out long ago (a Plan run: retry refuses
    # other kinds of run whatever their owner)
    with Store(backend=_BehindSQLite(tmp_path / "o.sqlite"), lease_seconds=60) as store:
        claim = claim_run(store, "job", kind="plan", resume=False, first_step="a")
        assert claim.run is not None
        claim.run.commit_sync(status="running", next_step="b", rows=[("step", "a", {})])
        claim.run.release()

        def elsewhere(head: RunHead | None, _kv: str | None) -> Claim:
            assert head is not None  # a live owner on another host, by the database's clock
            until = LeasePolicy(60).until(store.backend.clock())
            return Claim(head=head.replace(host="another-host", lease_until=until))

        store.backend.run_transact("job", elsewhere)
        with pytest.raises(ConcurrentRunError, match="is live"):
            retry_run(store, "job", from_step="a")
        assert cancel_run(store, "job").startswith("cancel requested")
        head = store.backend.run_get("job")
        assert head is not None and head.status == "running"
        assert head.meta["cancel_requested"]["reason"] == "cancelled"


def test_read_models_judge_an_owner_by_the_database_clock(tmp_path: Path) -> None:
    # guarantee 242: what the operator sees (runs, show, stranded) agrees with what cancel
    # and retry do: a run live by the database's clock is live, though by this host's clock
    # (an hour ahead of the database's) its lease ran out long ago
    path = tmp_path / "r.sqlite"
    with Store(backend=_BehindSQLite(path), lease_seconds=60) as store:
        claim = claim_run(store, "job", kind=KIND, resume=False, first_step="a")
        assert claim.run is not None
        claim.run.commit_sync(status="running", next_step="b", rows=[("step", "a", {})])
        claim.run.release()

        def elsewhere(head: RunHead | None, _kv: str | None) -> Claim:
            assert head is not None
            until = LeasePolicy(60).until(store.backend.clock())
            return Claim(head=head.replace(host="another-host", lease_until=until))

        store.backend.run_transact("job", elsewhere)
        detail = run_detail(store, "job")
        assert detail is not None and detail["owner"] == "live"
        assert 0 < detail["lease_expires_in"] <= 60
        assert stranded_runs(store) == []
        total, page = query_runs(store)
        assert total == 1 and page[0]["owner"] == "live"
        # the same record judged by this host's clock would read as stranded
        assert stranded_runs(store, now=time.time())[0]["key"] == "job"


def test_a_worker_hands_back_a_run_still_owned_elsewhere(tmp_path: Path) -> None:
    # guarantee 314: the run's checkpoint is held by a live owner (this process): the
    # worker hands the entry back, not counted as an attempt, runnable again one renewal
    # period of the store's lease later, and runs it once the owner lets go
    with Store(db=tmp_path / "q.sqlite", lease_seconds=6) as store:
        handle = targets.plan.submit(task(str(tmp_path / "log"), "h"), store=store)
        holder = claim_run(store, handle.key, kind="plan", resume=False, first_step="s00")
        assert holder.run is not None
        worker = Worker(store, poll_interval=0.05, lease_seconds=5)
        assert worker.run(max_runs=1) == 0
        queue = queue_backend(store)
        entry = queue.get(handle.id)
        assert entry is not None
        assert (entry.status, entry.attempts, entry.worker) == ("queued", 0, None)
        wait = entry.not_before - queue.now()
        assert LeasePolicy(6).retry_after - 1.0 < wait <= LeasePolicy(6).retry_after == 2.0
        holder.run.release()
        assert Worker(store, poll_interval=0.05).run(max_runs=1) == 1  # once it is due
        assert handle.result(timeout=5).payload["name"] == "h"
