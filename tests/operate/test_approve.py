"""`stepstone approve`: a decision recorded from the shell is applied by the run's next
resume, for a Runner agent run and for an LLM step inside a Plan, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from stepstone import Agent, Plan, Runner, Step, Store, tool
from stepstone.durable import approve_call, pending_approvals, read_run
from stepstone.exceptions import ApprovalTargetError
from stepstone.testing import FunctionModel, call
from tests.operate.conftest import open_args

cli = CliRunner()
ENV = {"COLUMNS": "200"}


def _run(*args: str) -> tuple[int, str, str]:
    from stepstone.cli import app

    result = cli.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout, result.stderr


def _refund_agent(ran: list[str]) -> Agent:
    @tool(requires_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append(order)
        return f"refunded {amount} EUR on {order}"

    def reply(request: Any) -> Any:
        if request.turn == 0:
            return call("refund", order="o-42", amount=30)
        (result,) = request.messages[-1].tool_results
        return f"model saw: {result.content}"

    return Agent(model=FunctionModel(reply), tools=[refund], name="support")


def _paused_refund(store: Store, ran: list[str]) -> tuple[Runner, Agent, str, str]:
    """A run of :func:`_refund_agent` paused on its refund's approval: the runner, the
    agent, the call's id and the run's key."""
    runner = Runner(store=store)
    agent = _refund_agent(ran)
    paused = runner.run_sync(agent, user_message="Refund o-42", run_id="rf", thread_id="t")
    assert paused.state == "paused"
    key = next(k for k in store.keys() if "rf" in k)
    return runner, agent, paused.pending_approvals[0]["call_id"], key


def test_approve_a_runner_run_then_resume_without_approvals(store_args: list[str]) -> None:
    # guarantee 290
    # a recorded decision is applied by the next resume
    ran: list[str] = []
    with open_args(store_args) as store:
        runner, agent, call_id, key = _paused_refund(store, ran)

        code, out, err = _run("approve", key, call_id, *store_args, "--json")
        assert code == 0, err
        done = json.loads(out)
        assert done == {
            "key": key,
            "run_key": key,
            "call_id": call_id,
            "tool": "refund",
            "arguments": {"order": "o-42", "amount": 30},
            "decision": True,
            "previous": None,
            "changed": True,
        }
        assert ran == []  # recorded only: the run's own resume runs the call
        found = read_run(store, key)
        assert found is not None
        assert pending_approvals(*found)[0]["decision"] is True

        final = runner.resume_sync(agent, run_id="rf", thread_id="t")
        assert final.state == "completed", final.error
        assert ran == ["o-42"]
        assert final.tool_executions[0]["content"] == "refunded 30 EUR on o-42"
        # Finished: nothing left to approve.
        code, _, err = _run("approve", key, call_id, *store_args)
        assert code == 1 and err.count("\n") == 1
        assert f"run {key!r} is not paused on a tool approval" in err


def test_deny_gives_the_model_the_reason(store_args: list[str]) -> None:
    # a recorded decision is applied by the next resume
    ran: list[str] = []
    with open_args(store_args) as store:
        runner, agent, call_id, key = _paused_refund(store, ran)
        code, out, err = _run("approve", key, call_id, "--deny", "over the limit", *store_args)
        assert code == 0, err
        assert f"denied (over the limit) refund call {call_id}" in " ".join(out.split())
        final = runner.resume_sync(agent, run_id="rf", thread_id="t")
        assert final.state == "completed" and ran == []
        assert final.tool_executions[0]["error"]["type"] == "ApprovalDenied"
        assert "over the limit" in final.tool_executions[0]["error"]["message"]


def test_a_recorded_decision_is_never_replaced_silently(store_args: list[str]) -> None:
    """guarantee 372: one operator approves, a second denies the same call: the deny is
    refused, naming the decision that stands (before, it replaced the approval and both
    were told their decision would be applied); --replace changes it on purpose, and the
    same decision again writes nothing."""
    ran: list[str] = []
    with open_args(store_args) as store:
        runner, agent, call_id, key = _paused_refund(store, ran)
        assert _run("approve", key, call_id, *store_args)[0] == 0  # operator A

        code, out, err = _run("approve", key, call_id, "--deny", "too much", *store_args)  # B
        assert code == 1 and out == "" and err.count("\n") == 1
        assert f"tool call {call_id!r} of run {key!r} is already approved" in err
        assert "nothing was changed" in err and "--replace" in err
        found = read_run(store, key)
        assert found is not None and pending_approvals(*found)[0]["decision"] is True

        version = found[0].version
        code, out, err = _run("approve", key, call_id, *store_args, "--json")  # A again
        assert code == 0, err
        assert json.loads(out)["changed"] is False and json.loads(out)["previous"] is True
        code, out, _ = _run("approve", key, call_id, *store_args)
        assert "is already approved; nothing changed" in " ".join(out.split())
        found = read_run(store, key)
        assert found is not None and found[0].version == version  # nothing written

        code, out, err = _run(
            "approve", key, call_id, "--deny", "too much", "--replace", *store_args
        )
        assert code == 0, err
        assert "denied (too much) refund call" in " ".join(out.split())
        assert "(it was approved)" in " ".join(out.split())
        final = runner.resume_sync(agent, run_id="rf", thread_id="t")
        assert final.state == "completed" and ran == []  # the decision that stands: denied
        assert "too much" in final.tool_executions[0]["error"]["message"]


def test_approve_call_never_replaces_a_recorded_decision_silently(
    store_args: list[str],
) -> None:
    """guarantee 372: the Python API keeps the same rule: a different decision raises
    ApprovalTargetError naming the one that stands and writes nothing, replace=True changes
    it, and the same decision again changes nothing."""
    with open_args(store_args) as store:
        runner = Runner(store=store)
        paused = runner.run_sync(
            _refund_agent([]), user_message="Refund", run_id="rp", thread_id="t"
        )
        call_id = paused.pending_approvals[0]["call_id"]
        key = next(k for k in store.keys() if "rp" in k)
        first = approve_call(store, key, call_id)
        assert (first["previous"], first["changed"]) == (None, True)
        version = store.backend.run_get(key).version  # type: ignore[union-attr]
        with pytest.raises(ApprovalTargetError, match="is already approved; nothing was changed"):
            approve_call(store, key, call_id, decision="no")
        assert approve_call(store, key, call_id)["changed"] is False
        assert store.backend.run_get(key).version == version  # type: ignore[union-attr]
        changed = approve_call(store, key, call_id, decision="no", replace=True)
        assert (changed["previous"], changed["changed"]) == (True, True)
        found = read_run(store, key)
        assert found is not None and pending_approvals(*found)[0]["decision"] == "no"


def test_an_explicit_decision_wins_over_a_recorded_one(store_args: list[str]) -> None:
    # guarantee 290
    # approvals= passed to resume wins over a recorded decision
    ran: list[str] = []
    with open_args(store_args) as store:
        runner, agent, call_id, key = _paused_refund(store, ran)
        assert _run("approve", key, call_id, "--deny", "no", *store_args)[0] == 0
        final = runner.resume_sync(agent, run_id="rf", thread_id="t", approvals={call_id: True})
        assert final.state == "completed" and ran == ["o-42"]


def _plan(store: Store, agent: Agent) -> Agent:
    return Agent(
        engine=Plan(
            Step(str.strip, name="clean"),
            Step(agent, name="support"),
            store=store,
            checkpoint_key="refunds",
            resume=True,
        )
    )


def test_approve_an_llm_step_of_a_paused_plan_by_the_plan_key(store_args: list[str]) -> None:
    # guarantee 291
    # recorded decision applied by Plan(resume=True); errors name the waiting ids
    ran: list[str] = []
    with open_args(store_args) as store:
        agent = _refund_agent(ran)
        env = _plan(store, agent)(" refund o-42 ")
        assert env.error is not None and env.error.type == "PlanPaused"
        call_id = env.metadata["pending_approvals"][0]["call_id"]

        code, _, err = _run("approve", "refunds", "call_9_9", *store_args)
        assert code == 1 and err.count("\n") == 1
        assert f"does not wait for tool call 'call_9_9'; it waits for {call_id}" in err
        code, _, err = _run("approve", "refundz", call_id, *store_args)
        assert code == 1 and "no run under key 'refundz'" in err

        code, out, err = _run("approve", "refunds", call_id, *store_args, "--json")
        assert code == 0, err
        done = json.loads(out)
        assert done["key"] == "refunds"
        assert re.fullmatch("refunds:[0-9a-f]{12}:support:2:llm", done["run_key"])
        assert ran == []
        env = _plan(store, agent)(" refund o-42 ")
        assert env.ok, env.error
        assert ran == ["o-42"]
        assert env.payload == "model saw: refunded 30 EUR on o-42"


def test_show_lists_phases_effects_replays_and_pending_approvals(store_args: list[str]) -> None:
    # guarantee 293
    ran: list[str] = []
    with open_args(store_args) as store:
        runner, agent, call_id, key = _paused_refund(store, ran)

        code, out, err = _run("show", key, *store_args, "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert [p["call_id"] for p in shown["pending_approvals"]] == [call_id]
        assert shown["pending_approvals"][0]["run_key"] == key
        assert shown["pending_approvals"][0]["decision"] is None
        view = shown["agent"]
        assert view["agent_state"] == "paused"
        assert view["phases"][0]["phase"] == "run_started"
        assert [(e["position"], e["state"], e["replays"]) for e in view["effects"]] == [
            ("model:0:0", "done", 0)
        ]
        code, out, _ = _run("show", key, *store_args)
        assert code == 0 and "waiting for approval of 1 tool call(s)" in out
        assert f"stepstone approve {key} CALL_ID" in " ".join(out.split())

        assert _run("approve", key, call_id, *store_args)[0] == 0
        final = runner.resume_sync(agent, run_id="rf", thread_id="t")
        assert final.state == "completed"
        shown = json.loads(_run("show", key, *store_args, "--json")[1])
        assert shown["pending_approvals"] == []
        effects = {e["position"]: e for e in shown["agent"]["effects"]}
        assert effects["model:0:0"]["replays"] == 1  # the resume replayed the first answer
        assert effects["tool:0:0"]["replays"] == 0 and effects["tool:0:0"]["name"] == "refund"
        assert effects["model:1:0"]["replays"] == 0
        replayed = sum(e["replays"] for e in shown["agent"]["effects"])
        assert replayed == final.replayed_effect_count
        assert [p["phase"] for p in shown["agent"]["phases"]].count("run_started") == 2
        code, out, _ = _run("show", key, *store_args)
        assert "over 2 run(s)" in " ".join(out.split())


def test_show_a_paused_plan_lists_the_calls_its_llm_step_waits_on(
    store_args: list[str],
) -> None:
    # guarantee 293
    with open_args(store_args) as store:
        env = _plan(store, _refund_agent([]))(" refund o-42 ")
        call_id = env.metadata["pending_approvals"][0]["call_id"]
        shown = json.loads(_run("show", "refunds", *store_args, "--json")[1])
        (waiting,) = shown["pending_approvals"]
        assert waiting["call_id"] == call_id and waiting["tool"] == "refund"
        assert re.fullmatch("refunds:[0-9a-f]{12}:support:2:llm", waiting["run_key"])
        assert "agent" not in shown  # a Plan run: its own timeline


def test_a_decision_never_approves_a_later_call_that_reuses_the_id(
    store_args: list[str],
) -> None:
    # guarantee 291
    from stepstone.providers import ToolCall

    ran: list[str] = []

    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        ran.append(order)
        return f"refunded {order}"

    script = {
        0: ToolCall(id="c1", name="refund", arguments={"order": "o-1"}),
        1: ToolCall(id="c1", name="refund", arguments={"order": "o-2"}),
        2: "both refunded",
    }
    agent = Agent(model=FunctionModel(lambda r: script[r.turn]), tools=[refund])
    with open_args(store_args) as store:
        runner = Runner(store=store)
        runner.run_sync(agent, user_message="refund both", run_id="twice", thread_id="t")
        key = next(k for k in store.keys() if "twice" in k)
        assert _run("approve", key, "c1", *store_args)[0] == 0
        again = runner.resume_sync(agent, run_id="twice", thread_id="t")
        assert ran == ["o-1"] and again.state == "paused"  # the second c1 waits for a person
        (waiting,) = json.loads(_run("show", key, *store_args, "--json")[1])["pending_approvals"]
        assert waiting["arguments"] == {"order": "o-2"} and waiting["decision"] is None
        code, _, err = _run("approve", key, "c1", "--deny", "", *store_args)
        assert code == 1 and "empty reason" in err
        assert _run("approve", key, "c1", *store_args)[0] == 0
        final = runner.resume_sync(agent, run_id="twice", thread_id="t")
        assert final.state == "completed" and ran == ["o-1", "o-2"]
