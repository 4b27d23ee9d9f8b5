"""examples/provider_outcomes.py runs offline through the three SDKs and prints each outcome."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "provider_outcomes.py"


def test_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
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
