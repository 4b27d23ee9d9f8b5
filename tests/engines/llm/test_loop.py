"""The tool-calling loop on scripted models (guarantee 78, 79, 80)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from stepstone import Agent, Envelope, EventType, LLMEngine, Session, Tool
from stepstone.engines.llm import EffectKey, current_call_key
from stepstone.providers import ModelRequest, ModelResponse, ToolCall, Usage
from stepstone.testing import FakeModel, FunctionModel, Reply, TransientModelError, call


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def fail(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(f"tool broke: {reason}")


def results_of(model: FakeModel, turn: int) -> list[tuple[str, bool]]:
    return [(r.content, r.is_error) for r in model.requests[turn].messages[-1].tool_results]


async def test_tool_schema_from_hints_and_docstring() -> None:
    model = FakeModel(["ok"])
    await Agent(engine=LLMEngine(model), tools=[add]).run("q")
    (definition,) = model.requests[0].tools
    assert definition.name == "add"
    assert definition.description == "Add two integers."
    props = definition.parameters["properties"]
    assert props["a"]["type"] == "integer"
    assert props["a"]["description"] == "The first addend."
    assert definition.parameters["required"] == ["a", "b"]


async def test_tool_choice_any_forces_first_turn_only() -> None:  # guarantee 78
    model = FakeModel([call("add", a=1, b=2), call("add", a=3, b=4), "done"])
    env = await Agent(engine=LLMEngine(model, tool_choice="any"), tools=[add]).run("q")
    assert env.payload == "done"
    assert [r.tool_choice for r in model.requests] == ["required", "auto", "auto"]


async def test_tool_choice_any_without_tools_stays_auto() -> None:  # guarantee 78
    model = FakeModel(["plain"])
    await Agent(engine=LLMEngine(model, tool_choice="any")).run("q")
    assert model.requests[0].tool_choice == "auto"


async def test_same_turn_calls_run_concurrently_in_call_order() -> None:  # guarantee 79
    running = 0
    peak = 0

    async def slow(n: int, delay: float) -> int:
        """Sleep then echo."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(delay)
        running -= 1
        return n

    # later calls finish first; results must still come back in call order
    calls = [call("slow", n=i, delay=0.05 - i * 0.01) for i in range(5)]
    model = FakeModel([calls, "done"])
    env = await Agent(engine=LLMEngine(model), tools=[slow]).run("q")
    assert env.ok, env.error
    assert results_of(model, 1) == [(str(i), False) for i in range(5)]
    assert peak == 5  # all five ran at once (a wall-time bound would only add load noise)


