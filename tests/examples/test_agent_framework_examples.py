"""examples/pydantic_ai_support.py and examples/openai_agents_support.py: an agent of each
framework killed inside a tool resumes; no model request is sent twice, the refund is made
once."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_pydantic_ai_support_example(tmp_path: Path) -> None:
    # guarantee 530, 534
    lines = example_lines("pydantic_ai_support.py", tmp_path=tmp_path)
    assert lines == [
        "first process: killed by signal 9 inside the refund tool",
        "result: Order 42 is refunded.",
        "model requests: 3 (3 answers, none asked twice)",
        "lookup ran: 1 time(s)",
        "refund tool ran: 2 time(s) (cut short, then run again)",
        "refunds made: 1",
    ]


def test_openai_agents_support_example(tmp_path: Path) -> None:
    # guarantee 534, 540
    lines = example_lines("openai_agents_support.py", tmp_path=tmp_path)
    assert lines == [
        "first process: killed by signal 9 inside the refund tool",
        "result: Order 42 is refunded. (answered by billing)",
        "model requests: 3 before the kill, 1 after",
        "lookup ran: 1 time(s)",
        "refund tool ran: 2 time(s) (cut short, then run again)",
        "refunds made: 1",
    ]
