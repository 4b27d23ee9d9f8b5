"""Settling a call left in doubt (guarantees 405-407): a person records what a tool declared
``in_doubt="fail"`` did when its process died, from Python or the CLI, and the run goes on
from there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Agent,
    ConcurrentRunError,
    Plan,
    Runner,
    Step,
    Store,
    UserError,
    checkpoint_latest_key,
    tool,
)
from stepstone.durable import claim_run, in_doubt_effects, settle_effect
from tests.runner.conftest import Crash


class Bank:
    """A transfer tool that is not idempotent; ``crash`` names refs that die inside it."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.crash: set[str] = set()

    def tool(self) -> Any:
        @tool(in_doubt="fail")
        async def transfer(ref: str) -> str:
            """Move money (not idempotent)."""
            self.done.append(ref)
            if ref in self.crash:
                self.crash.discard(ref)
                raise Crash("died inside the transfer")
            return f"moved {ref}"

        return transfer


def _agent(bank: Bank, seen: list[Any] | None = None) -> Agent:
    from stepstone.testing import FunctionModel, call

    def reply(request: Any) -> Any:
        if request.turn == 0:
            return call("transfer", ref="x1")
        if seen is not None:
            seen.append(request.messages[-1])
        return "done"

    return Agent(name="payer", model=FunctionModel(reply), tools=[bank.tool()])


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store(db=tmp_path / "settle.sqlite") as s:
        yield s


async def _failed_in_doubt(store: Store, bank: Bank) -> Runner:
    """A run whose transfer died inside, then resumed: it fails on the call in doubt."""
    runner = Runner(store=store)
    bank.crash = {"x1"}
    with pytest.raises(Crash):
        await runner.run(_agent(bank), user_message="pay", run_id="p")
    failed = await runner.resume(_agent(bank), run_id="p")
    assert failed.state == "failed" and failed.error is not None
    assert failed.error["type"] == "EffectInDoubtError"
    return runner


async def test_a_call_that_happened_is_given_its_result_and_the_run_goes_on(
    store: Store,
) -> None:
    # guarantee 405: before, a run failed on a call in doubt stayed failed for good
    bank = Bank()
    runner = await _failed_in_doubt(store, bank)
    [doubt] = runner.in_doubt("p")
    assert (doubt["position"], doubt["name"], doubt["call_id"]) == (
        "tool:0:0",
        "transfer",
        "call_0_0",
    )
    assert doubt["live"] is False and doubt["run_key"] == checkpoint_latest_key("p")
    done = runner.settle("p", "call_0_0", happened=True, result="moved x1 (bank ledger 7781)")
    assert done["happened"] is True and done["status"] == "paused"
    assert runner.runs()[0]["status"] == "paused"
    assert runner.in_doubt("p") == []
    seen: list[Any] = []
    result = await runner.resume(_agent(bank, seen), run_id="p")
    assert result.state == "completed" and result.final_text == "done"
    assert bank.done == ["x1"]  # the transfer never ran again
    assert [t["content"] for t in result.tool_executions] == ["moved x1 (bank ledger 7781)"]
    assert "moved x1 (bank ledger 7781)" in json.dumps(seen[-1], default=str)  # the model saw it
    again = await runner.resume(_agent(bank), run_id="p")
    assert again == result  # finished: its stored result


async def test_a_call_that_did_not_happen_runs_again_and_may_be_in_doubt_again(
    store: Store,
) -> None:
    # guarantee 406
    bank = Bank()
    runner = await _failed_in_doubt(store, bank)
    runner.settle("p", "tool:0:0", happened=False, note="no transfer in the bank's ledger")
    bank.crash = {"x1"}  # it dies inside again: in doubt again, never run a third time
    with pytest.raises(Crash):
        await runner.resume(_agent(bank), run_id="p")
    assert bank.done == ["x1", "x1"]
    failed = await runner.resume(_agent(bank), run_id="p")
    assert failed.state == "failed" and failed.error is not None
    assert failed.error["type"] == "EffectInDoubtError" and bank.done == ["x1", "x1"]
    runner.settle("p", "call_0_0", happened=False)
    result = await runner.resume(_agent(bank), run_id="p")
    assert result.state == "completed" and bank.done == ["x1", "x1", "x1"]
    assert [t["content"] for t in result.tool_executions] == ["moved x1"]


