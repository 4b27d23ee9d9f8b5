"""Human approval: a paused run, resumed with decisions, in this process or another one."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Runner, Step, Store, UserError, checkpoint_latest_key, tool
from stepstone.durable import approve_call, pending_approvals, read_run
from stepstone.testing import LoopbackServer, OpenAIDialect, call
from tests import _spawn
from tests.runner.conftest import Script
from tests.runner.procs import kill_when, ledger, run_worker, spawn, turn_of
from tests.store.damage import stored_rows

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("approval_worker.py")


def _worker(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = _spawn.run(
        [sys.executable, str(WORKER), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_pause_then_approve_from_another_process(tmp_path: Path) -> None:
    # guarantee 177, 178
    db = str(tmp_path / "support.sqlite")
    paused = _worker("start", db)
    assert paused["state"] == "paused"
    [pending] = paused["pending_approvals"]
    assert pending["tool"] == "refund" and pending["arguments"] == {"order": "o-7", "amount": 30}
    assert pending["reason"] == "requires_approval"
    assert not Path(db + ".refunds").exists()
    done = _worker("approve", db, pending["call_id"])
    assert done["state"] == "completed" and done["final_text"] == "Refund done."
    assert Path(db + ".refunds").read_text() == "o-7:30\n"
    assert done["replayed_effect_count"] == 1  # the paused turn's model response


def _refund_tool(done: list[str]) -> Any:
    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        done.append(order)
        return f"refunded {order}"

    return refund


@pytest.mark.parametrize("decision", [False, "over the limit"])
async def test_refusal_reaches_the_model_as_the_tool_result(tmp_path: Path, decision: Any) -> None:
    # guarantee 179
    done: list[str] = []
    seen: list[str] = []
    replies = {0: [call("refund", order="a"), call("lookup", order="a")], 1: "not refunded"}
    script = Script(replies)

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        seen.append(order)
        return "order a: 30 EUR"

    with Store(db=tmp_path / "r.sqlite") as store:
        runner = Runner(store=store)
        agent = Agent(model=script.model(), tools=[_refund_tool(done), lookup])
        paused = await runner.run(agent, user_message="refund a", run_id="r", thread_id="t")
        assert paused.state == "paused" and seen == ["a"]  # the other call of the turn ran
        call_id = paused.pending_approvals[0]["call_id"]
        result = await runner.resume(
            agent, run_id="r", thread_id="t", approvals={call_id: decision}
        )
    assert result.state == "completed" and done == [] and seen == ["a"]
    assert script.asked == [0, 1]
    [refused, looked] = result.tool_executions
    reason = "refused" if decision is False else decision
    assert refused["error"] == {"type": "ApprovalDenied", "message": f"not approved: {reason}"}
    assert looked["content"] == "order a: 30 EUR"


async def test_resume_without_a_decision_stays_paused(tmp_path: Path) -> None:
    # guarantee 177
    done: list[str] = []
    with Store(db=tmp_path / "r.sqlite") as store:
        runner = Runner(store=store)
        script = Script({0: call("refund", order="a"), 1: "ok"})
        agent = Agent(model=script.model(), tools=[_refund_tool(done)])
        first = await runner.run(agent, user_message="refund a", run_id="r", thread_id="t")
        second = await runner.resume(agent, run_id="r", thread_id="t")
    assert first.state == second.state == "paused" and done == []
    assert script.asked == [0]


def _one_step_plan(agent: Agent, store: Store, approvals: dict[str, Any] | None) -> Agent:
    """A durable Plan whose one step is ``agent``, resumed with ``approvals``."""
    plan = Plan(
        Step(agent), store=store, checkpoint_key="support-plan", resume=True, approvals=approvals
    )
    return Agent(engine=plan)


def _refund_plan(script: Script, store: Store, done: list[str]) -> Callable[..., Agent]:
    """``plan(approvals)``: :func:`_one_step_plan` of a support agent scripted by
    ``script`` whose refunds go to ``done``."""

    def plan(approvals: dict[str, Any] | None = None) -> Agent:
        llm = Agent(name="support", model=script.model(), tools=[_refund_tool(done)])
        return _one_step_plan(llm, store, approvals)

    return plan


async def test_approval_inside_a_plan_step(tmp_path: Path) -> None:
    # guarantee 180, 181
    done: list[str] = []
    with Store(db=tmp_path / "p.sqlite") as store:

        def plan(approvals: dict[str, Any] | None = None) -> Agent:
            llm = Agent(
                name="support",
                model=Script({0: call("refund", order="o-1"), 1: "refunded"}).model(),
                tools=[_refund_tool(done)],
            )
            return _one_step_plan(llm, store, approvals)

        env = await plan().run("refund o-1")
        assert not env.ok and env.error is not None and env.error.type == "PlanPaused"
        [pending] = env.metadata["pending_approvals"]
        assert pending["tool"] == "refund" and done == []
        assert store.read("support-plan")["status"] == "paused"
        env = await plan({pending["call_id"]: True}).run("refund o-1")
    assert env.ok and env.payload == "refunded" and done == ["o-1"]


async def test_unknown_call_id_in_a_plans_approvals_is_refused(tmp_path: Path) -> None:
    # guarantee 182: before, the Plan resumed, ignored the id and paused again
    done: list[str] = []
    script = Script({0: call("refund", order="o-1"), 1: "refunded"})
    with Store(db=tmp_path / "p.sqlite") as store:
        plan = _refund_plan(script, store, done)
        env = await plan().run("refund o-1")
        [pending] = env.metadata["pending_approvals"]
        before = store.read("support-plan")
        with pytest.raises(UserError, match=f"waits for \\['{pending['call_id']}'\\]"):
            await plan({"call_9_9": True}).run("refund o-1")
        assert store.read("support-plan") == before and script.asked == [0]
        env = await plan({pending["call_id"]: True}).run("refund o-1")
    assert env.ok and done == ["o-1"]


async def test_unknown_call_id_in_approvals_is_refused(tmp_path: Path) -> None:
    # guarantee 182
    with Store(db=tmp_path / "r.sqlite") as store:
        runner = Runner(store=store)
        agent = Agent(
            model=Script({0: call("refund", order="a"), 1: "ok"}).model(),
            tools=[_refund_tool([])],
        )
        paused = await runner.run(agent, user_message="refund a", run_id="r", thread_id="t")
        waiting = paused.pending_approvals[0]["call_id"]
        with pytest.raises(UserError, match=f"waits for \\['{waiting}'\\]"):
            await runner.resume(agent, run_id="r", thread_id="t", approvals={"nope": True})


def _support_with_billing(done: list[str]) -> tuple[Agent, Script, Script]:
    """A support agent whose subagent ``billing`` calls a tool that requires approval (the
    call ids of both runs are the same, call_0_0)."""
    sub = Script({0: call("refund", order="o-1"), 1: "billing: refunded"})
    top = Script({0: call("billing", task="refund o-1"), 1: "support: all done"})
    billing = Agent(
        name="billing",
        description="Handles billing.",
        model=sub.model(),
        tools=[_refund_tool(done)],
    )
    return Agent(name="support", model=top.model(), tools=[billing]), top, sub


async def test_a_subagents_approval_pauses_the_run(tmp_path: Path) -> None:
    # guarantee 177, 182: before, the subagent's pause escaped runner.run() as a raw
    # PlanPaused, left the run looking crashed, and no resume could approve the call
    done: list[str] = []
    with Store(db=tmp_path / "r.sqlite") as store:
        runner = Runner(store=store)
        agent, top, sub = _support_with_billing(done)
        paused = await runner.run(agent, user_message="refund o-1", run_id="r", thread_id="t")
        assert paused.state == "paused" and done == []
        [pending] = paused.pending_approvals
        assert pending["call_id"] == "subagent:0:0/call_0_0"
        assert pending["tool"] == "refund" and pending["subagent"] == "billing"
        assert pending["arguments"] == {"order": "o-1"}
        again = await runner.resume(agent, run_id="r", thread_id="t")  # no decision yet
        assert again.state == "paused" and done == []
        with pytest.raises(UserError, match="waits for \\['subagent:0:0/call_0_0'\\]"):
            await runner.resume(agent, run_id="r", thread_id="t", approvals={"call_0_0": True})
        result = await runner.resume(
            agent, run_id="r", thread_id="t", approvals={pending["call_id"]: True}
        )
    assert result.state == "completed", result.error
    assert result.final_text == "support: all done" and done == ["o-1"]
    assert top.asked == [0, 1] and sub.asked == [0, 1]  # no turn was asked twice
    # the same call again (a client retrying after a timeout): the stored result
    with Store(db=tmp_path / "r.sqlite") as store:
        again = await Runner(store=store).resume(
            agent, run_id="r", thread_id="t", approvals={pending["call_id"]: True}
        )
    assert again == result and done == ["o-1"]


async def test_a_subagents_approval_inside_a_plan_step(tmp_path: Path) -> None:
    # guarantee 180, 181
    done: list[str] = []
    with Store(db=tmp_path / "p.sqlite") as store:

        def plan(approvals: dict[str, Any] | None = None) -> Agent:
            return _one_step_plan(_support_with_billing(done)[0], store, approvals)

        env = await plan().run("refund o-1")
        assert not env.ok and env.error is not None and env.error.type == "PlanPaused"
        [pending] = env.metadata["pending_approvals"]
        assert pending["call_id"] == "subagent:0:0/call_0_0" and done == []
        env = await plan({pending["call_id"]: "not this month"}).run("refund o-1")
    assert env.ok and env.payload == "support: all done" and done == []


def _approved_then_killed(
    tmp_path: Path, server: LoopbackServer, in_doubt: str, *, recorded: bool = False
) -> tuple[Path, str]:
    """A run (its own process, the OpenAI SDK on loopback) paused on ``refund(o-1)``, then
    resumed with it approved (passed in ``approvals=``, or ``recorded`` with
    ``approve_call``, as ``stepstone approve`` does) and SIGKILLed inside the refund, after
    its side effect: the call's intent is committed, its outcome is not."""
    db = tmp_path / "a.sqlite"
    server.push([call("refund", order="o-1"), call("append", x="1")], "done")
    paused = run_worker("run", db, server, in_doubt=in_doubt)
    [pending] = paused["pending_approvals"]
    assert pending["reason"] == "requires_approval" and ledger(db) == ["append:1"]
    approvals: dict[str, Any] | None = {pending["call_id"]: True}
    if recorded:
        with Store(db=db) as store:
            approve_call(store, checkpoint_latest_key("r"), pending["call_id"])
        approvals = None
    proc = spawn("resume", db, server, in_doubt=in_doubt, approvals=approvals, hold_in="refund")
    kill_when(proc, Path(f"{db}.holding").exists)
    assert len(_refunds(db)) == 1
    return db, pending["call_id"]


