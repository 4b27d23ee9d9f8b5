"""Observability: Session events and exporters (console, JSON Lines, OpenTelemetry).

``OTelExporter`` needs the ``otel`` extra (``pip install stepstone[otel]``); it is
imported lazily, so ``from stepstone.observability import OTelExporter`` works either way
and a missing package raises ``MissingExtraError`` when the exporter is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepstone.observability._exporters import ConsoleExporter, JSONLExporter, read_jsonl
from stepstone.observability._session import Event, EventType, Exporter, Session

if TYPE_CHECKING:
    from stepstone.observability._otel import OTelExporter

__all__ = [
    "ConsoleExporter",
    "Event",
    "EventType",
    "Exporter",
    "JSONLExporter",
    "OTelExporter",
    "Session",
    "read_jsonl",
]


def __getattr__(name: str) -> Any:
    if name == "OTelExporter":
        from stepstone.observability._otel import OTelExporter

        return OTelExporter
    raise AttributeError(f"module 'stepstone.observability' has no attribute {name!r}")
