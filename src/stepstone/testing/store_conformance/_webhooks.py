"""The webhook outbox (``store/_webhooks.py``) on every backend: recorded once per id,
listed by run and status, changed only by a compare-and-swap on its version."""

from __future__ import annotations

import dataclasses
import threading
import uuid

from stepstone.store._webhooks import WebhookRecord
from stepstone.testing.store_conformance._spec import StoreSpec


def _record(run_key: str, n: int) -> WebhookRecord:
    return WebhookRecord(
        id=f"msg_{uuid.uuid4().hex}",
        run_key=run_key,
        url=f"http://127.0.0.1:9/hook/{n}",
        event="run.finished",
        status="waiting",
        payload=None,
        attempts=0,
        next_at=0.0,
        lease_until=0.0,
        owner=None,
        log="[]",
        created_at=1000.0 + n,
        updated_at=1000.0 + n,
        version=0,
    )


def test_webhook_outbox_records_lists_and_swaps_deliveries(store_spec: StoreSpec) -> None:
    """guarantee 570: a delivery is stored once per id (a second add of the id stores
    nothing), read back exactly, listed by run and by status in creation order, and changed
    only while its stored version is the one the change expects: of two changes made from
    the same version, one lands."""
    backend = store_spec.open().backend
    run_key = f"hooked-{uuid.uuid4().hex[:10]}"
    first, second = _record(run_key, 1), _record(run_key, 2)
    other = _record(f"{run_key}-other", 3)
    assert backend.webhook_add(first) is True
    assert backend.webhook_add(dataclasses.replace(first, url="http://127.0.0.1:9/x")) is False
    assert backend.webhook_add(second) and backend.webhook_add(other)
    assert backend.webhook_get(first.id) == first
    assert backend.webhook_get("msg_none") is None
    assert [r.id for r in backend.webhook_list(run_key)] == [first.id, second.id]
    assert backend.webhook_list(run_key, ()) == []
    claimed = dataclasses.replace(
        first,
        status="pending",
        payload='{"type":"run.finished"}',
        lease_until=2000.5,
        owner="server-1",
        version=1,
    )
    assert backend.webhook_update(claimed, 0) is True
    assert backend.webhook_update(dataclasses.replace(claimed, owner="server-2"), 0) is False
    assert backend.webhook_get(first.id) == claimed
    assert [r.id for r in backend.webhook_list(run_key, ("pending",))] == [first.id]
    mine = {r.id for r in backend.webhook_list(None, ("waiting",))}
    assert {second.id, other.id} <= mine and first.id not in mine
    # two servers claim the same delivery at once: exactly one wins
    results: list[bool] = []

    def claim(owner: str) -> None:
        mine = dataclasses.replace(second, owner=owner, lease_until=3000.0, version=1)
        results.append(backend.webhook_update(mine, 0))

    threads = [threading.Thread(target=claim, args=(f"server-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False, False, False, True]
    stored = backend.webhook_get(second.id)
    assert stored is not None and stored.version == 1 and stored.owner is not None
