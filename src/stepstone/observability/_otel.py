"""OpenTelemetry exporter: Session events become spans and metrics following the GenAI
semantic conventions (``pip install stepstone[otel]``)."""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from stepstone.exceptions import MissingExtraError
from stepstone.observability._session import Event, EventType

__all__ = ["CONTENT_ENV_VAR", "OTelExporter"]

#: The conventions' switch for recording prompts, answers and tool arguments/results.
CONTENT_ENV_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

#: Our provider names -> ``gen_ai.provider.name`` values.
_PROVIDERS = {"google": "gcp.gemini", "anthropic": "anthropic", "openai": "openai"}

#: Payload keys that carry content (prompts, answers, tool arguments and results).
_CONTENT = {
    "task": "gen_ai.input.messages",
    "arguments": "gen_ai.tool.call.arguments",
    "result": "gen_ai.tool.call.result",
}

# payload key -> attribute, for every span kind
_COMMON = {
    "agent_name": "gen_ai.agent.name",
    "tool": "gen_ai.tool.name",
    "call_id": "gen_ai.tool.call.id",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cache_read_tokens": "gen_ai.usage.cache_read.input_tokens",
    "cache_write_tokens": "gen_ai.usage.cache_creation.input_tokens",
    "reasoning_tokens": "gen_ai.usage.reasoning.output_tokens",
    "stream": "gen_ai.request.stream",
    "temperature": "gen_ai.request.temperature",
    "run_id": "gen_ai.conversation.id",
}

_Key = tuple[str | None, str, Any]