def _refunds(db: Path) -> list[str]:
    return [line for line in ledger(db) if line.startswith("refund:")]


def _waiting(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["call_id"], p["reason"]) for p in result["pending_approvals"]]


@pytest.mark.crash
@pytest.mark.parametrize("decision", [False, True])
def test_a_crash_inside_an_approved_call_asks_again_as_in_doubt(
    tmp_path: Path, decision: bool
) -> None:
    # guarantee 173, 381: before, the resume asked for approval as if the call had never
    # run (reason requires_approval), and approving it again refunded twice, nobody told
    # that the first refund may have happened
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, call_id = _approved_then_killed(tmp_path, server, "ask")
        again = run_worker("resume", db, server, in_doubt="ask")
        assert again["state"] == "paused" and _waiting(again) == [(call_id, "in_doubt")]
        assert len(_refunds(db)) == 1
        done = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: decision})
        turns = [turn_of(r.json()) for r in server.requests]
    assert done["state"] == "completed" and done["final_text"] == "done"
    assert turns == [0, 1]  # the paused turn is replayed, never asked again
    refund = done["tool_executions"][0]
    if decision:  # the person chose to run it again: under the same idempotency key
        first, second = _refunds(db)
        assert first == second and refund["content"] == "refunded o-1"
    else:
        assert len(_refunds(db)) == 1
        assert refund["error"] == {"type": "ApprovalDenied", "message": "not approved: refused"}


