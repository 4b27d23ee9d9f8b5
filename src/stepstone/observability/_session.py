"""Session: the event bus runs report to, and the exporters that receive events."""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Any, Protocol

__all__ = ["Event", "EventType", "Exporter", "Session"]

log = logging.getLogger("stepstone")


class EventType(enum.StrEnum):
    """Kinds of events a run emits."""

    AGENT_START = "agent_start"
    AGENT_FINISH = "agent_finish"
    STEP_START = "step_start"
    STEP_FINISH = "step_finish"
    STEP_ERROR = "step_error"
    PLAN_PAUSED = "plan_paused"
    CHECKPOINT = "checkpoint"
    MODEL_REQUEST = "model_request"
    MODEL_RESPONSE = "model_response"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    TOOL_ERROR = "tool_error"
    #: A timed-out sync tool's thread finished after the model was told it timed out.
    TOOL_LATE_RESULT = "tool_late_result"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One thing that happened during a run."""

    type: EventType
    payload: dict[str, Any]
    run_id: str | None
    timestamp: float


class Exporter(Protocol):
    """Receives every event a Session emits."""

    def export(self, event: Event) -> None:
        """Handle one event (must not raise; errors are logged and ignored)."""


class Session:
    """Collects the events of the runs it is passed to and forwards them to exporters.

    A Session is live wiring, not state: it is not persisted, and a resumed run must be
    given its Session again.

    Example::

        session = Session()
        agent = Agent(engine=plan, tools=[...], session=session)
        agent("task")
        [e.type for e in session.events]   # [EventType.AGENT_START, EventType.STEP_START, ...]
    """

    def __init__(
        self, *, exporters: list[Exporter] | None = None, keep_events: bool = True
    ) -> None:
        self.exporters: list[Exporter] = list(exporters or [])
        self.keep_events = keep_events
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, type: EventType, payload: dict[str, Any], *, run_id: str | None = None) -> None:
        """Record an event and hand it to every exporter."""
        event = Event(type=EventType(type), payload=payload, run_id=run_id, timestamp=time.time())
        with self._lock:
            if self.keep_events:
                self.events.append(event)
        for exporter in self.exporters:
            try:
                exporter.export(event)
            except Exception:
                log.warning("stepstone: exporter %r failed", exporter, exc_info=True)

    def of_type(self, type: EventType) -> list[Event]:
        """The recorded events of one type."""
        with self._lock:
            return [e for e in self.events if e.type == type]
