"""Observability: Session events and exporters."""

from stepstone.observability._session import Event, EventType, Exporter, Session

__all__ = ["Event", "EventType", "Exporter", "Session"]
