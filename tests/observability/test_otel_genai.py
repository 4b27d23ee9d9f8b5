"""OpenTelemetry output checked against the GenAI semantic conventions: span names, kinds,
the span tree (Plan step > agent > chat / execute_tool > the SDK's own spans), attribute
names, content kept out unless asked for, and the client metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from stepstone import Agent, LLMEngine, Plan, Session, Step
from stepstone.observability import OTelExporter
from stepstone.providers import AnthropicProvider, Usage
from stepstone.testing import (
    AnthropicDialect,
    FakeModel,
    LoopbackServer,
    Reply,
    block_model_requests,
    call,
)

PROVIDER = TracerProvider()
MEMORY = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(MEMORY))
TRACER = PROVIDER.get_tracer("user-code")


def lookup(city: str) -> str:
    """Look a city up."""
    with TRACER.start_as_current_span("user lookup"):  # nests under execute_tool
        return f"{city}: sunny"


@pytest.fixture
def otel() -> Iterator[tuple[Session, InMemoryMetricReader, OTelExporter]]:
    MEMORY.clear()
    reader = InMemoryMetricReader()
    exporter = OTelExporter(
        tracer_provider=PROVIDER, meter_provider=MeterProvider(metric_readers=[reader])
    )
    with block_model_requests():
        yield Session(exporters=[exporter]), reader, exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def parent_of(span: ReadableSpan, spans: dict[str, ReadableSpan]) -> str | None:
    if span.parent is None:
        return None
    return next(n for n, s in spans.items() if s.context.span_id == span.parent.span_id)


async def test_span_tree_and_attributes_through_the_sdk(
    otel: tuple[Session, InMemoryMetricReader, OTelExporter],
) -> None:  # guarantee 214
    session, reader, exporter = otel
    with LoopbackServer(AnthropicDialect(), model="claude-sonnet-4-6") as server:
        server.push(
            Reply(
                tool_calls=[call("lookup", city="Paris")],
                usage=Usage(input_tokens=1200, cache_read_tokens=1000, output_tokens=20),
            ),
            Reply(text="Sunny in Paris.", usage=Usage(input_tokens=1300, output_tokens=5)),
        )
        engine = LLMEngine(
            "claude-sonnet-4-6", provider=AnthropicProvider(base_url=server.base_url, api_key="k")
        )
        agent = Agent(engine=engine, tools=[lookup], name="weather", session=session)
        plan = Plan(Step(agent, name="forecast"))
        env = await Agent(engine=plan, session=session).run("Weather in Paris?")
        await engine.aclose()
    assert env.ok, env.error
    spans = by_name(MEMORY.get_finished_spans())
    chats = [s for s in MEMORY.get_finished_spans() if s.name == "chat claude-sonnet-4-6"]
    assert len(chats) == 2
    assert parent_of(spans["invoke_agent weather"], spans) == "step forecast"
    assert parent_of(chats[0], spans) == "invoke_agent weather"
    assert parent_of(spans["execute_tool lookup"], spans) == "invoke_agent weather"
    assert parent_of(spans["user lookup"], spans) == "execute_tool lookup"
    assert chats[0].kind is SpanKind.CLIENT
    agent_attrs = spans["invoke_agent weather"].attributes or {}
    assert agent_attrs["gen_ai.operation.name"] == "invoke_agent"
    assert agent_attrs["gen_ai.agent.name"] == "weather"
    assert agent_attrs["gen_ai.provider.name"] == "anthropic"
    chat: Any = chats[0].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "anthropic"
    assert "gen_ai.system" not in chat
    assert chat["gen_ai.request.model"] == "claude-sonnet-4-6"
    assert chat["gen_ai.response.model"] == "claude-sonnet-4-6"
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chat["gen_ai.usage.input_tokens"] == 1200
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert chat["gen_ai.usage.output_tokens"] == 20
    tool: Any = spans["execute_tool lookup"].attributes
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "lookup"
    # content is opt-in: no prompt, no tool arguments, no results
    everything = str([dict(s.attributes or {}) for s in MEMORY.get_finished_spans()])
    assert "Paris" not in everything and "sunny" not in everything
    assert exporter.open_spans() == 0
    # the GenAI client metrics
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    usage = metrics["gen_ai.client.token.usage"]
    totals = {dict(p.attributes or {})["gen_ai.token.type"]: p.sum for p in usage.data.data_points}
    assert totals == {"input": 2500, "output": 25}
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    assert sum(p.count for p in duration.data.data_points) == 2


async def test_content_is_recorded_when_asked(
    otel: tuple[Session, InMemoryMetricReader, OTelExporter],
) -> None:
    session, _, _ = otel
    exporter = OTelExporter(tracer_provider=PROVIDER, record_content=True)
    session.exporters = [exporter]
    model = FakeModel([call("lookup", city="Oslo"), "done"])
    await Agent(engine=LLMEngine(model), tools=[lookup], session=session).run("Weather?")
    spans = by_name(MEMORY.get_finished_spans())
    tool: Any = spans["execute_tool lookup"].attributes
    assert "Oslo" in tool["gen_ai.tool.call.arguments"]
    assert tool["gen_ai.tool.call.result"] == "Oslo: sunny"
    agent: Any = spans["invoke_agent agent"].attributes
    assert agent["gen_ai.input.messages"] == "Weather?"


async def test_errors_set_error_type(
    otel: tuple[Session, InMemoryMetricReader, OTelExporter],
) -> None:
    session, _, exporter = otel
    model = FakeModel([Reply(text="no", stop_reason="refusal")])
    env = await Agent(engine=LLMEngine(model), session=session).run("q")
    assert not env.ok
    spans = by_name(MEMORY.get_finished_spans())
    agent = spans["invoke_agent agent"]
    assert agent.status.status_code is StatusCode.ERROR
    assert (agent.attributes or {})["error.type"] == "ModelRefusalError"
    assert not any(k.startswith("stepstone.error") for k in agent.attributes or {})
    assert exporter.open_spans() == 0
    assert not trace.get_current_span().get_span_context().is_valid  # nothing left current
