"""Ownership: a live owner is never displaced; an expired lease can be taken over."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stepstone.durable import claim_run
from stepstone.exceptions import ConcurrentRunError
from stepstone.testing.store_conformance._spec import StoreSpec


def test_claim_live_run_refused_across_store_objects(store_spec: StoreSpec) -> None:
    """guarantee 27/30: a live owner is never displaced, even by another Store object."""
    first = store_spec.open()
    second = store_spec.open() if store_spec.multiprocess else first
    claimed = claim_run(first, "run-l", kind="test", resume=False, first_step="a")
    assert claimed.run is not None
    try:
        for resume in (False, True):
            with pytest.raises(ConcurrentRunError, match="run-l"):
                claim_run(second, "run-l", kind="test", resume=resume, first_step="a")
    finally:
        claimed.run.release()
    # Released and still "claimed": its owner is this process but no longer runs it.
    again = claim_run(second, "run-l", kind="test", resume=True, first_step="a")
    assert again.outcome == "resumed" and again.run is not None
    again.run.release()


def test_lease_renew_and_expiry_takeover(store_spec: StoreSpec) -> None:
    """Another host may take a run over once its lease expired, never before."""
    store = store_spec.open()
    claimed = claim_run(store, "run-e", kind="test", resume=False, first_step="a")
    run = claimed.run
    assert run is not None
    run.release()  # stop the keeper, then pretend the owner is on another host
    head = run.head
    far = head.replace(host="elsewhere", lease_until=time.time() + 60)
    assert store.backend.run_transact("run-e", lambda h, kv: _reclaim(far)) is not None
    with pytest.raises(ConcurrentRunError):
        claim_run(store, "run-e", kind="test", resume=True, first_step="a")
    assert store.backend.run_renew("run-e", head.run_uid, time.time() - 1)
    assert not store.backend.run_renew("run-e", "not-the-owner", time.time() + 60)
    taken = claim_run(store, "run-e", kind="test", resume=True, first_step="a")
    assert taken.outcome == "resumed" and taken.run is not None
    assert taken.head.run_uid != head.run_uid
    taken.run.release()


def _reclaim(head: Any) -> Any:
    from stepstone.store import Claim

    return Claim(head=head)
