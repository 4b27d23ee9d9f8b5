"""The webhook outbox as the server uses it: record a delivery when a run starts, fix its
body when the run ended, claim due deliveries with a lease, record each attempt
(``store/_webhooks.py`` holds the records; every change is a compare-and-swap)."""

from __future__ import annotations

import dataclasses
import datetime
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
    record = WebhookRecord(
        id=f"msg_{new_uid()}",
        run_key=run_key,
        url=url,
        event=EVENT,
        status="waiting",
        payload=None,
        attempts=0,
        next_at=0.0,
        lease_until=0.0,
        owner=None,
        log="[]",
        created_at=now,
        updated_at=now,
        version=0,
    )
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
