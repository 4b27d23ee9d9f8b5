"""Webhooks: a run's end told to a URL, from the store's durable outbox, signed the
Standard Webhooks way.

A run started with ``"webhook": URL`` gets a delivery in the outbox at once (``waiting``).
Each server process runs a :class:`Dispatcher`: it notices runs that ended, fixes their
delivery's body (``pending``), claims due deliveries with a lease (a compare-and-swap on
the row), sends each one signed (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``: HMAC-SHA256 over ``id.timestamp.body``, by the ``standardwebhooks``
package), and records the attempt in the row: ``delivered`` on a 2xx answer, else
``pending`` again with a growing wait, ``failed`` after the last attempt. A server killed
while it sends leaves the delivery claimed; the lease runs out and a server sends it again,
with the same ``webhook-id``, which the receiver dedupes on (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
from typing import Any

from stepstone.core._ids import new_uid
from stepstone.core._threads import to_thread
from stepstone.durable._outbox import (
    claim_due_webhooks,
    record_webhook_attempt,
    settle_ended_webhooks,
    subscribe_queue_runs,
    subscribe_webhook,
    webhook_deliveries,
)
from stepstone.exceptions import MissingExtraError
from stepstone.store import Store
from stepstone.store._queue_base import QueueEntry
from stepstone.store._webhooks import WebhookRecord

__all__ = ["Dispatcher", "WebhookPolicy", "deliveries", "sign", "subscribe"]

log = logging.getLogger("stepstone")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WebhookPolicy:
    """How a server delivers webhooks.

    Attributes:
        secret: The signing secret (``whsec_`` and base64, as Standard Webhooks writes it,
            or any other text, whose UTF-8 bytes are the key).
        attempts: Attempts before a delivery is given up (``failed``).
        backoff: Seconds before the second attempt; each later wait doubles, up to
            ``max_backoff``.
        max_backoff: The longest wait between attempts.
        timeout: Seconds an attempt may take (connect, send, answer).
        poll: Seconds between looks at the outbox.
    """

    secret: str
    attempts: int = 8
    backoff: float = 1.0
    max_backoff: float = 300.0
    timeout: float = 10.0
    poll: float = 0.5

    @property
    def lease(self) -> float:
        """How long a claim on a delivery holds: longer than an attempt can take."""
        return 2 * self.timeout + 5.0

    def wait_after(self, attempts: int) -> float:
        """Seconds before the next attempt, after ``attempts`` failed ones."""
        return float(min(self.max_backoff, self.backoff * 2 ** max(0, attempts - 1)))


def _webhook(secret: str) -> Any:
    try:
        from standardwebhooks.webhooks import Webhook
    except ImportError as exc:  # pragma: no cover - the server extra brings it
        raise MissingExtraError("standardwebhooks", "server") from exc
    if secret.startswith("whsec_"):
        return Webhook(secret)
    return Webhook(secret.encode())


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of ``body`` sent as ``msg_id`` at ``timestamp``."""
    when = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    signature = _webhook(secret).sign(msg_id, when, body)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def subscribe(store: Store, entry: QueueEntry, url: str) -> dict[str, Any]:
    """Record in the outbox that the end of ``entry``'s run is to be told to ``url``."""
    record = subscribe_webhook(store, entry.run_key, url)
    return {"id": record.id, "url": url, "status": record.status}


def deliveries(store: Store, key: str) -> list[dict[str, Any]]:
    """The webhooks of the run under ``key`` with their attempts (the run's view)."""
    return webhook_deliveries(store, key)


class Dispatcher:
    """Delivers the outbox's webhooks from this process until :meth:`stop`."""

    def __init__(self, store: Store, policy: WebhookPolicy) -> None:
        self.store = store
        self.policy = policy
        self.id = f"server-{new_uid()[:12]}"
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._seen: set[str] = set()  # queue entries whose queue's delivery is recorded

    def start(self) -> None:
        """Run on the current event loop."""
        _webhook(self.policy.secret)  # a bad secret fails at start, not at the first send
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop (a delivery in flight is left claimed: its lease hands it on)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()

    async def _run(self) -> None:
        import httpx2

        self._client = httpx2.AsyncClient(timeout=self.policy.timeout, follow_redirects=False)
        while not self._stop.is_set():
            try:
                await to_thread(self._settle_ended)
                due = await to_thread(self._claim_due)
                if due:
                    await asyncio.gather(*(self._deliver(r) for r in due))
            except Exception:
                log.warning("stepstone serve: the webhook outbox could not be read", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.policy.poll)

    def _settle_ended(self) -> None:
        subscribe_queue_runs(self.store, self._seen)
        settle_ended_webhooks(self.store)

    def _claim_due(self) -> list[WebhookRecord]:
        return claim_due_webhooks(self.store, self.id, self.policy.lease)

    async def _deliver(self, record: WebhookRecord) -> None:
        assert record.payload is not None
        sent_at = time.time()
        headers = sign(self.policy.secret, record.id, int(sent_at), record.payload)
        started = time.monotonic()
        answer: int | None = None
        error: str | None = None
        try:
            resp = await self._client.post(record.url, content=record.payload, headers=headers)
            answer = resp.status_code
            if not 200 <= answer < 300:
                error = f"HTTP {answer}: {resp.text[:200]}"
        except Exception as exc:  # noqa: BLE001 - any failure to deliver is one attempt
            error = f"{type(exc).__name__}: {exc}"[:300]
        took = round(time.monotonic() - started, 3)
        await to_thread(self._record, record, sent_at, answer, error, took)

    def _record(
        self,
        record: WebhookRecord,
        sent_at: float,
        answer: int | None,
        error: str | None,
        took: float,
    ) -> None:
        done = record_webhook_attempt(
            self.store,
            record,
            sent_at=sent_at,
            answer=answer,
            error=error,
            took=took,
            attempts_allowed=self.policy.attempts,
            wait=self.policy.wait_after(record.attempts + 1),
        )
        if not done:  # our lease ran out and another server took it: its record stands
            log.warning("stepstone serve: webhook %s was taken over while sent", record.id)