@pytest.mark.crash
def test_a_crash_inside_an_approved_in_doubt_fail_call_fails_the_resume(tmp_path: Path) -> None:
    # guarantee 171, 381: before, the resume asked for approval again and only an
    # approval made the run fail
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, call_id = _approved_then_killed(tmp_path, server, "fail")
        result = run_worker("resume", db, server, in_doubt="fail")
        turns = [turn_of(r.json()) for r in server.requests]
    assert result["state"] == "failed" and result["pending_approvals"] == []
    assert result["error"]["type"] == "EffectInDoubtError"
    assert "'refund'" in result["error"]["message"] and call_id in result["error"]["message"]
    assert len(_refunds(db)) == 1 and turns == [0]


@pytest.mark.crash
def test_a_crash_inside_an_approved_in_doubt_rerun_call_runs_it_again(tmp_path: Path) -> None:
    # guarantee 172, 381: the approval stands for that call; "rerun" says running it again
    # is safe, under the same idempotency key. Before, it was asked for as a new approval
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, _ = _approved_then_killed(tmp_path, server, "rerun")
        result = run_worker("resume", db, server, in_doubt="rerun")
    assert result["state"] == "completed" and result["pending_approvals"] == []
    first, second = _refunds(db)
    assert first == second


@pytest.mark.crash
def test_a_recorded_approval_does_not_answer_the_in_doubt_question(tmp_path: Path) -> None:
    # guarantee 381: before, the decision recorded for the approval pause (`stepstone
    # approve`) matched the call's position again once it paused in doubt, and the next
    # resume ran the refund a second time by itself
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, call_id = _approved_then_killed(tmp_path, server, "ask", recorded=True)
        for _ in range(2):
            again = run_worker("resume", db, server, in_doubt="ask")
            assert again["state"] == "paused" and _waiting(again) == [(call_id, "in_doubt")]
        with Store(db=db) as store:
            [pending] = pending_approvals(*read_run(store, checkpoint_latest_key("r")))
        assert pending["decision"] is None
        assert len(_refunds(db)) == 1
        with Store(db=db) as store:  # a decision given for this pause is applied
            approve_call(store, checkpoint_latest_key("r"), call_id, decision="checked: done")
        done = run_worker("resume", db, server, in_doubt="ask")
    assert done["state"] == "completed" and len(_refunds(db)) == 1
    message = done["tool_executions"][0]["error"]["message"]
    assert message == "not approved: checked: done"


