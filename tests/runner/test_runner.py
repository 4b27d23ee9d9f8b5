"""Runner: run, resume, checkpoint records, snapshots, ids (SQLite files, scripted models)."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Agent,
    AgentCheckpointCorruptionError,
    AgentResult,
    ConcurrentRunError,
    ModelAPIError,
    Runner,
    RunnerConfig,
    SerializationError,
    Store,
    ToolContext,
    UserError,
    checkpoint_latest_key,
    tool,
)
from stepstone.engines.llm._durable import normalize_record
from stepstone.testing import FakeModel, call
from tests.durable.journal_edit import edit_entry, entries, first_format
from tests.runner.conftest import Crash, Script
from tests.store.damage import flip, settle, stored_rows

PHASES = {
    "run_started",
    "step_started",
    "pre_llm",
    "post_llm",
    "pre_tool_batch",
    "post_tool_batch",
    "pre_subagent_batch",
    "post_subagent_batch",
    "run_terminal",
}
SNAPSHOT_KEYS = {
    "messages",
    "step",
    "state",
    "context",
    "llm_calls",
    "tool_calls",
    "started_at_s",
    "usage",
    "total_cost_usd",
    "session_token",
    "checkpoint_token",
    "pending_llm_response",
    "tool_executions",
    "subagent_executions",
    "requested_model",
    "normalized_model",
    "provider_adapter",
    "final_text",
    "final_structured",
    "replayed_effect_count",
}


class Ledger:
    """Side effects the tools performed (what must not happen twice)."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.keys: dict[str, str] = {}
        self.crash_in: set[str] = set()

    def tools(self) -> list[Any]:
        @tool
        async def charge(order: str, ctx: ToolContext) -> str:
            """Charge an order."""
            self.done.append(order)
            self.keys.setdefault(order, ctx.idempotency_key)
            assert self.keys[order] == ctx.idempotency_key
            if order in self.crash_in:
                self.crash_in.discard(order)
                raise Crash(f"died right after charging {order}")
            return f"charged {order}"

        return [charge]


def two_turns() -> dict[int, Any]:
    return {
        0: [call("charge", order="a"), call("charge", order="b")],
        1: call("charge", order="c"),
        2: "all charged",
    }


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store(db=tmp_path / "agents.sqlite") as s:
        yield s


def make(script: Script, ledger: Ledger, **kw: Any) -> Agent:
    return Agent(name="biller", model=script.model(), tools=ledger.tools(), **kw)