async def test_a_crashed_run_can_be_settled_before_its_first_resume(store: Store) -> None:
    # guarantee 405
    bank = Bank()
    bank.crash = {"x1"}
    runner = Runner(store=store)
    with pytest.raises(Crash):
        await runner.run(_agent(bank), user_message="pay", run_id="p")
    settled = settle_effect(
        store, checkpoint_latest_key("p"), "call_0_0", happened=True, result={"moved": "x1"}
    )
    assert settled["result"] == {"moved": "x1"}
    result = await runner.resume(_agent(bank), run_id="p")
    assert result.state == "completed" and bank.done == ["x1"]
    assert result.tool_executions[0]["content"] == '{"moved": "x1"}'


async def test_what_cannot_be_settled_is_refused_and_nothing_is_written(store: Store) -> None:
    # guarantee 407
    bank = Bank()
    runner = await _failed_in_doubt(store, bank)
    key = checkpoint_latest_key("p")
    before = store.backend.run_get(key)
    with pytest.raises(UserError, match=r"no call 'call_9_9' in doubt; the calls in doubt are: "):
        runner.settle("p", "call_9_9", happened=True)
    with pytest.raises(UserError, match="did not happen has no result"):
        runner.settle("p", "call_0_0", happened=False, result="x")
    with pytest.raises(UserError, match="happened= must be True or False"):
        runner.settle("p", "call_0_0", happened="yes")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="no run"):
        runner.settle("nope", "call_0_0", happened=True)
    claimed = claim_run(store, key, kind="agent", resume=True, first_step=None)
    try:
        with pytest.raises(ConcurrentRunError, match="is live"):
            runner.settle("p", "call_0_0", happened=True, result="r")
        assert in_doubt_effects(store, key)[0]["live"] is True
    finally:
        assert claimed.run is not None
        claimed.run.release()
    after = store.backend.run_get(key)
    assert after is not None and before is not None
    assert after.journal_len == before.journal_len  # nothing was written
    runner.settle("p", "call_0_0", happened=True, result="r")
    with pytest.raises(UserError, match="no call of it is in doubt"):
        runner.settle("p", "call_0_0", happened=True, result="r")


def _plan(store: Store, bank: Bank) -> Agent:
    return Agent(
        engine=Plan(
            Step(_agent(bank), name="pay"),
            store=store,
            checkpoint_key="nightly",
            resume=True,
        )
    )


def test_a_call_in_doubt_inside_a_plan_step_is_settled_by_the_plans_key(
    store: Store,
) -> None:
    # guarantee 405: the Plan's LLM step journals under a key of its own, found from the
    # Plan's key; the Plan's resume=True then re-runs the step, which replays the call
    bank = Bank()
    bank.crash = {"x1"}
    with pytest.raises(Crash):
        _plan(store, bank)("pay")
    failed = _plan(store, bank)("pay")
    assert not failed.ok and failed.error is not None
    assert failed.error.type == "EffectInDoubtError"
    [doubt] = in_doubt_effects(store, "nightly")
    assert doubt["run_key"].startswith("nightly:") and doubt["call_id"] == "call_0_0"
    settle_effect(store, "nightly", "call_0_0", happened=True, result="moved x1")
    env = _plan(store, bank)("pay")
    assert env.ok and env.payload == "done" and bank.done == ["x1"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepstone.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_cli_lists_and_settles_a_call_in_doubt(tmp_path: Path) -> None:
    # guarantee 405, 407
    db = tmp_path / "cli.sqlite"
    bank = Bank()
    with Store(db=db) as store:
        await _failed_in_doubt(store, bank)
    listed = _cli("settle", "--db", str(db), "p")  # an agent run's id names it
    assert listed.returncode == 0, listed.stderr
    assert "tool:0:0" in listed.stdout and "call_0_0" in listed.stdout
    assert "transfer" in listed.stdout
    neither = _cli("settle", "--db", str(db), "p", "call_0_0")
    assert neither.returncode == 2 and "--happened or --not-happened" in neither.stderr
    done = _cli(
        "settle", "--db", str(db), "p", "call_0_0", "--happened", "--result", "moved x1", "--json"
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["happened"] is True and shown["result"] == "moved x1"
    assert shown["status"] == "paused"
    again = _cli("settle", "--db", str(db), "p", "call_0_0", "--not-happened")
    assert again.returncode == 1 and "no call of it is in doubt" in again.stderr
    with Store(db=db) as store:
        result = await Runner(store=store).resume(_agent(bank), run_id="p")
    assert result.state == "completed" and bank.done == ["x1"]
