"""The webhook outbox: deliveries a server owes, kept in the store so none is lost.

A delivery is recorded when a run is started with a webhook URL (``waiting``: the run has
not ended). Once the run ended, a server claims it (a lease on the row, judged by the
database's clock), sends it, and records the attempt: ``delivered``, or ``pending`` again
with the time of the next try, or ``failed`` after the last one. A server killed while it
sends leaves the row claimed; its lease runs out and another claim sends it again, with the
same id, so a receiver dedupes on it (at least once). Every change is a compare-and-swap
on the row's ``version``.
"""

from __future__ import annotations

import dataclasses

__all__ = ["WEBHOOK_STATUSES", "WebhookRecord"]

#: ``waiting`` (its run goes on), ``pending`` (to send), ``delivered``, ``failed`` (gave up);
#: a queue's standing order (not a delivery: its id is ``queue:NAME``, its run key empty)
#: is ``subscribed``, and ``dropped`` once it is taken back.
WEBHOOK_STATUSES = ("waiting", "pending", "delivered", "failed", "subscribed", "dropped")

#: The columns of ``stepstone_webhooks``, in order.
WEBHOOK_COLUMNS = (
    "id",
    "run_key",
    "url",
    "event",
    "status",
    "payload",
    "attempts",
    "next_at",
    "lease_until",
    "owner",
    "log",
    "created_at",
    "updated_at",
    "version",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WebhookRecord:
    """One delivery of the outbox.

    Attributes:
        id: Its id, sent as ``webhook-id`` on every attempt (receivers dedupe on it).
        run_key: The run whose end it reports.
        url: Where it is sent.
        event: What it reports (``run.finished``).
        status: One of :data:`WEBHOOK_STATUSES`.
        payload: The JSON body, fixed when the run ended (None before).
        attempts: How many times it was sent.
        next_at: When it may be sent next (database clock).
        lease_until: Until when the server that claimed it holds it (0: nobody).
        owner: That server's id.
        log: The attempts as a JSON list (time, answer or error, duration).
        created_at: When it was recorded.
        updated_at: Its last change.
        version: Bumped by every change (the compare-and-swap).
    """

    id: str
    run_key: str
    url: str
    event: str
    status: str
    payload: str | None
    attempts: int
    next_at: float
    lease_until: float
    owner: str | None
    log: str
    created_at: float
    updated_at: float
    version: int

    def row(self) -> tuple[object, ...]:
        """Its values in :data:`WEBHOOK_COLUMNS` order."""
        return tuple(getattr(self, name) for name in WEBHOOK_COLUMNS)

    @classmethod
    def of(cls, row: tuple[object, ...] | list[object]) -> WebhookRecord:
        """The record a row of ``stepstone_webhooks`` holds."""
        values = dict(zip(WEBHOOK_COLUMNS, row, strict=True))
        for name in ("next_at", "lease_until", "created_at", "updated_at"):
            values[name] = float(values[name])  # type: ignore[arg-type]
        for name in ("attempts", "version"):
            values[name] = int(values[name])  # type: ignore[call-overload]
        return cls(**values)  # type: ignore[arg-type]