@pytest.mark.crash
def test_an_in_doubt_call_approved_and_crashed_in_again_is_asked_about_again(
    tmp_path: Path,
) -> None:
    # guarantee 381
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, call_id = _approved_then_killed(tmp_path, server, "ask")
        assert _waiting(run_worker("resume", db, server, in_doubt="ask")) == [(call_id, "in_doubt")]
        proc = spawn(
            "resume", db, server, in_doubt="ask", approvals={call_id: True}, hold_in="refund"
        )
        kill_when(proc, lambda: len(_refunds(db)) == 2)
        again = run_worker("resume", db, server, in_doubt="ask")
        assert again["state"] == "paused" and _waiting(again) == [(call_id, "in_doubt")]
        done = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: "enough"})
    assert done["state"] == "completed" and len(_refunds(db)) == 2


@pytest.mark.parametrize(
    ("approvals", "shown"),
    [
        (lambda cid: {cid: 1}, "call id 'ID' has 1 (int)"),
        (lambda cid: {cid: None}, "call id 'ID' has None (NoneType)"),
        (lambda cid: {cid: ""}, "call id 'ID' has '' (str)"),
        (lambda cid: {cid: "   "}, "call id 'ID' has '   ' (str)"),
        (lambda cid: [cid], "got a list ['ID']"),
        (lambda cid: {5: True}, "5 (int) is not a call id"),
    ],
)
async def test_a_resume_takes_only_true_false_or_a_reason(
    tmp_path: Path, approvals: Any, shown: str
) -> None:
    # guarantee 382, 60: before, {id: 1} and {id: ""} were refusals given to the model,
    # {id: None} was ignored (the run paused again) and a list was a bare TypeError
    done: list[str] = []
    script = Script({0: call("refund", order="a"), 1: "ok"})
    db = tmp_path / "r.sqlite"
    with Store(db=db) as store:
        runner = Runner(store=store)
        agent = Agent(model=script.model(), tools=[_refund_tool(done)])
        paused = await runner.run(agent, user_message="refund a", run_id="r", thread_id="t")
        call_id = paused.pending_approvals[0]["call_id"]
        before = stored_rows(db)
        with pytest.raises(UserError) as info:
            await runner.resume(agent, run_id="r", thread_id="t", approvals=approvals(call_id))
        message = str(info.value)
        assert shown.replace("ID", call_id) in message
        assert "must map call ids to True (run the call), False or a reason" in message
        assert stored_rows(db) == before and script.asked == [0]
        result = await runner.resume(agent, run_id="r", thread_id="t", approvals={call_id: True})
    assert result.state == "completed" and done == ["a"]


