"""LLMEngine(stream_to=...): a durable run's model text written to its stream as it comes,
read live from another thread (guarantee 521)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import Agent, LLMEngine, Plan, RunHandle, Runner, Step, Store
from stepstone.exceptions import ConfigurationTypeError
from stepstone.testing import FakeModel, Reply

WORDS = ["The ", "answer ", "is ", "forty", "-two", "."]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(db=tmp_path / "tok.sqlite")
    else:
        s = Store(url=request.getfixturevalue("pg_url"))
        s.setup()
        for key in s.keys():
            s.delete(key)
    yield s
    s.close()


def _model() -> FakeModel:
    return FakeModel([Reply(text="".join(WORDS), chunks=WORDS, chunk_delay=0.15)])


def test_a_plan_steps_agent_streams_its_answer_to_the_plans_stream(store: Store) -> None:
    # guarantee 521
    agent = Agent(engine=LLMEngine(_model(), stream_to="answer"))
    plan = Plan(Step(agent, name="ask"), store=store, checkpoint_key="ask-run")
    seen: list[tuple[float, str]] = []
    finished: list[float] = []

    def read() -> None:
        for _, value in RunHandle(store, key="ask-run").read_stream("answer", timeout=60):
            seen.append((time.monotonic(), value["text"]))

    reader = threading.Thread(target=read)
    reader.start()
    env = Agent(engine=plan)("what is it?")
    finished.append(time.monotonic())
    reader.join(60)
    assert env.ok and env.payload == "".join(WORDS)
    assert "".join(text for _, text in seen) == "".join(WORDS)
    assert len(seen) >= 3  # a few tokens at a time, not the whole answer at the end
    assert seen[0][0] < finished[0] - 0.3  # read live, while the model was still answering


def test_a_runner_run_streams_under_its_run_id_and_a_replay_writes_nothing(
    store: Store,
) -> None:
    # guarantee 521
    engine = LLMEngine(_model(), stream_to="answer")
    runner = Runner(store=store)
    result = runner.run_sync(Agent(engine=engine), user_message="hi", run_id="chat-1")
    assert result.final_text == "".join(WORDS)
    items = list(RunHandle(store, key="chat-1").read_stream("answer", follow=False))
    assert "".join(v["text"] for _, v in items) == "".join(WORDS)
    assert {item.attempt for item in items} == {1}
    again = runner.run_sync(Agent(engine=engine), user_message="hi", run_id="chat-1")
    assert again.final_text == result.final_text  # its stored result: no model call
    assert len(list(RunHandle(store, key="chat-1").read_stream("answer", follow=False))) == len(
        items
    )


def test_stream_to_must_name_a_stream() -> None:
    # guarantee 521
    with pytest.raises(ConfigurationTypeError, match="stream_to"):
        LLMEngine("claude-sonnet-4-6", stream_to="")