async def test_max_parallel_tools_caps_concurrency() -> None:  # guarantee 79
    running = 0
    peak = 0

    async def work(n: int) -> int:
        """Work."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return n

    model = FakeModel([[call("work", n=i) for i in range(7)], "done"])
    await Agent(engine=LLMEngine(model, max_parallel_tools=2), tools=[work]).run("q")
    assert peak == 2
    assert [c for c, _ in results_of(model, 1)] == [str(i) for i in range(7)]


async def test_sync_tools_run_in_threads_concurrently() -> None:  # guarantee 79
    barrier = threading.Barrier(3, timeout=2)

    def meet(n: int) -> int:
        """Blocks until three calls meet (only possible when they run concurrently)."""
        barrier.wait()
        return n

    model = FakeModel([[call("meet", n=i) for i in range(3)], "done"])
    env = await Agent(engine=LLMEngine(model), tools=[meet]).run("q")
    assert env.ok
    assert results_of(model, 1) == [("0", False), ("1", False), ("2", False)]


async def test_max_tool_calls_per_turn_refuses_extras() -> None:  # guarantee 79
    ran: list[int] = []

    def note(n: int) -> int:
        """Record n."""
        ran.append(n)
        return n

    model = FakeModel([[call("note", n=i) for i in range(3)], "done"])
    session = Session()
    env = await Agent(
        engine=LLMEngine(model, max_tool_calls_per_turn=1), tools=[note], session=session
    ).run("q")
    assert env.payload == "done"
    assert ran == [0]
    res = results_of(model, 1)
    assert res[0] == ("0", False)
    for content, is_error in res[1:]:
        assert is_error
        assert "only 1 tool call(s) per turn are allowed" in content
    assert len(session.of_type(EventType.TOOL_ERROR)) == 2


async def test_tool_timeout_is_reported_and_run_continues() -> None:  # guarantee 80
    async def sleepy() -> str:
        """Sleeps too long."""
        await asyncio.sleep(5)
        return "never"

    model = FakeModel([[call("sleepy"), call("add", a=1, b=1)], "recovered"])
    session = Session()
    start = time.perf_counter()
    env = await Agent(
        engine=LLMEngine(model, tool_timeout=0.05), tools=[sleepy, add], session=session
    ).run("q")
    assert time.perf_counter() - start < 1
    assert env.ok and env.payload == "recovered"
    (timeout_content, timeout_error), (sum_content, sum_error) = results_of(model, 1)
    assert timeout_error and "ToolTimeoutError" in timeout_content
    assert "tool_timeout=0.05" in timeout_content
    assert (sum_content, sum_error) == ("2", False)
    (event,) = session.of_type(EventType.TOOL_ERROR)
    assert event.payload["error"] == "ToolTimeoutError"


async def test_raising_tool_becomes_is_error_result() -> None:
    model = FakeModel([call("fail", reason="disk full"), "sorry"])
    env = await Agent(engine=LLMEngine(model), tools=[fail]).run("q")
    assert env.payload == "sorry"
    ((content, is_error),) = results_of(model, 1)
    assert is_error and "RuntimeError" in content and "disk full" in content


async def test_invalid_and_unknown_tool_calls_become_is_error_results() -> None:
    bad_json = ToolCall(id="c1", name="add", raw_arguments='{"a": 1,')
    wrong_type = call("add", a="one", b=2)
    missing = call("add", a=1)
    unknown = call("nope", x=1)
    model = FakeModel([[bad_json, wrong_type, missing, unknown], "done"])
    env = await Agent(engine=LLMEngine(model), tools=[add]).run("q")
    assert env.payload == "done"
    res = results_of(model, 1)
    assert all(is_error for _, is_error in res)
    assert "must be a JSON object" in res[0][0]
    assert "InvalidArguments" in res[1][0] and "a:" in res[1][0]
    assert "InvalidArguments" in res[2][0] and "b: Field required" in res[2][0]
    assert "no tool named 'nope'" in res[3][0] and "available: add" in res[3][0]


async def test_arguments_the_tool_does_not_take_are_refused_not_dropped() -> None:
    # guarantee 79
    seen: list[Any] = []

    def lookup(city: str) -> str:
        """Look a city up."""
        seen.append(city)
        return city

    def tagged(name: str, **tags: str) -> str:
        """Takes any other name."""
        seen.append((name, tags))
        return "tagged"

    def scaled(x: int, /, factor: int = 2) -> int:
        """Positional-only first parameter."""
        seen.append((x, factor))
        return x * factor

    model = FakeModel(
        [
            [
                call("lookup", city="Oslo", country="NO"),
                call("tagged", name="n", colour="red"),
                call("scaled", x=4, factor=3),
            ],
            "done",
        ]
    )
    await Agent(engine=LLMEngine(model), tools=[lookup, tagged, scaled]).run("q")
    (refused, is_error), (tagged_out, _), (scaled_out, scaled_error) = results_of(model, 1)
    assert is_error and "InvalidArguments" in refused and "country" in refused
    assert (tagged_out, scaled_out, scaled_error) == ("tagged", "12", False)
    assert sorted(map(repr, seen)) == ["('n', {'colour': 'red'})", "(4, 3)"]  # no lookup


async def test_arguments_are_coerced_by_the_schema() -> None:
    seen: list[Any] = []

    def typed(n: int, flag: bool = False) -> str:
        """Typed."""
        seen.append((n, flag))
        return "ok"

    model = FakeModel([call("typed", n="7", flag="true"), "done"])
    await Agent(engine=LLMEngine(model), tools=[typed]).run("q")
    assert seen == [(7, True)]


async def test_agent_as_tool() -> None:
    inner_model = FakeModel(["inner answer"])
    inner = Agent(engine=LLMEngine(inner_model), name="helper", description="Helps.")
    outer_model = FakeModel([call("helper", task="sub task"), "outer done"])
    env = await Agent(engine=LLMEngine(outer_model), tools=[inner.as_tool()]).run("q")
    assert env.payload == "outer done"
    assert inner_model.requests[0].messages[0].text == "sub task"
    assert results_of(outer_model, 1) == [("inner answer", False)]


async def test_max_turns_exceeded_is_an_error_envelope() -> None:
    model = FakeModel([call("add", a=1, b=1)], repeat_last=True)
    env = await Agent(engine=LLMEngine(model, max_turns=3), tools=[add]).run("q")
    assert env.error is not None
    assert env.error.type == "MaxTurnsExceeded"
    assert "max_turns=3" in env.error.message
    assert len(model.requests) == 3
    assert env.metadata["turns"] == 3 and env.metadata["tool_calls"] == 3


async def test_system_and_context_reach_the_model() -> None:
    model = FakeModel(["ok"])
    agent = Agent(engine=LLMEngine(model, system="Be terse.", temperature=0.3))
    await agent.run("question", context="Background facts.")
    req = model.requests[0]
    assert req.system == "Be terse.\n\nBackground facts."
    assert req.temperature == 0.3
    assert req.messages[0].text == "question"


async def test_metadata_usage_cost_latency() -> None:
    model = FakeModel(
        [
            Reply(
                tool_calls=[call("add", a=1, b=2)], usage=Usage(input_tokens=100, output_tokens=10)
            ),
            Reply(text="3", usage=Usage(input_tokens=120, output_tokens=5)),
        ],
        model_name="claude-sonnet-4-6",
    )
    env = await Agent(engine=LLMEngine(model), tools=[add]).run("q")
    md = env.metadata
    assert (md["input_tokens"], md["output_tokens"]) == (220, 15)
    assert md["usage"]["input_tokens"] == 220
    assert md["model"] == "claude-sonnet-4-6" and md["provider"] == "test"
    assert md["cost_usd"] == pytest.approx((220 * 3 + 15 * 15) / 1e6)
    assert md["latency_ms"] > 0
    assert md["turns"] == 2


async def test_events_on_the_session() -> None:
    session = Session()
    model = FakeModel([call("add", a=1, b=2), "3"])
    await Agent(engine=LLMEngine(model), tools=[add], name="calc", session=session).run("q")
    kinds = [e.type for e in session.events]
    assert kinds == [
        EventType.AGENT_START,
        EventType.MODEL_REQUEST,
        EventType.MODEL_RESPONSE,
        EventType.TOOL_CALL,
        EventType.TOOL_RESULT,
        EventType.MODEL_REQUEST,
        EventType.MODEL_RESPONSE,
        EventType.AGENT_FINISH,
    ]
    assert all(e.payload["agent_name"] == "calc" for e in session.events)
    assert len({e.run_id for e in session.events}) == 1
    assert session.of_type(EventType.TOOL_RESULT)[0].payload["result"] == "3"
    assert session.of_type(EventType.AGENT_FINISH)[0].payload["ok"] is True


async def test_retries_with_backoff_then_success() -> None:  # max_retries / retry_delay
    model = FakeModel([TransientModelError("busy"), TransientModelError("busy"), "ok"])
    start = time.perf_counter()
    env = await Agent(engine=LLMEngine(model, retry_delay=0.02)).run("q")
    elapsed = time.perf_counter() - start
    assert env.payload == "ok"
    # 0.02 * (1 + 2) with +-10% jitter
    assert 0.054 <= elapsed < 0.5


async def test_retries_exhausted_returns_error() -> None:
    model = FakeModel([TransientModelError("busy")] * 3)
    env = await Agent(engine=LLMEngine(model, max_retries=2, retry_delay=0.001)).run("q")
    assert env.error is not None and env.error.type == "TransientModelError"
    assert len(model.requests) == 3


async def test_retry_after_wins_over_backoff() -> None:
    model = FakeModel([TransientModelError("429", retry_after=0.12), "ok"])
    start = time.perf_counter()
    env = await Agent(engine=LLMEngine(model, retry_delay=0.001)).run("q")
    assert env.payload == "ok"
    assert time.perf_counter() - start >= 0.12


async def test_max_retries_zero_disables_retries() -> None:
    model = FakeModel([TransientModelError("busy"), "never"])
    env = await Agent(engine=LLMEngine(model, max_retries=0)).run("q")
    assert env.error is not None and len(model.requests) == 1


async def test_request_timeout_is_retried_then_reported() -> None:
    model = FakeModel([Reply(text="slow", delay=5)] * 2)
    env = await Agent(
        engine=LLMEngine(model, request_timeout=0.05, max_retries=1, retry_delay=0.001)
    ).run("q")
    assert env.error is not None and env.error.type == "TimeoutError"
    assert "request_timeout=0.05" in env.error.message
    assert len(model.requests) == 2
    assert model.cancelled == 2


class Ticket(BaseModel):
    kind: Literal["bug", "feature"]
    title: str


async def test_structured_output_returns_a_validated_model() -> None:
    model = FakeModel(['```json\n{"kind": "bug", "title": "crash"}\n```'])
    env = await Agent(engine=LLMEngine(model), output=Ticket).run("triage")
    assert env.payload == Ticket(kind="bug", title="crash")
    req = model.requests[0]
    assert req.output_schema is not None and req.output_schema["properties"]["kind"]["enum"] == [
        "bug",
        "feature",
    ]
    assert req.output_name == "Ticket"


async def test_structured_output_invalid_answer_is_sent_back() -> None:
    model = FakeModel(['{"kind": "question", "title": "?"}', {"kind": "feature", "title": "x"}])
    env = await Agent(engine=LLMEngine(model), output=Ticket).run("triage")
    assert env.payload == Ticket(kind="feature", title="x")
    feedback = model.requests[1].messages[-1]
    assert feedback.role == "user" and "did not match the required JSON schema" in feedback.text
    assert "kind" in feedback.text


async def test_structured_output_per_call_and_non_model_types() -> None:
    model = FakeModel(["[1, 2, 3]", '{"kind": "bug", "title": "t"}'])
    agent = Agent(engine=LLMEngine(model))
    assert (await agent.run("q", output=list[int])).payload == [1, 2, 3]
    assert (await agent.run("q", output=Ticket)).payload == Ticket(kind="bug", title="t")


async def test_structured_output_never_valid_ends_with_max_turns() -> None:
    model = FakeModel(["not json"], repeat_last=True)
    env = await Agent(engine=LLMEngine(model, max_turns=2), output=Ticket).run("q")
    assert env.error is not None and env.error.type == "MaxTurnsExceeded"


async def test_function_model_sees_the_whole_conversation() -> None:
    def fn(request: ModelRequest) -> object:
        if len(request.messages) == 1:
            return call("add", a=2, b=2)
        assistant, tool_msg = request.messages[1], request.messages[2]
        assert assistant.tool_calls[0].name == "add"
        return f"sum={tool_msg.tool_results[0].content}"

    env = await Agent(engine=LLMEngine(FunctionModel(fn)), tools=[add]).run("q")
    assert env.payload == "sum=4"


class RecordingEffects:
    """An EffectHandler that records each call's key (what a journal would persist)."""

    def __init__(self) -> None:
        self.keys: list[EffectKey] = []
        self.idempotency: list[str | None] = []

    async def model_call(
        self, key: EffectKey, invoke: Callable[[], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        self.keys.append(key)
        return await invoke()

    async def tool_call(self, key: EffectKey, invoke: Callable[[], Awaitable[Any]]) -> Any:
        self.keys.append(key)
        return await invoke()


async def test_effect_seam_sees_every_model_and_tool_call() -> None:
    seen_keys: list[str | None] = []

    def keyed(n: int) -> int:
        """Reads its idempotency key."""
        key = current_call_key()
        seen_keys.append(key.idempotency_key if key else None)
        return n

    engine = LLMEngine(FakeModel([[call("keyed", n=1), call("keyed", n=2)], "done"]))
    effects = RecordingEffects()
    engine.effects = effects
    await Agent(engine=engine, tools=[keyed]).run("q")
    summary = [(k.kind, k.turn, k.index, k.name) for k in effects.keys]
    assert summary == [
        ("model", 0, 0, "fake-model"),
        ("tool", 0, 0, "keyed"),
        ("tool", 0, 1, "keyed"),
        ("model", 1, 0, "fake-model"),
    ]
    run_id = effects.keys[0].run_id
    assert sorted(seen_keys) == [f"{run_id}:tool:0:0", f"{run_id}:tool:0:1"]
    tool_key = effects.keys[1]
    assert tool_key.input == {"n": 1}
    assert len(tool_key.input_hash()) == 64
    assert tool_key.input_hash() != effects.keys[2].input_hash()


async def test_a_replaying_effect_handler_skips_execution() -> None:
    calls: list[int] = []

    def side_effect(n: int) -> int:
        """Has a side effect."""
        calls.append(n)
        return n

    class Replay(RecordingEffects):
        async def tool_call(self, key: EffectKey, invoke: Callable[[], Awaitable[Any]]) -> Any:
            return "recorded"

    engine = LLMEngine(FakeModel([call("side_effect", n=1), "done"]))
    engine.effects = Replay()
    model = engine.get_provider()
    await Agent(engine=engine, tools=[side_effect]).run("q")
    assert calls == []
    assert isinstance(model, FakeModel)
    assert results_of(model, 1) == [("recorded", False)]


def test_sync_call_and_envelope_input() -> None:
    model = FakeModel(["hello"])
    agent = Agent(engine=LLMEngine(model))
    env = agent(Envelope(task=None, payload="from payload"))
    assert env.payload == "hello"
    assert model.requests[0].messages[0].text == "from payload"


async def test_tools_can_be_tool_objects() -> None:
    t = Tool.from_function(add, name="plus", description="Adds.")
    model = FakeModel([call("plus", a=1, b=1), "2"])
    env = await Agent(engine=LLMEngine(model), tools=[t]).run("q")
    assert env.payload == "2"
    assert model.requests[0].tools[0].description == "Adds."