def _guarantee(number: int) -> str:
    """The text of guarantee ``number`` in docs/guarantees.md."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "guarantees.md").read_text("utf-8")
    found = re.search(rf"^{number}\. (.*?)(?=^\d+\. |^<!--|^#|\Z)", doc, re.M | re.S)
    assert found is not None, number
    return found.group(1)


async def test_the_resume_example_runs_as_written() -> None:
    # guarantee 88, 104
    agent = Agent(name="analyst", model=FakeModel(["Q4 is up 12%."]), instructions="Analyze data.")
    runner = Runner()

    result = await runner.run(agent, user_message="Analyze Q4 revenue trends")

    resumed_result = await runner.resume(agent, run_id=result.run_id, thread_id=result.thread_id)
    assert resumed_result.state == "completed"
    assert resumed_result.final_text == "Q4 is up 12%."
    assert agent.engine.system == "Analyze data."  # type: ignore[attr-defined]


async def test_phases_records_and_the_audit_trail(store: Store) -> None:
    # guarantee 86, 87, 88, 97, 104, 188
    script, ledger = Script(two_turns()), Ledger()
    runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=False))
    result = await runner.run(make(script, ledger), user_message="bill", thread_id="th")
    assert result.state == "completed" and result.final_text == "all charged"
    chain = runner.checkpoints(result.run_id)
    phases = [r["phase"] for r in chain]
    assert phases[0] == "run_started" and phases[-1] == "run_terminal"
    assert set(phases) <= PHASES
    assert phases.count("post_llm") == 3 and phases.count("post_tool_batch") == 2
    for record in chain:
        assert set(record) == {
            "run_id",
            "thread_id",
            "schema_version",
            "phase",
            "payload",
            "timestamp_ms",
        }
        assert record["run_id"] == result.run_id and record["thread_id"] == "th"
        assert record["timestamp_ms"] > 1_600_000_000_000  # milliseconds
    stamps = [r["timestamp_ms"] for r in chain]
    assert stamps == sorted(stamps)
    latest = store.read(checkpoint_latest_key(result.run_id))
    assert latest == chain[-1]
    by_phase = {r["phase"]: r["payload"] for r in chain}
    assert by_phase["run_started"] == {"agent_name": "biller", "resumed": False}
    assert by_phase["post_tool_batch"] == {"tool_calls_total": 3, "tool_failures": 0}
    assert set(by_phase["pre_llm"]) == {"model", "provider", "message_count"}
    assert {"finish_reason", "tool_call_count", "session_token", "checkpoint_token"} <= set(
        by_phase["post_llm"]
    )
    terminal = by_phase["run_terminal"]
    assert terminal["state"] == "completed" and terminal["final_text"] == "all charged"
    assert AgentResult.from_dict(terminal["terminal_result"]) == result


async def test_resume_without_checkpoint_raises_and_writes_nothing(store: Store) -> None:
    # guarantee 89
    runner = Runner(store=store)
    agent = make(Script(two_turns()), Ledger())
    with pytest.raises(AgentCheckpointCorruptionError, match="nope"):
        await runner.resume(agent, run_id="nope", thread_id="t")
    assert store.keys() == []


def _tamper(db: Path, key: str, kind: str, edit: Any) -> None:
    conn = sqlite3.connect(db)
    try:
        seq, data = conn.execute(
            "SELECT seq, data FROM stepstone_journal WHERE run_key=? AND kind=? "
            "ORDER BY seq DESC LIMIT 1",
            (key, kind),
        ).fetchone()
        conn.execute(
            "UPDATE stepstone_journal SET data=? WHERE run_key=? AND seq=?", (edit(data), key, seq)
        )
        conn.commit()
    finally:
        conn.close()


async def _crashed_run(
    store: Store, script: Script, ledger: Ledger, *, first: bool = False, **kw: Any
) -> Runner:
    """A run that died; ``first``: its journal as the first format wrote it (one row per
    entry), to damage its rows by kind."""
    runner = Runner(store=store, **kw)
    with pytest.raises(Crash):
        await runner.run(make(script, ledger), user_message="bill", run_id="r1", thread_id="t")
    if first:
        first_format(store, checkpoint_latest_key("r1"))
    return runner


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: '"not a dict"',
        lambda d: json.dumps({k: v for k, v in json.loads(d).items() if k != "payload"}),
        lambda d: json.dumps({k: v for k, v in json.loads(d).items() if k != "run_id"}),
        lambda d: "{broken",
    ],
)
async def test_malformed_latest_record_raises_and_writes_nothing(tmp_path: Path, edit: Any) -> None:
    # guarantee 90
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)
        key = checkpoint_latest_key("r1")
        _tamper(db, key, "phase", edit)
        before = store.backend.run_get(key)
        with pytest.raises(AgentCheckpointCorruptionError, match="r1"):
            await runner.resume(make(Script(two_turns()), ledger), run_id="r1", thread_id="t")
        assert store.backend.run_get(key) == before
    assert ledger.done == ["a", "b", "c"]


def test_legacy_records_are_normalised_before_validation() -> None:
    # guarantee 91
    old = {"run_id": "r", "thread_id": "t", "phase": "pre_llm", "data": {"x": 1}, "ts": 1.5}
    assert normalize_record(old) == {
        "run_id": "r",
        "thread_id": "t",
        "phase": "pre_llm",
        "payload": {"x": 1},
        "timestamp_ms": 1500,
        "schema_version": "1",
    }


async def test_legacy_latest_record_still_resumes(tmp_path: Path) -> None:
    # guarantee 91
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)

        def legacy(data: str) -> str:
            rec = json.loads(data)
            rec["data"] = rec.pop("payload")
            rec["ts"] = rec.pop("timestamp_ms") / 1000
            del rec["schema_version"]
            return json.dumps(rec)

        _tamper(db, checkpoint_latest_key("r1"), "phase", legacy)
        result = await runner.resume(make(Script(two_turns()), ledger), run_id="r1", thread_id="t")
    assert result.state == "completed"


async def test_terminal_run_returns_stored_result_with_no_calls(store: Store) -> None:
    # guarantee 92
    script, ledger = Script(two_turns()), Ledger()
    runner = Runner(store=store)
    first = await runner.run(make(script, ledger), user_message="bill", run_id="r", thread_id="t")
    again = Script(two_turns())
    resumed = await runner.resume(make(again, ledger), run_id="r", thread_id="t")
    rerun = await runner.run(make(again, ledger), user_message="bill", run_id="r", thread_id="t")
    assert resumed == first == rerun
    assert again.asked == [] and ledger.done == ["a", "b", "c"]


async def test_resume_tries_a_rate_limited_run_again(store: Store) -> None:
    # guarantee 92: a failure a later try can cure (a 429 whose wait is longer than the
    # engine sleeps) is resumable: resume() continues where it stopped; run() with the same
    # id keeps returning the stored result. Before, both returned the failure for good.
    limited = {"on": True}

    def before(turn: int) -> None:
        if turn == 1 and limited["on"]:
            limited["on"] = False
            raise ModelAPIError(
                "429 too many requests",
                kind="rate_limit",
                status=429,
                retryable=True,
                retry_after=3600,
                retry_at=1e10,
            )

    script, ledger = Script(two_turns(), before=before), Ledger()
    runner = Runner(store=store)
    agent = make(script, ledger, max_retries=0)
    failed = await runner.run(agent, user_message="bill", run_id="r", thread_id="t")
    assert failed.state == "failed" and failed.error is not None
    assert failed.error["type"] == "ModelAPIError" and failed.error["retryable"] is True
    assert failed.error["retry_at"] == 1e10
    assert await runner.run(agent, user_message="bill", run_id="r", thread_id="t") == failed
    done = await runner.resume(agent, run_id="r", thread_id="t")
    assert done.state == "completed" and done.final_text == "all charged"
    assert ledger.done == ["a", "b", "c"]  # turn 0's charges were not made again
    assert script.asked == [0, 1, 1, 2]


@pytest.mark.parametrize("async_writes", [False, True])
async def test_crash_mid_batch_resumes_replaying_finished_tools(
    store: Store, async_writes: bool
) -> None:
    # guarantee 93, 94, 102, 104, 160, 161
    ledger = Ledger()
    ledger.crash_in = {"b"}
    script = Script(two_turns())
    config = RunnerConfig(checkpoint_async_writes=async_writes)
    runner = await _crashed_run(store, script, ledger, config=config)
    snap = runner.snapshot("r1")
    assert snap["pending_llm_response"]["tool_calls"][1]["arguments"] == {"order": "b"}
    assert [m["role"] for m in snap["messages"]][:2] == ["user", "assistant"]
    again = Script(two_turns())
    result = await runner.resume(make(again, ledger, instructions=None), run_id="r1", thread_id="t")
    assert result.state == "completed" and result.final_text == "all charged"
    assert again.asked == [1, 2]  # turn 0 was committed: the model is not asked again
    # "a" finished before the crash and is replayed; "b" crashed inside its call and, with
    # the default in_doubt="rerun", runs again with the same idempotency key.
    assert ledger.done == ["a", "b", "b", "c"]
    assert result.replayed_effect_count == 2  # the model turn 0 and tool call "a"
    assert result.llm_calls == 3 and result.tool_calls == 3
    assert result.usage["input_tokens"] > 0
    assert [t["tool"] for t in result.tool_executions] == ["charge"] * 3


@pytest.mark.parametrize("how", ["run", "resume", "run_sync", "resume_sync"])
async def test_a_crashed_run_continues_from_its_run_id_alone(store: Store, how: str) -> None:
    # guarantee 400: the store knows the thread. Before, run_id="r1" without the thread
    # raised "belongs to thread 't'; pass thread_id=".
    ledger = Ledger()
    ledger.crash_in = {"c"}
    runner = await _crashed_run(store, Script(two_turns()), ledger)
    listed = runner.runs()
    assert [(r["run_id"], r["thread_id"], r["status"]) for r in listed] == [("r1", "t", "running")]
    again = Script(two_turns())
    agent = make(again, ledger)
    if how == "run":
        result = await runner.run(agent, user_message="bill", run_id="r1")
    elif how == "resume":
        result = await runner.resume(agent, run_id="r1")
    else:  # the sync forms, on a thread of their own (this test's loop is running)
        call_it = (
            (lambda: runner.run_sync(agent, user_message="bill", run_id="r1"))
            if how == "run_sync"
            else (lambda: runner.resume_sync(agent, run_id="r1"))
        )
        result = await asyncio.to_thread(call_it)
    assert result.state == "completed" and result.thread_id == "t"
    assert again.asked == [2] and ledger.done == ["a", "b", "c", "c"]  # "c" was in doubt
    assert runner.runs()[0]["status"] == "done"


async def test_a_thread_id_that_contradicts_the_stored_one_is_refused(store: Store) -> None:
    # guarantee 166, 400
    ledger = Ledger()
    ledger.crash_in = {"c"}
    runner = await _crashed_run(store, Script(two_turns()), ledger)
    before = store.backend.run_get(checkpoint_latest_key("r1"))
    agent = make(Script(two_turns()), ledger)
    with pytest.raises(UserError, match="belongs to thread 't', not 'u'; pass thread_id='t'"):
        await runner.run(agent, user_message="bill", run_id="r1", thread_id="u")
    with pytest.raises(UserError, match="belongs to thread 't', not 'u'"):
        await runner.resume(agent, run_id="r1", thread_id="u")
    assert store.backend.run_get(checkpoint_latest_key("r1")) == before
    fresh = await runner.run(agent, user_message="bill", run_id="new")
    assert fresh.thread_id and fresh.thread_id != "t"  # a new run gets a fresh thread


async def test_snapshot_has_every_runtime_key(store: Store) -> None:
    # guarantee 93, 96, 103
    runner = Runner(store=store)
    result = await runner.run(
        make(Script(two_turns()), Ledger()), user_message="bill", context={"tenant": "acme"}
    )
    snap = runner.snapshot(result.run_id)
    assert set(snap) >= SNAPSHOT_KEYS
    assert snap["context"] == {"tenant": "acme"}
    assert snap["llm_calls"] == 3 and snap["tool_calls"] == 3
    assert snap["session_token"] is None and snap["checkpoint_token"] is None
    assert snap["pending_llm_response"] is None
    assert len(snap["messages"]) == 1 + 3 + 3  # user, 3 assistant turns, 3 tool results


async def test_undecodable_pending_llm_response_never_calls_the_model_again(
    tmp_path: Path,
) -> None:
    # guarantee 95
    from stepstone.durable._effects import hash_json

    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"a"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)

        def garble(data: str) -> str:
            rec = json.loads(data)
            rec["data"] = {"text": 42, "tool_calls": "?"}
            rec["output_hash"] = hash_json(rec["data"])
            return json.dumps(rec)

        conn = sqlite3.connect(db)
        (seq, data) = conn.execute(
            "SELECT seq, data FROM stepstone_journal WHERE kind='outcome' AND name='model:0:0'"
        ).fetchone()
        conn.execute("UPDATE stepstone_journal SET data=? WHERE seq=?", (garble(data), seq))
        conn.commit()
        conn.close()
        again = Script(two_turns())
        with pytest.raises(AgentCheckpointCorruptionError, match="pending_llm_response"):
            await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
    assert again.asked == []


def _edit(db: Path, sql: str) -> None:
    """Change the SQLite file under the store, as a flipped byte would."""
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()


async def test_tampered_outcome_fails_its_output_hash(tmp_path: Path) -> None:
    # guarantee 101, 162
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)
        conn = sqlite3.connect(db)
        (seq, data) = conn.execute(
            "SELECT seq, data FROM stepstone_journal WHERE kind='outcome' AND name='tool:0:0'"
        ).fetchone()
        rec = json.loads(data)
        assert set(rec) >= {"input_hash", "output_hash", "call_id"}
        rec["data"] = {"content": "charged nothing"}
        conn.execute("UPDATE stepstone_journal SET data=? WHERE seq=?", (json.dumps(rec), seq))
        conn.commit()
        conn.close()
        with pytest.raises(AgentCheckpointCorruptionError, match="output_hash"):
            await runner.resume(make(Script(two_turns()), ledger), run_id="r1", thread_id="t")


async def test_a_journal_row_of_a_kind_an_agent_run_never_writes_is_corruption(
    tmp_path: Path,
) -> None:
    """guarantee 131: a tool outcome whose row kind a flipped byte changed is not skipped
    (the tool would look in doubt, or run again); the resume refuses, calling nothing."""
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)
        _edit(
            db,
            "UPDATE stepstone_journal SET kind = 'outXome' "
            "WHERE kind = 'outcome' AND name = 'tool:0:0'",
        )
        again = Script(two_turns())
        with pytest.raises(AgentCheckpointCorruptionError, match="'outXome' row named"):
            await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
    assert again.asked == []


AGENT_CORRUPTIONS = {
    "a lost row": ("DELETE FROM stepstone_journal WHERE seq = 3", "rows [3] are missing"),
    "rows whose head was lost": ("DELETE FROM stepstone_runs", "no checkpoint for agent run"),
    "a row past the head's count": (
        "UPDATE stepstone_runs SET journal_len = journal_len - 1",
        "past them",
    ),
    "a row that is not an object": (
        "UPDATE stepstone_journal SET data = '[1]' WHERE kind = 'message'",
        "not an object",
    ),
    "an outcome filed under another position": (
        "UPDATE stepstone_journal SET name = 'tool:0:7' "
        "WHERE kind = 'outcome' AND name = 'tool:0:0'",
        "does not describe the call at its position",
    ),
    "an intent whose turn is damaged": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.turn', 'zz') "
        "WHERE kind = 'intent' AND name = 'tool:0:1'",
        "does not describe the call",
    ),
    "an outcome whose field name is damaged": (
        "UPDATE stepstone_journal SET data = replace(data, '\"call_id\"', '\"call_iX\"') "
        "WHERE kind = 'outcome' AND name = 'tool:0:0'",
        "a field or its name is damaged",
    ),
    "an outcome whose input hash is damaged": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.input_hash', 7) "
        "WHERE kind = 'outcome' AND name = 'tool:0:0'",
        "a field or its name is damaged",
    ),
    "an outcome whose input hash differs from its intent's": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.input_hash', printf('%.64c', 'a')) "
        "WHERE kind = 'outcome' AND name = 'tool:0:0'",
        "another input_hash than its intent",
    ),
    "the latest record names another run": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.run_id', 'zz') WHERE kind = 'phase'",
        "belongs to run 'zz'",
    ),
    "the latest record's thread is not text": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.thread_id', 7) WHERE kind = 'phase'",
        "not text",
    ),
    "the first message lost its text": (
        "UPDATE stepstone_journal SET data = json_remove(data, '$.text') WHERE kind = 'message'",
        "no text",
    ),
    "a snapshot with a damaged start time": (
        "UPDATE stepstone_journal SET data = json_set(data, '$.started_at_s', 'zz') "
        "WHERE kind = 'snapshot'",
        "snapshot",
    ),
}


def _is(tag: str, *head: Any) -> Any:
    """Finds the first entry tagged ``tag`` that starts with ``head`` (see edit_entry)."""
    return lambda e: e[0] == tag and e[1 : 1 + len(head)] == list(head)


def _set(i: int, value: Any) -> Any:
    return lambda e: [*e[:i], value, *e[i + 1 :]]


# Damage inside the rows of the current format: one row per commit, a list of entries.
ENTRY_CORRUPTIONS: dict[str, tuple[Any, Any, str]] = {
    "an entry that is not an array": (
        _is("r", "message"),
        lambda e: "not an entry",
        "is entry 1: not a non-empty array",
    ),
    "an entry tagged as none is": (_is("r", "message"), _set(0, "x"), "unknown entry tag 'x'"),
    "a record of a kind an agent run never writes": (
        _is("r", "message"),
        _set(1, "mesXage"),
        "holds a 'mesXage' record named 'user', which an agent run never writes",
    ),
    "an outcome whose data changed": (
        _is("o", "tool", 0, 0),
        _set(5, {"content": "charged nothing"}),
        "does not match its output_hash",
    ),
    "an outcome whose intent was lost": (
        _is("i", "tool", 0, 1),
        lambda e: None,
        "an outcome at tool:0:1 with no intent before it",
    ),
    "an intent whose turn is damaged": (
        _is("i", "tool", 0, 1),
        _set(2, "zz"),
        "an effect's position is not (text, int, int)",
    ),
    "an intent whose input hash is damaged": (
        _is("i", "tool", 0, 1),
        _set(6, 7),
        "does not describe the call at its position",
    ),
    "a change to a field the record does not have": (
        _is("p", "phase", "pre_llm"),
        _set(3, [["payload", "nope", 1]]),
        "'nope', which the previous object does not have",
    ),
    "a change to a record never written": (
        _is("p", "phase", "pre_llm"),
        _set(2, "pre_lXm"),
        "changes to a phase record 'pre_lXm' that was never written",
    ),
}


async def test_an_entries_row_of_another_format_is_refused(tmp_path: Path) -> None:
    # guarantee 451: a newer format (or a damaged version number) is not read as this one
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger)
        _edit(db, "UPDATE stepstone_journal SET data = json_set(data, '$.v', 3) WHERE seq = 1")
        again = Script(two_turns())
        with pytest.raises(AgentCheckpointCorruptionError, match="not an entries row of format 2"):
            await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
    assert again.asked == []


@pytest.mark.parametrize("case", sorted(ENTRY_CORRUPTIONS))
async def test_a_damaged_entry_is_refused_before_the_claim(tmp_path: Path, case: str) -> None:
    """guarantee 131, 132, 451: an entry of the current format that does not decode, or
    that decodes into an effect or record the run never wrote, is corruption: nothing is
    called or written."""
    find, change, what = ENTRY_CORRUPTIONS[case]
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger)
        edit_entry(db, checkpoint_latest_key("r1"), find, change)
        before = stored_rows(db)
        again = Script(two_turns())
        with pytest.raises(AgentCheckpointCorruptionError, match="r1") as info:
            await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
        assert what in str(info.value)
        assert stored_rows(db) == before
    assert again.asked == [] and ledger.done == ["a", "b", "c"]


@pytest.mark.parametrize("case", sorted(AGENT_CORRUPTIONS))
async def test_a_corrupt_agent_record_is_refused_before_the_claim(
    tmp_path: Path, case: str
) -> None:
    """guarantee 131, 132: the whole record (every row there, each a JSON object, every
    effect row filed under its own position with its hash) is checked before the run is
    claimed: nothing is called, nothing is written."""
    sql, what = AGENT_CORRUPTIONS[case]
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger, first=True)
        _edit(db, sql)
        before = stored_rows(db)
        again = Script(two_turns())
        for _ in range(2):  # the same error again, never "owned by a live run"
            with pytest.raises(AgentCheckpointCorruptionError, match="r1") as info:
                await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
            assert what in str(info.value)
        assert stored_rows(db) == before
    assert again.asked == [] and ledger.done == ["a", "b", "c"]


async def test_run_again_over_rows_whose_head_was_lost_is_refused(tmp_path: Path) -> None:
    """guarantee 131, 132: `runner.run` with the run id of a record whose head was lost
    would start over and charge again; the claim refuses, nothing is called or written."""
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    ledger.crash_in = {"c"}
    with Store(db=db) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger)
        _edit(db, "DELETE FROM stepstone_runs")
        before = stored_rows(db)
        again = Script(two_turns())
        with pytest.raises(AgentCheckpointCorruptionError, match="journal rows but no run head"):
            await runner.run(make(again, ledger), user_message="bill", run_id="r1", thread_id="t")
        assert stored_rows(db) == before
    assert again.asked == [] and ledger.done == ["a", "b", "c"]


async def test_a_byte_flipped_on_disk_is_an_agent_corruption_error(tmp_path: Path) -> None:
    """guarantee 131: a tool outcome whose bytes changed in the SQLite file (its row fails
    the store's checksum) stops run(), resume(), snapshot(), checkpoints() and runs() with
    the documented AgentCheckpointCorruptionError naming the run; before, the store's
    CheckpointCorruptError (a sibling class) escaped, naming only the key."""
    db = tmp_path / "a.sqlite"
    ledger = Ledger()
    with Store(db=db) as store:
        done = await Runner(store=store).run(
            make(Script(two_turns()), ledger), user_message="bill", run_id="r1", thread_id="t"
        )
    assert done.state == "completed"
    settle(db)
    flip(db, b'"content":"charged b"', at=len('"content":"charged '), to=b"X")
    before = stored_rows(db)
    again = Script(two_turns())
    with Store(db=db) as store:
        runner = Runner(store=store)
        attempts: dict[str, Any] = {
            "resume": lambda: runner.resume_sync(make(again, ledger), run_id="r1", thread_id="t"),
            "run": lambda: runner.run_sync(
                make(again, ledger), user_message="bill", run_id="r1", thread_id="t"
            ),
            "snapshot": lambda: runner.snapshot("r1"),
            "checkpoints": lambda: runner.checkpoints("r1"),
            "runs": lambda: runner.runs(thread_id="t"),
        }
        for name, attempt in attempts.items():
            with pytest.raises(AgentCheckpointCorruptionError) as info:
                await asyncio.to_thread(attempt)
            message = str(info.value)
            assert message.startswith("agent run 'r1' (checkpoint 'agent:r1:checkpoint:latest')")
            assert "does not match its checksum" in message, name
            assert info.value.fault is not None and "checksum" in info.value.fault
    assert stored_rows(db) == before
    assert again.asked == [] and ledger.done == ["a", "b", "c"]


async def test_changed_input_at_a_recorded_position_is_corruption(store: Store) -> None:
    # guarantee 163
    ledger = Ledger()
    ledger.crash_in = {"c"}
    runner = await _crashed_run(store, Script(two_turns()), ledger)
    changed = make(Script(two_turns()), ledger, instructions="Refund everything instead.")
    with pytest.raises(AgentCheckpointCorruptionError, match="check determinism"):
        await runner.resume(changed, run_id="r1", thread_id="t")
    assert ledger.done == ["a", "b", "c"]


async def test_crash_during_the_model_call_asks_again(store: Store) -> None:
    # guarantee 164
    script = Script(two_turns(), crash_at={1})
    ledger = Ledger()
    runner = await _crashed_run(store, script, ledger)
    again = Script(two_turns())
    result = await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
    assert result.state == "completed"
    assert again.asked == [1, 2] and ledger.done == ["a", "b", "c"]


async def test_two_resumes_of_one_live_run(store: Store) -> None:
    # guarantee 165
    ledger = Ledger()
    ledger.crash_in = {"c"}
    runner = await _crashed_run(store, Script(two_turns()), ledger)
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def hold(turn: int) -> None:
        return None

    script = Script(two_turns())

    @tool
    async def charge(order: str) -> str:
        """Charge an order."""
        entered.set()
        await gate.wait()
        ledger.done.append(order)
        return f"charged {order}"

    agent = Agent(name="biller", model=script.model(), tools=[charge])
    first = asyncio.create_task(runner.resume(agent, run_id="r1", thread_id="t"))
    await asyncio.wait_for(entered.wait(), 60)
    with pytest.raises(ConcurrentRunError, match="live") as info:
        await runner.resume(agent, run_id="r1", thread_id="t")
    # the class guarantee 165 names is the one raised (before, it named the Plan-facing
    # ConcurrentPlanRunError, a subclass `except` clauses written from it would miss)
    assert type(info.value) is ConcurrentRunError
    named = set(re.findall(r"`(Concurrent\w*Error)`", _guarantee(165)))
    assert named == {type(info.value).__name__}
    # approvals given while it runs: the same error, not "it waits for nothing"
    with pytest.raises(ConcurrentRunError, match=r"owned by live run .* once it has stopped"):
        await runner.resume(agent, run_id="r1", thread_id="t", approvals={"call_1_0": True})
    gate.set()
    result = await asyncio.wait_for(first, 60)
    assert result.state == "completed"
    assert ledger.done == ["a", "b", "c", "c"]  # "c" crashed inside its call: run once more


async def test_ids_and_idempotent_run_ids(store: Store) -> None:
    # guarantee 166, 167
    runner = Runner(store=store)
    agent = make(Script(two_turns()), Ledger())
    for bad in ("", None):
        with pytest.raises(UserError, match="run_id"):
            await runner.resume(agent, run_id=bad, thread_id="t")  # type: ignore[arg-type]
    for bad in ("", 7):  # None is the stored run's thread (guarantee 400)
        with pytest.raises(UserError, match="thread_id"):
            await runner.resume(agent, run_id="x", thread_id=bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="run_id"):
        await runner.run(agent, user_message="bill", run_id="")
    with pytest.raises(UserError, match="context must be a dict"):
        await runner.run(agent, user_message="bill", context=["x"])  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="context"):
        await runner.run(agent, user_message="bill", context={"when": object()})
    assert store.keys() == []
    await runner.run(agent, user_message="bill", run_id="r", thread_id="t")
    with pytest.raises(UserError, match="another user_message"):
        await runner.run(agent, user_message="something else", run_id="r", thread_id="t")
    with pytest.raises(UserError, match="thread"):
        await runner.resume(agent, run_id="r", thread_id="other")
    listed = runner.runs(thread_id="t")
    assert [(r["run_id"], r["status"], r["phase"]) for r in listed] == [
        ("r", "done", "run_terminal")
    ]
    assert runner.runs(thread_id="nobody") == []


def test_sync_twins_and_config_validation(tmp_path: Path) -> None:
    # guarantee 98
    assert RunnerConfig().checkpoint_async_writes is True
    assert RunnerConfig().checkpoint_coalesce_runtime_state is True
    with pytest.raises(ValueError, match="checkpoint_flush_timeout_s"):
        RunnerConfig(checkpoint_flush_timeout_s=0)
    with pytest.raises(ValueError, match="checkpoint_queue_maxsize"):
        RunnerConfig(checkpoint_queue_maxsize=0)
    with pytest.raises(UserError, match=r"takes a Store, got str 'x.db'; pass Store\(db="):
        Runner(store="x.db")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="takes a RunnerConfig, got dict"):
        Runner(config={"checkpoint_async_writes": False})  # type: ignore[arg-type]
    with Store(db=tmp_path / "s.sqlite") as store:
        runner = Runner(store=store)
        agent = make(Script(two_turns()), Ledger())
        result = runner.run_sync(agent, user_message="bill", run_id="s", thread_id="t")
        assert result.state == "completed"
        assert runner.resume_sync(agent, run_id="s", thread_id="t") == result


async def _snapshot_rows(store: Store, coalesce: bool, run_id: str) -> int:
    config = RunnerConfig(
        checkpoint_async_writes=True,
        checkpoint_coalesce_runtime_state=coalesce,
        checkpoint_flush_interval_s=60,
    )
    runner = Runner(store=store, config=config)
    await runner.run(make(Script(two_turns()), Ledger()), user_message="bill", run_id=run_id)
    return sum(1 for e in entries(store, checkpoint_latest_key(run_id)) if e.kind == "snapshot")


async def test_write_behind_coalesces_runtime_snapshots(store: Store) -> None:
    # guarantee 99, 169
    coalesced = await _snapshot_rows(store, True, "c")
    every = await _snapshot_rows(store, False, "e")
    assert coalesced < every


async def test_failed_terminal_flush_is_an_error_in_the_result(tmp_path: Path) -> None:
    # guarantee 100, 170
    db = tmp_path / "a.sqlite"
    holder: list[sqlite3.Connection] = []

    def lock_the_file(turn: int) -> None:
        if turn == 2:  # the last turn: the run's final commit will find the file locked
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            holder.append(conn)

    script = Script(two_turns(), before=lock_the_file)
    config = RunnerConfig(checkpoint_async_writes=True, checkpoint_flush_interval_s=60)
    with Store(db=db, busy_timeout=0.2) as store:
        runner = Runner(store=store, config=config)
        result = await runner.run(make(script, Ledger()), user_message="bill", run_id="f")
        assert result.state == "failed"
        assert result.error is not None and result.error["type"] == "CheckpointFlushError"
        assert "checkpoint_flush_timeout_s" in result.error["message"]
        holder[0].execute("ROLLBACK")
        holder[0].close()
        again = await runner.resume(
            make(Script(two_turns()), Ledger()), run_id="f", thread_id=result.thread_id
        )
        assert again.state == "completed"


def test_agent_shorthand() -> None:
    # guarantee 187
    from stepstone import LLMEngine

    agent = Agent(name="a", model=FakeModel(["hi"]), instructions="Be brief.")
    assert isinstance(agent.engine, LLMEngine) and agent.engine.system == "Be brief."
    assert Agent(model="claude-sonnet-4-6").engine.model == "claude-sonnet-4-6"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="both engine"):
        Agent(engine=LLMEngine("gpt-5"), model="gpt-5")
    with pytest.raises(TypeError, match="instructions"):
        Agent(engine=LLMEngine("gpt-5"), instructions="x")
    assert agent("hello").payload == "hi"


async def test_runner_without_store_is_in_memory() -> None:
    # guarantee 168
    runner = Runner()
    assert type(runner.store.backend).__name__ == "MemoryBackend"
    result = await runner.run(make(Script(two_turns()), Ledger()), user_message="bill")
    assert result.state == "completed" and runner.checkpoints(result.run_id)


async def test_bytes_per_turn_do_not_grow(store: Store) -> None:
    # guarantee 189, 452
    def replies(turns: int) -> dict[int, Any]:
        out: dict[int, Any] = {t: call("charge", order=f"o{t}") for t in range(turns)}
        out[turns] = "done"
        return out

    sizes = {}
    for turns in (5, 40):
        runner = Runner(store=store)
        agent = Agent(model=Script(replies(turns)).model(), tools=Ledger().tools(), max_turns=50)
        result = await runner.run(agent, user_message="bill", run_id=f"b{turns}")
        rows = store.backend.run_journal(checkpoint_latest_key(result.run_id))
        sizes[turns] = sum(len(r.data) for r in rows) / turns
        # no row holds the conversation (the last one's terminal record lists the run's
        # tool calls once)
        assert max(len(r.data) for r in rows[:-1]) < 4000
    assert sizes[40] < sizes[5] * 1.2


@pytest.mark.parametrize("async_writes", [True, False])
async def test_a_turn_is_two_journal_rows_of_at_most_3_kb(
    tmp_path: Path, async_writes: bool
) -> None:
    """guarantee 452: a turn that runs one tool returning 200 bytes is committed as two
    journal rows, and the database file grows by at most 3 KB a turn, as much at turn 300
    as at turn 30."""

    @tool
    async def lookup(n: int) -> str:
        """Look a number up."""
        return "r" * 200

    def agent(turns: int) -> Agent:
        def reply(turn: int) -> Any:
            return call("lookup", n=turn) if turn < turns else "done"

        script = Script({t: reply(t) for t in range(turns + 1)})
        return Agent(model=script.model(), tools=[lookup], max_turns=turns + 2)

    config = RunnerConfig(checkpoint_async_writes=async_writes, checkpoint_flush_interval_s=600)
    with Store(db=tmp_path / "empty.sqlite"):
        pass
    empty = (tmp_path / "empty.sqlite").stat().st_size
    grew: dict[int, float] = {}
    for turns in (30, 300):
        db = tmp_path / f"t{turns}.sqlite"
        with Store(db=db) as store:
            result = await Runner(store=store, config=config).run(
                agent(turns), user_message="go", run_id="r"
            )
            assert result.state == "completed"
            rows = store.backend.run_journal(checkpoint_latest_key("r"))
            # two a turn, the last answer's with the end (sync: and the start on its own)
            assert len(rows) == 2 * turns + (1 if async_writes else 2)
        grew[turns] = (db.stat().st_size - empty) / turns  # closed: the WAL is in the file
        assert grew[turns] <= 3000, grew
    assert grew[300] <= grew[30] * 1.2


async def test_structured_output_is_kept_and_replayed(tmp_path: Path) -> None:
    # guarantee 92, 183
    from pydantic import BaseModel

    from stepstone import Plan, Step

    class Verdict(BaseModel):
        approve: bool
        reason: str

    answer = '{"approve": true, "reason": "within budget"}'
    with Store(db=tmp_path / "s.sqlite") as store:
        runner = Runner(store=store)
        agent = Agent(model=Script({0: answer}).model(), output=Verdict)
        result = await runner.run(agent, user_message="judge", run_id="v", thread_id="t")
        assert result.final_structured == {"approve": True, "reason": "within budget"}
        script = Script({0: answer})
        judge = Agent(name="judge", model=script.model(), output=Verdict)
        plan = Plan(Step(judge, output=Verdict), store=store, checkpoint_key="j")
        env = await Agent(engine=plan).run("judge")
        assert env.ok and env.payload == Verdict(approve=True, reason="within budget")
        # the step's loop again under the same execution key: the stored answer, typed
        from stepstone.durable._effects import DurableScope, bind_scope

        origin = store.backend.run_get("j").meta["origin"]  # type: ignore[union-attr]
        with bind_scope(DurableScope(store=store, key=f"j:{origin}:judge:1")):
            again = await judge.run("judge")
        assert again.payload == env.payload and script.asked == [0]


async def test_store_failure_mid_run_fails_the_result_and_stays_resumable(
    tmp_path: Path,
) -> None:
    # guarantee 170
    db = tmp_path / "a.sqlite"
    holder: list[sqlite3.Connection] = []
    runs: list[str] = []

    @tool
    async def charge(order: str) -> str:
        """Charge an order; the store gets locked by someone else meanwhile."""
        runs.append(order)
        if not holder:
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            holder.append(conn)
        return f"charged {order}"

    replies = {0: call("charge", order="a"), 1: "done"}
    with Store(db=db, busy_timeout=0.2) as store:
        runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=False))
        agent = Agent(model=Script(replies).model(), tools=[charge])
        failed = await runner.run(agent, user_message="bill", run_id="m", thread_id="t")
        assert failed.state == "failed"
        assert failed.error is not None and failed.error["type"] == "CheckpointFlushError"
        assert "resume the run" in failed.error["message"]
        holder[0].execute("ROLLBACK")
        holder[0].close()
        script = Script(replies)
        agent = Agent(model=script.model(), tools=[charge])
        done = await runner.resume(agent, run_id="m", thread_id="t")
    assert done.state == "completed" and done.final_text == "done"
    assert script.asked == [1]  # the committed turn is not asked again
    assert runs == ["a", "a"]  # its outcome never reached the store: in doubt, run again


@pytest.mark.postgres
async def test_crash_resume_and_approval_on_postgres(pg_url: str) -> None:
    # guarantee 102, 160, 177
    ledger = Ledger()
    ledger.crash_in = {"c"}  # alone in its turn: "a" and "b" are committed by then
    with Store(url=pg_url) as store:
        runner = await _crashed_run(store, Script(two_turns()), ledger)
        again = Script(two_turns())
        result = await runner.resume(make(again, ledger), run_id="r1", thread_id="t")
        assert result.state == "completed" and again.asked == [2]
        assert ledger.done == ["a", "b", "c", "c"]
        assert result.replayed_effect_count == 4  # two model turns, "a" and "b"

        done: list[str] = []

        @tool(requires_approval=True)
        async def refund(order: str) -> str:
            """Refund an order."""
            done.append(order)
            return "refunded"

        agent = Agent(model=Script({0: call("refund", order="x"), 1: "ok"}).model(), tools=[refund])
        paused = await runner.run(agent, user_message="refund", run_id="pg-r", thread_id="t")
        assert paused.state == "paused" and done == []
        call_id = paused.pending_approvals[0]["call_id"]
        final = await runner.resume(agent, run_id="pg-r", thread_id="t", approvals={call_id: True})
        assert final.state == "completed" and done == ["x"]
