"""examples/provider_outcomes.py runs offline through the three SDKs and prints each outcome."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_example_runs(tmp_path: Path) -> None:
    lines = example_lines("provider_outcomes.py", tmp_path=tmp_path, timeout=180)
    for name in ("anthropic", "openai", "google"):
        mine = [line.split(": ", 1)[1] for line in lines if line.startswith(name + ":")]
        assert mine == [
            "refusal -> ModelRefusalError",
            "cut off, continued -> 'Forty two.'",
            "overloaded before any text -> 'streamed after a retry'",
            "rate limited for an hour -> retry in ~60 min, not slept",
            "budget -> UsageLimitExceeded",
            # refusal 1, length 2, stream 2, rate limit 1, budget 2
            "requests the server saw: 8",
        ], mine
