"""When a durable agent run commits: every model answer is committed before the next model
request, also for a turn that runs no tool (checked by SIGKILLing a real process at the
next request, on the OpenAI SDK against a loopback server, and resuming in a new one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepstone.providers import ToolCall
from stepstone.testing import Hang, LoopbackServer, OpenAIDialect, Reply, call
from tests.runner.procs import committed, kill_when, ledger, result_of, spawn, turn_of

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
        # one of these kills hits a fresh interpreter, the others a forked one
        proc = spawn("run", db, server, fresh=case == "an unknown tool" and then == "run", **opts)
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