@pytest.mark.parametrize("decision", [True, "over the limit"])
async def test_decisions_given_to_a_finished_run_must_be_the_ones_it_applied(
    tmp_path: Path, decision: bool | str
) -> None:
    # guarantee 182: the same resume again (a client retrying after a timeout) gets the
    # stored result; before, any decision was ignored, so a refusal sent after the call
    # had run came back `completed`, as if it had been taken
    done: list[str] = []
    script = Script({0: call("refund", order="a"), 1: "ok"})
    db = tmp_path / "r.sqlite"
    with Store(db=db) as store:
        runner = Runner(store=store)
        agent = Agent(model=script.model(), tools=[_refund_tool(done)])
        paused = await runner.run(agent, user_message="refund a", run_id="r", thread_id="t")
        call_id = paused.pending_approvals[0]["call_id"]
        decided = {call_id: decision}
        result = await runner.resume(agent, run_id="r", thread_id="t", approvals=decided)
        assert result.state == "completed"
        before = stored_rows(db)
        again = await runner.resume(agent, run_id="r", thread_id="t", approvals=decided)
        assert again == result
        other = decision is not True
        late = "approved and started" if decision is True else "refused ('over the limit')"
        with pytest.raises(UserError, match=f"call '{call_id}' was already {re.escape(late)}"):
            await runner.resume(agent, run_id="r", thread_id="t", approvals={call_id: other})
        if decision is not True:  # another reason is not the refusal the model read
            with pytest.raises(UserError, match="was already refused"):
                await runner.resume(agent, run_id="r", thread_id="t", approvals={call_id: "no"})
        with pytest.raises(UserError, match=r"not waiting .* \['call_9_9'\]; it waits for nothing"):
            await runner.resume(agent, run_id="r", thread_id="t", approvals={"call_9_9": True})
        assert stored_rows(db) == before
    assert script.asked == [0, 1] and done == (["a"] if decision is True else [])


@pytest.mark.crash
def test_a_resume_retried_after_a_crash_inside_the_approved_call(tmp_path: Path) -> None:
    # guarantee 182, 381: the retry carries the approval the crashed resume applied: it is
    # not refused as unknown (before: "not waiting for approval"), and it does not answer
    # the in-doubt question either: the run pauses, the refund is not run again
    with LoopbackServer(OpenAIDialect(), model="gpt-4o") as server:
        db, call_id = _approved_then_killed(tmp_path, server, "ask")
        retried = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: True})
        assert retried["state"] == "paused" and _waiting(retried) == [(call_id, "in_doubt")]
        assert len(_refunds(db)) == 1
        # approved again, crashed in again, and that resume retried: asked about again
        proc = spawn(
            "resume", db, server, in_doubt="ask", approvals={call_id: True}, hold_in="refund"
        )
        kill_when(proc, lambda: len(_refunds(db)) == 2)
        retried = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: True})
        assert retried["state"] == "paused" and _waiting(retried) == [(call_id, "in_doubt")]
        assert len(_refunds(db)) == 2
        done = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: "it ran"})
        assert done["state"] == "completed"
        # the decisions applied along the way are all taken as retries; no other
        for decision in (True, "it ran"):
            again = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: decision})
            assert again == done
        refused = run_worker("resume", db, server, in_doubt="ask", approvals={call_id: "no"})
    assert refused["raised"] == "UserError" and "was already" in refused["message"]
    assert len(_refunds(db)) == 2


async def test_a_finished_plan_takes_only_the_decisions_it_applied(tmp_path: Path) -> None:
    # guarantee 182: as an agent run does; before, a finished Plan ignored any decision
    done: list[str] = []
    script = Script({0: call("refund", order="o-1"), 1: "refunded"})
    with Store(db=tmp_path / "p.sqlite") as store:
        plan = _refund_plan(script, store, done)
        env = await plan().run("refund o-1")
        [pending] = env.metadata["pending_approvals"]
        call_id = pending["call_id"]
        env = await plan({call_id: True}).run("refund o-1")
        assert env.ok and done == ["o-1"]
        again = await plan({call_id: True}).run("refund o-1")  # retried: the done run's
        assert again.ok and again.metadata["cached"] is True
        before = store.read("support-plan")
        with pytest.raises(UserError, match=f"call '{call_id}' was already approved and started"):
            await plan({call_id: False}).run("refund o-1")
        with pytest.raises(UserError, match=r"not waiting .* it waits for nothing"):
            await plan({"call_9_9": True}).run("refund o-1")
        assert store.read("support-plan") == before
    assert done == ["o-1"] and script.asked == [0, 1]
