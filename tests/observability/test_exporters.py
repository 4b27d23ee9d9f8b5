"""Console, JSON Lines and OpenTelemetry exporters fed by real runs on scripted models."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from stepstone import Agent, EventType, LLMEngine, Plan, Session, Step
from stepstone.observability import ConsoleExporter, JSONLExporter, OTelExporter, read_jsonl
from stepstone.providers import Usage
from stepstone.testing import FakeModel, Reply, call


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def broken() -> str:
    """Raises."""
    raise RuntimeError("nope")


def script() -> FakeModel:
    return FakeModel(
        [
            Reply(
                tool_calls=[call("add", a=1, b=2), call("broken")],
                usage=Usage(input_tokens=11, output_tokens=3),
            ),
            Reply(text="three", usage=Usage(input_tokens=20, output_tokens=1)),
        ],
        model_name="claude-sonnet-4-6",
    )


async def test_console_exporter_lines() -> None:
    out = io.StringIO()
    session = Session(exporters=[ConsoleExporter(out)])
    await Agent(engine=LLMEngine(script()), tools=[add, broken], name="calc", session=session).run(
        "q"
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == len(session.events) == 10
    assert "agent_start" in lines[0] and "agent_name=calc" in lines[0]
    tool_error = next(line for line in lines if "tool_error" in line)
    assert "tool=broken" in tool_error and "error=RuntimeError message=nope" in tool_error
    response = next(line for line in lines if "model_response" in line)
    assert "input_tokens=11" in response and "output_tokens=3" in response


async def test_console_exporter_filters_types() -> None:
    out = io.StringIO()
    exporter = ConsoleExporter(out, types={EventType.TOOL_CALL}, verbose=True)
    session = Session(exporters=[exporter])
    await Agent(engine=LLMEngine(script()), tools=[add, broken], session=session).run("q")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all("tool_call" in line for line in lines)
    assert "arguments=" in lines[0]  # verbose prints every field


async def test_jsonl_exporter_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with JSONLExporter(path) as exporter:
        session = Session(exporters=[exporter])
        env = await Agent(engine=LLMEngine(script()), tools=[add, broken], session=session).run("q")
    rows = read_jsonl(path)
    assert [r["type"] for r in rows] == [e.type.value for e in session.events]
    assert {r["run_id"] for r in rows} == {env.metadata["run_id"]}
    finish = rows[-1]
    assert finish["type"] == "agent_finish"
    assert finish["payload"]["input_tokens"] == 31
    # appends, and reopens after close
    exporter.export(session.events[0])
    exporter.close()
    assert len(read_jsonl(path)) == len(rows) + 1


@pytest.fixture
def spans() -> tuple[OTelExporter, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return OTelExporter(tracer_provider=provider), memory


async def test_otel_spans_for_a_run(spans: tuple[OTelExporter, InMemorySpanExporter]) -> None:
    exporter, memory = spans
    session = Session(exporters=[exporter])
    await Agent(engine=LLMEngine(script()), tools=[add, broken], name="calc", session=session).run(
        "q"
    )
    finished = {s.name: s for s in memory.get_finished_spans()}
    assert set(finished) == {
        "invoke_agent calc",
        "chat claude-sonnet-4-6",
        "execute_tool add",
        "execute_tool broken",
    }
    assert len(memory.get_finished_spans()) == 5  # two model calls
    run = finished["invoke_agent calc"]
    for name in ("chat claude-sonnet-4-6", "execute_tool add", "execute_tool broken"):
        assert finished[name].parent is not None
        assert finished[name].parent.span_id == run.context.span_id
    chat = next(s for s in memory.get_finished_spans() if s.name.startswith("chat"))
    assert chat.attributes["gen_ai.usage.input_tokens"] == 11
    assert chat.attributes["gen_ai.request.model"] == "claude-sonnet-4-6"
    assert finished["execute_tool broken"].status.status_code is StatusCode.ERROR
    assert finished["execute_tool add"].status.status_code is StatusCode.UNSET
    assert exporter.open_spans() == 0


async def test_otel_plan_steps_and_failed_runs(
    spans: tuple[OTelExporter, InMemorySpanExporter],
) -> None:
    exporter, memory = spans
    session = Session(exporters=[exporter])
    plan = Plan(Step(lambda task: task.upper(), name="shout"))
    await Agent(engine=plan, session=session).run("hi")
    assert "step shout" in [s.name for s in memory.get_finished_spans()]
    memory.clear()
    failing = Agent(engine=LLMEngine(FakeModel([ValueError("bad")])), session=session)
    env = await failing.run("q")
    assert not env.ok
    run = next(s for s in memory.get_finished_spans() if s.name.startswith("invoke_agent"))
    assert run.status.status_code is StatusCode.ERROR
    assert exporter.open_spans() == 0