def _scalar(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None if value is None else str(value)


class _Open:
    """A started span, the context token that made it current, and its metric basics."""

    __slots__ = ("attrs", "span", "start", "token")

    def __init__(self, span: Any, token: Any, start: float, attrs: dict[str, Any]) -> None:
        self.span = span
        self.token = token
        self.start = start
        self.attrs = attrs


class OTelExporter:
    """Turns Session events into OpenTelemetry spans and GenAI client metrics.

    Spans, named and shaped as the GenAI semantic conventions ask:

    - ``invoke_agent {name}`` for each agent run (``AGENT_START`` to ``AGENT_FINISH``);
    - ``chat {model}`` (kind CLIENT) for each model call, with ``gen_ai.operation.name``,
      ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
      ``gen_ai.response.finish_reasons`` and the token counts (cache reads and writes
      included) as attributes of their own;
    - ``execute_tool {tool}`` for each tool call;
    - ``step {name}`` for each Plan step.

    Each span is made current while it is open, so spans of an HTTP or SDK
    instrumentation nest under the model call, and an agent run inside a Plan step nests
    under the step. Failures set ``error.type`` and an ERROR status. Prompts, answers and
    tool arguments/results are recorded only when ``record_content=True`` or the
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` environment variable is
    ``true``. With a meter, ``gen_ai.client.token.usage`` and
    ``gen_ai.client.operation.duration`` histograms are recorded per model call.

    Args:
        tracer: A tracer to use; default ``opentelemetry.trace.get_tracer("stepstone")``
            (configure a TracerProvider as usual).
        tracer_provider: Take the tracer from this provider instead.
        meter_provider: Take the meter from this provider (default: the global one).
        record_content: Record prompts, answers and tool arguments/results (None: the
            environment variable decides).

    Raises:
        MissingExtraError: when ``opentelemetry-api`` is not installed.
    """

    def __init__(
        self,
        tracer: Any = None,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        record_content: bool | None = None,
    ) -> None:
        try:
            from opentelemetry import context, metrics, trace
        except ImportError as exc:  # pragma: no cover - the dev venv has it
            raise MissingExtraError("opentelemetry-api", "otel") from exc
        self._trace = trace
        self._context = context
        if tracer is None:
            tracer = (
                tracer_provider.get_tracer("stepstone")
                if tracer_provider is not None
                else trace.get_tracer("stepstone")
            )
        self.tracer = tracer
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("stepstone")
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
        )
        if record_content is None:
            record_content = os.environ.get(CONTENT_ENV_VAR, "").strip().lower() == "true"
        self.record_content = record_content
        self._spans: dict[_Key, _Open] = {}
        self._lock = threading.Lock()

    # -- attributes ------------------------------------------------------------------------

    def _attributes(self, payload: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in payload.items():
            if key in _CONTENT:
                if self.record_content and value is not None:
                    out[_CONTENT[key]] = str(value)
                continue
            name = _COMMON.get(key)
            if name is None:
                continue
            scalar = _scalar(value)
            if scalar is not None:
                out[name] = scalar
        return out

    @staticmethod
    def _provider(payload: dict[str, Any]) -> dict[str, Any]:
        provider = payload.get("provider")
        if not provider:
            return {}
        return {"gen_ai.provider.name": _PROVIDERS.get(str(provider), str(provider))}

    # -- spans -----------------------------------------------------------------------------

    def _start(
        self,
        key: _Key,
        name: str,
        event: Event,
        attrs: dict[str, Any],
        *,
        kind: str = "INTERNAL",
    ) -> None:
        trace = self._trace
        parent_ctx = None
        if trace.get_current_span().get_span_context().is_valid is False and key[1] != "run":
            # Not inside our own spans' context (events from another task): the run's span.
            run = self._spans.get((event.run_id, "run", None))
            if run is not None:
                parent_ctx = trace.set_span_in_context(run.span)
        span = self.tracer.start_span(
            name,
            context=parent_ctx,
            kind=getattr(trace.SpanKind, kind),
            attributes=attrs,
            start_time=int(event.timestamp * 1e9),
        )
        token = self._context.attach(trace.set_span_in_context(span))
        self._spans[key] = _Open(span, token, event.timestamp, attrs)

    def _end(
        self, key: _Key, event: Event, attrs: dict[str, Any], error: str | None = None
    ) -> _Open | None:
        opened = self._spans.pop(key, None)
        if opened is None:
            return None
        span = opened.span
        span.set_attributes(attrs)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", error)
            message = event.payload.get("message")
            span.set_status(Status(StatusCode.ERROR, str(message) if message else None))
        span.end(end_time=int(event.timestamp * 1e9))
        self._detach(opened.token)
        return opened

    def _detach(self, token: Any) -> None:
        """Undo the span's ``attach``; a span ended from another task's context (a band's
        failed branch, a stream closed by the garbage collector) has nothing to undo here."""
        if isinstance(token, contextvars.Token):
            try:
                token.var.reset(token)
            except ValueError:
                pass
            return
        self._context.detach(token)  # pragma: no cover - a non-contextvars runtime context

    # -- events ----------------------------------------------------------------------------

    def export(self, event: Event) -> None:
        """Open, close or annotate spans for ``event``."""
        handler = self._handlers.get(event.type, OTelExporter._other)
        with self._lock:
            handler(self, event)

    def _agent_start(self, event: Event) -> None:
        p, run = event.payload, event.run_id
        name = p.get("agent_name", "agent")
        attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            **self._provider(p),
            **self._attributes({"task": p.get("task")}),
        }
        if p.get("model"):
            attrs["gen_ai.request.model"] = str(p["model"])
        if run is not None:
            attrs["gen_ai.conversation.id"] = run
        self._start((run, "run", None), f"invoke_agent {name}", event, attrs)

    def _agent_finish(self, event: Event) -> None:
        p = event.payload
        attrs = self._attributes({k: p.get(k) for k in ("input_tokens", "output_tokens") if k in p})
        failed = p.get("ok") is False and not p.get("cancelled")
        error = str(p.get("error") or "_OTHER") if failed else None
        self._end((event.run_id, "run", None), event, attrs, error)

    def _model_request(self, event: Event) -> None:
        p = event.payload
        model = str(p.get("model", ""))
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            **self._provider(p),
            **self._attributes(p),
        }
        key = (event.run_id, "model", p.get("turn"))
        self._start(key, f"chat {model}".strip(), event, attrs, kind="CLIENT")

    def _model_event(self, event: Event) -> None:
        p = event.payload
        if "retry" not in p:
            self._model_response(event)
            return
        opened = self._spans.get((event.run_id, "model", p.get("turn")))
        if opened is not None:
            opened.span.add_event(
                "retry",
                attributes={
                    "error.type": str(p.get("error")),
                    "stepstone.retry": int(p["retry"]),
                    "stepstone.delay_s": float(p.get("delay") or 0.0),
                },
                timestamp=int(event.timestamp * 1e9),
            )

    def _tool_call(self, event: Event) -> None:
        p = event.payload
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.type": "function",
            **self._attributes(p),
        }
        key = (event.run_id, "tool", p.get("call_id"))
        self._start(key, f"execute_tool {p.get('tool')}", event, attrs)

    def _tool_end(self, event: Event) -> None:
        p = event.payload
        key = (event.run_id, "tool", p.get("call_id"))
        failed = event.type == EventType.TOOL_ERROR
        error = str(p.get("error") or "_OTHER") if failed else None
        if key not in self._spans:  # refused before it ran (max_tool_calls_per_turn)
            attrs = {"gen_ai.operation.name": "execute_tool", **self._attributes(p)}
            self._start(key, f"execute_tool {p.get('tool')}", event, attrs)
        self._end(key, event, self._attributes(p), error)

    def _step_start(self, event: Event) -> None:
        step = event.payload.get("step")
        key = (event.run_id, "step", step)
        self._start(key, f"step {step}", event, {"stepstone.step": str(step)})

    def _step_end(self, event: Event) -> None:
        p = event.payload
        failed = event.type == EventType.STEP_ERROR
        error = str(p.get("error") or "_OTHER") if failed else None
        self._end((event.run_id, "step", p.get("step")), event, {}, error)

    def _other(self, event: Event) -> None:
        """Any other event: an event on the run's span."""
        opened = self._spans.get((event.run_id, "run", None))
        if opened is not None:
            attrs = dict(self._attributes(event.payload))
            ts = int(event.timestamp * 1e9)
            opened.span.add_event(event.type.value, attributes=attrs, timestamp=ts)

    _handlers: ClassVar[dict[EventType, Callable[[OTelExporter, Event], None]]] = {
        EventType.AGENT_START: _agent_start,
        EventType.AGENT_FINISH: _agent_finish,
        EventType.MODEL_REQUEST: _model_request,
        EventType.MODEL_RESPONSE: _model_event,
        EventType.TOOL_CALL: _tool_call,
        EventType.TOOL_RESULT: _tool_end,
        EventType.TOOL_ERROR: _tool_end,
        EventType.STEP_START: _step_start,
        EventType.STEP_FINISH: _step_end,
        EventType.STEP_ERROR: _step_end,
    }

    def _model_response(self, event: Event) -> None:
        p = event.payload
        attrs = self._attributes(p)
        if p.get("model"):
            attrs["gen_ai.response.model"] = str(p["model"])
        if p.get("stop_reason"):
            attrs["gen_ai.response.finish_reasons"] = [str(p["stop_reason"])]
        error = str(p["error"]) if "error" in p else None
        opened = self._end((event.run_id, "model", p.get("turn")), event, attrs, error)
        if opened is None:
            return
        base = {
            k: v
            for k, v in opened.attrs.items()
            if k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")
        }
        if "gen_ai.response.model" in attrs:
            base["gen_ai.response.model"] = attrs["gen_ai.response.model"]
        duration = {**base, "error.type": error} if error else base
        self._duration.record(max(0.0, event.timestamp - opened.start), attributes=duration)
        for kind, key in (("input", "input_tokens"), ("output", "output_tokens")):
            if key in p:
                self._token_usage.record(
                    int(p[key]), attributes={**base, "gen_ai.token.type": kind}
                )

    def open_spans(self) -> int:
        """How many spans are started and not yet ended (0 after clean runs)."""
        with self._lock:
            return len(self._spans)
