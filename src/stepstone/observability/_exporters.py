"""Console and JSON Lines exporters for :class:`~stepstone.observability.Session` events."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import IO, Any

from stepstone.observability._session import Event, EventType

__all__ = ["ConsoleExporter", "JSONLExporter"]

_CONSOLE_KEYS = (
    "agent_name",
    "step",
    "model",
    "turn",
    "tool",
    "input_tokens",
    "output_tokens",
    "latency_ms",
    "error",
    "message",
    "result",
    "cancelled",
    "ok",
)


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConsoleExporter:
    """Prints one line per event: time, run id, event type, and the interesting fields.

    Args:
        stream: Where to write (default ``sys.stderr``).
        types: Only these event types (default: all).
        verbose: Print every payload field, not just the usual ones.

    Example::

        session = Session(exporters=[ConsoleExporter()])
        # 12:00:01.123 5f3a…  tool_call       agent_name=researcher turn=0 tool='search'
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        types: set[EventType] | None = None,
        verbose: bool = False,
    ) -> None:
        self.stream = stream
        self.types = types
        self.verbose = verbose
        self._lock = threading.Lock()

    def format(self, event: Event) -> str:
        """The line printed for ``event``."""
        clock = time.strftime("%H:%M:%S", time.localtime(event.timestamp))
        millis = int((event.timestamp % 1) * 1000)
        keys = (
            list(event.payload)
            if self.verbose
            else [k for k in _CONSOLE_KEYS if k in event.payload]
        )
        fields = " ".join(f"{k}={_short(event.payload[k])}" for k in keys)
        run = (event.run_id or "-")[:8]
        return f"{clock}.{millis:03d} {run:8} {event.type.value:15} {fields}".rstrip()

    def export(self, event: Event) -> None:
        """Print the event (skipped when its type is filtered out)."""
        if self.types is not None and event.type not in self.types:
            return
        line = self.format(event)
        stream = self.stream or sys.stderr
        with self._lock:
            stream.write(line + "\n")
            stream.flush()


class JSONLExporter:
    """Appends each event as one JSON object per line to a file.

    Lines look like ``{"type": "tool_call", "run_id": "...", "timestamp": 1.7e9,
    "payload": {...}}``; values JSON cannot hold are written as their ``str()``.

    Args:
        path: The file (created, appended to). Opened on the first event.
        flush: Flush after every line (default True, so a crash loses nothing).

    Use it as a context manager or call :meth:`close` when done.
    """

    def __init__(self, path: str | os.PathLike[str], *, flush: bool = True) -> None:
        self.path = os.fspath(path)
        self.flush = flush
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def to_dict(event: Event) -> dict[str, Any]:
        """The JSON object written for ``event``."""
        return {
            "type": event.type.value,
            "run_id": event.run_id,
            "timestamp": event.timestamp,
            "payload": event.payload,
        }

    def export(self, event: Event) -> None:
        """Append one line."""
        line = json.dumps(self.to_dict(event), default=str, ensure_ascii=False)
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            self._file.write(line + "\n")
            if self.flush:
                self._file.flush()

    def close(self) -> None:
        """Close the file (a later event opens it again)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> JSONLExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read back a file written by :class:`JSONLExporter`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
