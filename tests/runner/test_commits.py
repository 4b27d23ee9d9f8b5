"""When a durable agent run commits: every model answer is committed before the next model
request, also for a turn that runs no tool (checked by SIGKILLing a real process at the
next request, on the OpenAI SDK against a loopback server, and resuming in a new one)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepstone.providers import ToolCall
from stepstone.testing import Hang, LoopbackServer, OpenAIDialect, Reply, call

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("agent_worker.py")


def spawn(mode: str, db: Path, server: LoopbackServer, **opts: Any) -> subprocess.Popen[str]:
    """agent_worker.py in a new process (see its docstring)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, str(db), server.base_url, json.dumps(opts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def result_of(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """What the worker printed, once it has ended on its own."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def kill_when(proc: subprocess.Popen[str], ready: Any) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (it must hold within two minutes)."""
    deadline = time.monotonic() + 120
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the worker ended before the kill point: {out} {err}")
        assert time.monotonic() < deadline, "the worker never reached the kill point"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL


def turn_of(body: dict[str, Any]) -> int:
    """The turn a model request asks for: the assistant messages before it."""
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def committed(db: Path) -> set[str]:
    """The committed effect rows, as ``kind position`` (``outcome model:0:0``...)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT kind, name FROM stepstone_journal WHERE kind IN ('intent', 'outcome')"
        ).fetchall()
    finally:
        conn.close()
    return {f"{kind} {name}" for kind, name in rows}


def ledger(db: Path) -> list[str]:
    path = Path(f"{db}.ledger")
    return path.read_text().split() if path.exists() else []


# Turn 0 answers each of these and runs no tool; the options make it so.
NO_TOOL_TURNS: dict[str, tuple[Any, dict[str, Any]]] = {
    "an unknown tool": (call("no_such_tool", q="1"), {}),
    "arguments the tool does not take": (call("append", y="1"), {}),
    "arguments that are not JSON": (
        ToolCall(id="call_bad", name="append", raw_arguments='{"x": '),
        {},
    ),
    "calls over max_tool_calls_per_turn": (
        [call("no_such_tool", q="1"), call("append", x="9")],
        {"max_tool_calls_per_turn": 1},
    ),
    "an answer cut off and continued": (
        Reply(text="half an answer", stop_reason="length"),
        {"continue_on_length": 1},
    ),
    "a structured answer to repair": ("not JSON at all", {"structured": True}),
}


@pytest.mark.crash
@pytest.mark.parametrize(
    ("case", "async_writes", "then"),
    [(case, True, "resume") for case in sorted(NO_TOOL_TURNS)]
    + [("an unknown tool", True, "run"), ("an unknown tool", False, "resume")],
)
def test_a_turn_that_runs_no_tool_is_committed_before_the_next_request(
    tmp_path: Path, case: str, async_writes: bool, then: str
) -> None:
    # guarantee 380, 161: before, in write-behind mode (the default) such a turn stayed
    # buffered: a kill during the next request lost it, resume() found no checkpoint and
    # run() asked the model for turn 0 again
    first, opts = NO_TOOL_TURNS[case]
    opts = {**opts, "async_writes": async_writes}
    final = '{"ok": true}' if opts.get("structured") else "all done"
    db = tmp_path / "a.sqlite"
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        server.push(first, Hang())
        proc = spawn("run", db, server, **opts)
        kill_when(proc, lambda: len(server.requests) >= 2)  # turn 1 was requested
        assert {"intent model:0:0", "outcome model:0:0"} <= committed(db)
        server.push(call("append", x="1"), final)
        result = result_of(spawn(then, db, server, **opts))
        turns = [turn_of(r.json()) for r in server.requests]
    assert result.get("state") == "completed", result
    # turn 0 asked once; turn 1 again (the kill landed inside its request)
    assert turns == [0, 1, 1, 2]
    assert result["replayed_effect_count"] == 1  # turn 0's answer
    assert ledger(db) == ["append:1"]
