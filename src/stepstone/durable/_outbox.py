"""The webhook outbox as the server uses it: record a delivery when a run starts, fix its
body when the run ended, claim due deliveries with a lease, record each attempt
(``store/_webhooks.py`` holds the records; every change is a compare-and-swap)."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from typing import Any

from stepstone.core._ids import new_uid
from stepstone.durable._messages import run_outcome
from stepstone.durable._queue import existing_queue
from stepstone.store._store import Store
from stepstone.store._webhooks import WebhookRecord

__all__ = [
    "EVENT",
    "claim_due_webhooks",
    "drop_queue_webhook",
    "queue_webhook",
    "queue_webhooks",
    "set_queue_webhook",
    "subscribe_queue_runs",
    "subscribe_queued_run",
    "record_webhook_attempt",
    "settle_ended_webhooks",
    "subscribe_webhook",
    "webhook_deliveries",
]

#: The one event a delivery reports.
EVENT = "run.finished"


def subscribe_webhook(store: Store, run_key: str, url: str) -> WebhookRecord:
    """Record that the end of the run under ``run_key`` is to be told to ``url``."""
    now = store.backend.clock()
    record = _fresh(f"msg_{new_uid()}", run_key, url, "waiting", None, now)
    store.backend.webhook_add(record)
    return record


def webhook_deliveries(store: Store, key: str) -> list[dict[str, Any]]:
    """The webhooks of the run under ``key`` with their attempts, JSON-ready."""
    out = []
    for record in store.backend.webhook_list(key):
        try:
            attempts = json.loads(record.log)
        except ValueError:
            attempts = []
        out.append(
            {
                "id": record.id,
                "url": record.url,
                "event": record.event,
                "status": record.status,
                "attempts": record.attempts,
                "next_at": record.next_at if record.status == "pending" else None,
                "log": attempts,
            }
        )
    return out


def _payload(store: Store, record: WebhookRecord, status: str, error: str | None) -> str:
    """The body of a delivery: Standard Webhooks' ``type``, ``timestamp``, ``data``."""
    data: dict[str, Any] = {"key": record.run_key, "status": status, "error": error}
    queue = existing_queue(store)
    entry = queue.latest_entry(record.run_key) if queue is not None else None
    if entry is not None and entry.result is not None:
        try:
            data["result"] = json.loads(entry.result).get("payload")
        except (ValueError, AttributeError):
            data["result"] = None
    when = datetime.datetime.fromtimestamp(store.backend.clock(), tz=datetime.UTC)
    body = {"type": EVENT, "timestamp": when.isoformat().replace("+00:00", "Z"), "data": data}
    return json.dumps(body, default=str, ensure_ascii=False, separators=(",", ":"))


def settle_ended_webhooks(store: Store) -> int:
    """Fix the body of each waiting delivery whose run ended (it becomes ``pending``, due
    now); a run deleted before it ended is reported as ``deleted``. Returns how many."""
    backend = store.backend
    settled = 0
    for record in backend.webhook_list(None, ("waiting",)):
        error: str | None
        ended = run_outcome(store, record.run_key)
        if ended is None:
            if backend.run_get(record.run_key) is not None:
                continue
            queue = existing_queue(store)
            if queue is not None and queue.latest_entry(record.run_key) is not None:
                continue
            status, error = "deleted", "the run was deleted before it ended"
        else:
            status, error = ended.status, ended.error
        now = backend.clock()
        settled += backend.webhook_update(
            dataclasses.replace(
                record,
                status="pending",
                payload=_payload(store, record, status, error),
                next_at=now,
                updated_at=now,
                version=record.version + 1,
            ),
            record.version,
        )
    return settled


def claim_due_webhooks(store: Store, owner: str, lease: float) -> list[WebhookRecord]:
    """Claim the deliveries due now that nobody holds, for ``lease`` seconds each."""
    backend = store.backend
    now = backend.clock()
    claimed = []
    for record in backend.webhook_list(None, ("pending",)):
        if record.next_at > now or record.lease_until > now:
            continue
        mine = dataclasses.replace(
            record, owner=owner, lease_until=now + lease, updated_at=now, version=record.version + 1
        )
        if backend.webhook_update(mine, record.version):
            claimed.append(mine)
    return claimed


def record_webhook_attempt(
    store: Store,
    record: WebhookRecord,
    *,
    sent_at: float,
    answer: int | None,
    error: str | None,
    took: float,
    attempts_allowed: int,
    wait: float,
) -> bool:
    """Record one attempt of a claimed delivery: ``delivered`` when ``error`` is None,
    else ``pending`` again in ``wait`` seconds, or ``failed`` after the last attempt.
    False when the claim was lost meanwhile (another server's record stands)."""
    backend = store.backend
    now = backend.clock()
    attempts = record.attempts + 1
    try:
        log = json.loads(record.log)
    except ValueError:
        log = []
    log.append({"at": sent_at, "status": answer, "error": error, "seconds": took})
    if error is None:
        status, next_at = "delivered", now
    elif attempts >= attempts_allowed:
        status, next_at = "failed", now
    else:
        status, next_at = "pending", now + wait
    return backend.webhook_update(
        dataclasses.replace(
            record,
            status=status,
            attempts=attempts,
            next_at=next_at,
            lease_until=0.0,
            owner=None,
            log=json.dumps(log[-50:], separators=(",", ":")),
            updated_at=now,
            version=record.version + 1,
        ),
        record.version,
    )


