"""The Plan examples (ETL crash/resume, fork fan-out, inspect a failure) run as users run
them (guarantee 18, 23, 28, 34)."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines


def test_etl_crash_resume(tmp_path: Path) -> None:
    out = example_lines("etl_crash_resume.py", tmp_path=tmp_path, timeout=120)
    assert "run 1 crashed: status='failed' next_step='validate'" in out
    assert "run 2 resumed: ran ['validate', 'load'] -> 'loaded 2 rows'" in out
    assert "run 3 cached: ran [], kv keys ['clean', 'loaded', 'raw', 'verdict']" in out
    assert "  verdict: {'rejected_rows': [2], 'accepted_rows': 2}" in out


def test_backtest_fork(tmp_path: Path) -> None:
    out = example_lines("backtest_fork.py", tmp_path=tmp_path, timeout=120)
    scores = [line.split()[0] for line in out[:4]]
    assert scores == ["AAPL:", "GOOG:", "MSFT:", "AMZN:"]
    keys = {line.split()[3] for line in out[:4]}
    assert len(keys) == 4 and all(k.startswith("backtest:") for k in keys)
    assert "fork checkpoints: 4" in out
    assert out[-1] == "pruned 4 finished forks; keys left: []"


def test_inspect_failure(tmp_path: Path) -> None:
    out = example_lines("inspect_failure.py", tmp_path=tmp_path, timeout=120)
    assert out[1:4] == ["failed", "validate", "['extract', 'transform']"]
    assert out[4] == "[{'id': '1', 'amount': '10'}, {'id': '2', 'amount': 'oops'}]"


def test_etl_with_llm_agents_offline(tmp_path: Path) -> None:
    # The ETL example with four LLM agents. Each scripted model holds exactly one answer,
    # so a re-run of extract or transform after the crash would exhaust its script and fail.
    out = example_lines("etl_llm_agents.py", "--offline", tmp_path=tmp_path, timeout=120)
    assert out[0] == "mode: offline (scripted models)"
    assert out[1] == (
        "run 1 crashed: status='failed' next_step='validate' completed=['extract', 'transform']"
    )
    assert out[2] == "run 2 resumed: ok=True payload='loaded 2 rows'"
    assert out[3] == "run 3 cached: kv keys ['clean', 'loaded', 'raw', 'verdict']"
    assert out[4] == "  verdict: {'rejected_rows': [2], 'accepted_rows': 2}"
