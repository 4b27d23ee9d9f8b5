"""OpenTelemetry exporter: Session events become spans (``pip install stepstone[otel]``)."""

from __future__ import annotations

import threading
from typing import Any

from stepstone.exceptions import MissingExtraError
from stepstone.observability._session import Event, EventType

__all__ = ["OTelExporter"]

# payload key -> OpenTelemetry attribute (GenAI semantic conventions where they exist)
_ATTRS = {
    "model": "gen_ai.request.model",
    "provider": "gen_ai.system",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "tool": "gen_ai.tool.name",
    "call_id": "gen_ai.tool.call.id",
    "agent_name": "gen_ai.agent.name",
}


def _attributes(payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in payload.items():
        name = _ATTRS.get(key, f"stepstone.{key}")
        if isinstance(value, bool | int | float | str):
            out[name] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[name] = list(value)
        elif value is not None:
            out[name] = str(value)
    return out


class OTelExporter:
    """Turns Session events into OpenTelemetry spans.

    One span per agent run (``AGENT_START`` → ``AGENT_FINISH``), per model call
    (``MODEL_REQUEST`` → ``MODEL_RESPONSE``), per tool call (``TOOL_CALL`` → ``TOOL_RESULT``
    / ``TOOL_ERROR``) and per Plan step (``STEP_START`` → ``STEP_FINISH`` / ``STEP_ERROR``);
    model and tool spans are children of their run's span. Other events become span events
    on the run span. Attributes follow the GenAI semantic conventions
    (``gen_ai.request.model``, ``gen_ai.usage.input_tokens``...).

    Args:
        tracer: A tracer to use; default ``opentelemetry.trace.get_tracer("stepstone")``
            (configure a TracerProvider as usual).
        tracer_provider: Take the tracer from this provider instead.

    Raises:
        MissingExtraError: when ``opentelemetry-api`` is not installed.
    """

    def __init__(self, tracer: Any = None, *, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:  # pragma: no cover - the dev venv has it
            raise MissingExtraError("opentelemetry-api", "otel") from exc
        self._trace = trace
        if tracer is None:
            tracer = (
                tracer_provider.get_tracer("stepstone")
                if tracer_provider is not None
                else trace.get_tracer("stepstone")
            )
        self.tracer = tracer
        self._spans: dict[tuple[str | None, str, Any], Any] = {}
        self._lock = threading.Lock()

    def _start(self, key: tuple[str | None, str, Any], name: str, event: Event) -> None:
        parent = None
        if key[1] != "run":
            parent = self._spans.get((event.run_id, "run", None))
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            name,
            context=context,
            attributes=_attributes(event.payload),
            start_time=int(event.timestamp * 1e9),
        )
        self._spans[key] = span

    def _end(self, key: tuple[str | None, str, Any], event: Event, *, error: bool = False) -> None:
        span = self._spans.pop(key, None)
        if span is None:
            return
        span.set_attributes(_attributes(event.payload))
        if error:
            from opentelemetry.trace import Status, StatusCode

            message = event.payload.get("message") or event.payload.get("error")
            span.set_status(Status(StatusCode.ERROR, str(message) if message else None))
        span.end(end_time=int(event.timestamp * 1e9))

    def export(self, event: Event) -> None:
        """Open, close or annotate spans for ``event``."""
        p = event.payload
        run = event.run_id
        with self._lock:
            t = event.type
            if t == EventType.AGENT_START:
                self._start((run, "run", None), f"agent {p.get('agent_name', 'agent')}", event)
            elif t == EventType.AGENT_FINISH:
                self._end((run, "run", None), event, error=p.get("ok") is False)
            elif t == EventType.MODEL_REQUEST:
                self._start(
                    (run, "model", p.get("turn")), f"chat {p.get('model', '')}".strip(), event
                )
            elif t == EventType.MODEL_RESPONSE and "retry" in p:
                span = self._spans.get((run, "model", p.get("turn")))
                if span is not None:
                    span.add_event(
                        "retry", attributes=_attributes(p), timestamp=int(event.timestamp * 1e9)
                    )
            elif t == EventType.MODEL_RESPONSE:
                self._end((run, "model", p.get("turn")), event, error="error" in p)
            elif t == EventType.TOOL_CALL:
                self._start((run, "tool", p.get("call_id")), f"execute_tool {p.get('tool')}", event)
            elif t in (EventType.TOOL_RESULT, EventType.TOOL_ERROR):
                key = (run, "tool", p.get("call_id"))
                if key in self._spans:
                    self._end(key, event, error=t == EventType.TOOL_ERROR)
                else:  # refused before it ran (max_tool_calls_per_turn)
                    self._start(key, f"execute_tool {p.get('tool')}", event)
                    self._end(key, event, error=True)
            elif t == EventType.STEP_START:
                self._start((run, "step", p.get("step")), f"step {p.get('step')}", event)
            elif t in (EventType.STEP_FINISH, EventType.STEP_ERROR):
                self._end((run, "step", p.get("step")), event, error=t == EventType.STEP_ERROR)
            else:
                span = self._spans.get((run, "run", None))
                if span is not None:
                    span.add_event(
                        t.value, attributes=_attributes(p), timestamp=int(event.timestamp * 1e9)
                    )

    def open_spans(self) -> int:
        """How many spans are started and not yet ended (0 after clean runs)."""
        with self._lock:
            return len(self._spans)