# -- a queue's webhook: every run of the queue told to one URL when it ends ----------------


def _queue_id(queue: str) -> str:
    return f"queue:{queue}"


def queue_webhook(store: Store, queue: str) -> WebhookRecord | None:
    """The standing order of ``queue`` (``status`` ``subscribed``), or None."""
    found = store.backend.webhook_get(_queue_id(queue))
    return found if found is not None and found.status == "subscribed" else None


def queue_webhooks(store: Store) -> list[WebhookRecord]:
    """Every queue's standing order."""
    return store.backend.webhook_list(None, ("subscribed",))


def _since(record: WebhookRecord) -> tuple[str, float]:
    data = json.loads(record.payload or "{}")
    return str(data["queue"]), float(data["since"])


def set_queue_webhook(store: Store, queue: str, url: str) -> WebhookRecord:
    """Have the end of every run submitted to ``queue`` from now on told to ``url`` (one
    URL per queue: a second call replaces the first from then on). Kept in the outbox
    table as the record ``queue:NAME``, so every server on the store sends them."""
    backend = store.backend
    for _ in range(10):
        now = backend.clock()
        payload = json.dumps({"queue": queue, "since": now})
        found = backend.webhook_get(_queue_id(queue))
        if found is None:
            record = _fresh(_queue_id(queue), "", url, "subscribed", payload, now)
            if backend.webhook_add(record):
                return record
            continue
        record = dataclasses.replace(
            found,
            url=url,
            status="subscribed",
            payload=payload,
            updated_at=now,
            version=found.version + 1,
        )
        if backend.webhook_update(record, found.version):
            return record
    raise RuntimeError(f"the webhook of queue {queue!r} kept changing under this call; try again")


def drop_queue_webhook(store: Store, queue: str) -> bool:
    """Stop telling ``queue``'s URL about runs submitted from now on (deliveries already
    recorded still go); whether it had one."""
    backend = store.backend
    for _ in range(10):
        found = queue_webhook(store, queue)
        if found is None:
            return False
        dropped = dataclasses.replace(
            found, status="dropped", updated_at=backend.clock(), version=found.version + 1
        )
        if backend.webhook_update(dropped, found.version):
            return True
    raise RuntimeError(f"the webhook of queue {queue!r} kept changing under this call; try again")


def _delivery_id(order: WebhookRecord, entry_id: str) -> str:
    """The delivery of one queue entry's end to the queue's URL: the same id whichever
    server records it, however often (so it is recorded once)."""
    digest = hashlib.sha256(f"{order.url}\0{order.payload}".encode()).hexdigest()[:12]
    return f"msg_q{digest}_{entry_id}"


def subscribe_queue_runs(store: Store, seen: set[str] | None = None) -> int:
    """Record a delivery for each entry submitted to a subscribed queue since it was
    subscribed that has none yet (``waiting`` until its run ends); ``seen``: the entry ids
    this caller already handled, skipped (and added to). Returns how many it recorded."""
    orders = queue_webhooks(store)
    if not orders:
        return 0
    found = existing_queue(store)
    if found is None:
        return 0
    seen = set() if seen is None else seen
    added = 0
    for order in orders:
        queue, since = _since(order)
        for entry in found.entries(queue, None):
            mark = f"{order.id}@{order.version}:{entry.id}"
            if entry.created_at < since or mark in seen:
                continue
            added += _add_delivery(store, order, entry.run_key, entry.id)
            seen.add(mark)
    return added


def subscribe_queued_run(store: Store, queue: str, run_key: str, entry_id: str) -> bool:
    """Record the delivery of a run just submitted to ``queue`` when the queue has a
    webhook (what :func:`subscribe_queue_runs` would do a moment later)."""
    order = queue_webhook(store, queue)
    return order is not None and bool(_add_delivery(store, order, run_key, entry_id))


def _add_delivery(store: Store, order: WebhookRecord, run_key: str, entry_id: str) -> int:
    now = store.backend.clock()
    record = _fresh(_delivery_id(order, entry_id), run_key, order.url, "waiting", None, now)
    return int(store.backend.webhook_add(record))


def _fresh(
    id: str, run_key: str, url: str, status: str, payload: str | None, now: float
) -> WebhookRecord:
    """A new outbox record: no attempt yet, not leased, version 0."""
    return WebhookRecord(
        id=id,
        run_key=run_key,
        url=url,
        event=EVENT,
        status=status,
        payload=payload,
        attempts=0,
        next_at=0.0,
        lease_until=0.0,
        owner=None,
        log="[]",
        created_at=now,
        updated_at=now,
        version=0,
    )
