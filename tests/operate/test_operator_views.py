"""What operators see (issue 36): the small things the commands said wrong or not at all,
on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from stepstone import Agent, Runner, Store, Worker, submit, tool
from stepstone.cli import app
from stepstone.durable._inspect import damaged_runs
from stepstone.testing import FunctionModel, call
from stepstone.ui import InspectorServer
from tests.operate._graph_crash import trip_graph
from tests.operate._runs import done_run, failed_run
from tests.operate.conftest import open_args
from tests.store.damage import flip, settle
from tests.workers.targets import make_plan, task

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout, result.stderr


def _json(*args: str) -> object:
    code, out, err = _run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_prune_says_which_runs_min_age_kept(store_args: list[str]) -> None:
    # guarantee 434: before, a dry run listed nothing and did not say why
    with open_args(store_args) as store:
        for i in range(3):
            done_run(store, f"job-{i}")
    args = ["prune", "--keep-last", "1", *store_args]  # --min-age: 5m by default
    dry = _json(*args, "--dry-run")
    assert isinstance(dry, dict) and dry["deleted"] == []
    assert sorted(dry["skipped_young"]) == ["job-0", "job-1"] and dry["min_age_seconds"] == 300
    code, out, _ = _run(*args, "--dry-run")
    assert code == 0 and "would delete 0 run(s)" in out
    assert "kept 2 run(s) the policy selects but updated less than --min-age 5m ago" in out
    code, out, _ = _run(*args, "--min-age", "0s", "--dry-run")
    assert code == 0 and "would delete 2 run(s)" in out and "--min-age" not in out


def test_queue_prints_errors_whole(store_args: list[str]) -> None:
    # guarantee 432: before, the error column was cut to 60 characters ending in "…"
    with open_args(store_args) as store:
        h = submit(store, "i36b_not_deployed_yet:nightly", "go", key="wrap-1")
        Worker(store, poll_interval=0.05).run(until_idle=True)
        error = " ".join(str(h.entry().error).split())
    assert len(error) > 150 and error.endswith("Worker(registry={...})")
    wide = runner.invoke(app, ["queue", *store_args], env={"COLUMNS": "600"})
    assert wide.exit_code == 0 and error in wide.stdout and "…" not in wide.stdout
    narrow = runner.invoke(app, ["queue", *store_args], env={"COLUMNS": "100"})
    assert narrow.exit_code == 0 and "…" not in narrow.stdout
    assert "Worker(registry={...})" in narrow.stdout  # the end of it, wrapped in its cell


def test_an_entry_that_never_got_a_checkpoint_is_requeued_from_the_shell(
    store_args: list[str], tmp_path: Path
) -> None:
    # guarantee 427: before, only Python's requeue_run() could (and only by run key)
    log = str(tmp_path / "log")
    target = "i36b_deployed_later:plan"
    with open_args(store_args) as store:
        h = submit(store, target, task(log, "late"), key="late-1")
        Worker(store, poll_interval=0.05).run(until_idle=True)
        assert h.status() == "failed" and "cannot import module" in str(h.entry().error)
        assert store.backend.run_get("late-1") is None  # no checkpoint to rewind
        code, _, err = _run("retry", "late-1", "--from", "extract", *store_args)
        assert code == 1 and "no run under key 'late-1'" in err
        assert f"`stepstone requeue {h.id[:12]}`" in err  # what to do instead
        code, out, err = _run("requeue", h.id[:12], *store_args)  # as `queue` prints it
        assert code == 0, err
        assert f"queue entry {h.id} (run late-1) is queued again in queue default" in out
        assert h.status() == "queued" and h.entry().attempts == 0 and h.entry().error is None
        code, _, err = _run("requeue", "late-1", *store_args)  # by run key: already queued
        assert code == 1 and "is queued: a worker runs it; nothing was changed" in err
        # the fix is deployed: the worker can load the target
        Worker(store, poll_interval=0.05, registry={target: make_plan()}).run(until_idle=True)
        assert h.result(timeout=5).ok and store.read("late-1")["status"] == "done"
    code, _, err = _run("requeue", "late-1", *store_args, "--json")
    assert code == 1 and "is done; nothing was changed" in err and "stepstone retry" in err
    code, _, err = _run("requeue", "nothing-like-it", *store_args)
    assert code == 1 and "no queue entry 'nothing-like-it'" in err


def test_history_and_diff_show_the_failed_step_and_its_error(store_args: list[str]) -> None:
    # guarantee 425: before, history's error column was empty and diff said "ends here"
    with open_args(store_args) as store:
        done_run(store, "good", payload="rows")  # extract -> "rows", load -> "rows!"
        failed_run(store, "bad")  # extract -> "rows", validate raises
    hist = _json("history", "bad", *store_args)
    assert isinstance(hist, list) and [(e["seq"], e["kind"], e["name"]) for e in hist] == [
        (1, "step", "extract"),
        (None, "failed", "validate"),
    ]
    assert hist[1]["error"]["type"] == "ValueError" and hist[1]["error"]["message"] == "bad row 7"
    code, out, _ = _run("history", "bad", *store_args)
    assert code == 0 and "bad: 1 journal row(s), then failed" in out
    assert "validate" in out and "ValueError: bad row 7" in out
    diff = _json("diff", "good", "bad", *store_args)
    assert isinstance(diff, dict) and diff["same_prefix"] == 1 and not diff["identical"]
    first = diff["first_difference"]
    assert first["a"]["name"] == "load" and first["b"]["kind"] == "failed"
    assert first["b"]["error"]["message"] == "bad row 7"
    code, out, _ = _run("diff", "good", "bad", *store_args)
    assert code == 0 and "ends here" not in out
    assert "good: #2 step load: rows!" in out
    assert "bad: failed validate: error ValueError: bad row 7" in out


def _stranded_invocation(store_args: list[str]) -> str:
    """The key of a graph invocation whose process died in its last node."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "_graph_crash.py"), *store_args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 9, proc.stderr
    with open_args(store_args) as store:
        (head,) = [h for h in store.backend.run_list("graph:") if h.status == "running"]
    return head.key


def test_a_resumed_graph_invocation_is_superseded_not_stranded(store_args: list[str]) -> None:
    # guarantee 423, 424: before, the resumed invocation stayed "dead" in `stranded`,
    # `runs` and the inspector, and its resume lock was listed as a run
    old = _stranded_invocation(store_args)
    stranded = _json("stranded", *store_args)
    assert isinstance(stranded, list) and [s["key"] for s in stranded] == [old]
    with open_args(store_args) as store:
        final = trip_graph(store).invoke(resume_invocation=old.removeprefix("graph:"))
        assert final.trace == ["book", "pack", "leave"]
        graphs = [h.key for h in store.backend.run_list("graph:") if h.kind == "graph"]
        (new,) = [key for key in graphs if key != old]
        assert store.backend.run_get(old + "#resume") is not None  # the lock is still there
    assert _json("stranded", *store_args) == []
    listed = _json("runs", *store_args)
    assert isinstance(listed, list)
    assert sorted(r["key"] for r in listed) == sorted([old, new])  # no "#resume" row
    by_key = {r["key"]: r for r in listed}
    assert by_key[old]["owner"]["state"] == "superseded"
    assert by_key[old]["superseded_by"] == new and by_key[new]["superseded_by"] is None
    code, out, _ = _run("runs", *store_args)
    assert code == 0 and f"superseded by {new}" in out and "dead" not in out
    assert "#resume" not in out
    shown = _json("show", old, *store_args)
    assert isinstance(shown, dict)
    assert shown["owner"] == "superseded" and shown["superseded_by"] == new
    code, out, _ = _run("show", old, *store_args)
    assert code == 0 and f"superseded by {new}" in out
    locks = _json("runs", "--kind", "graph.resume", *store_args)  # named: listed
    assert isinstance(locks, list) and [r["key"] for r in locks] == [old + "#resume"]
    with open_args(store_args) as store, InspectorServer(store, port=0).start() as server:
        runs = _get(server.url + "api/runs")["runs"]
        assert sorted(r["key"] for r in runs) == sorted([old, new])
        (was,) = [r for r in runs if r["key"] == old]
        assert was["owner"] == "superseded" and was["superseded_by"] == new
        one = _get(server.url + "api/run?key=" + urllib.parse.quote(old))
        assert one["owner"] == "superseded" and one["superseded_by"] == new
        narrow = _get(server.url + "api/runs?prefix=" + urllib.parse.quote(old))["runs"]
        assert [r["superseded_by"] for r in narrow] == [new]  # its successor lies outside


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    return f"refunded {amount} EUR on {order}"


def _refund_run(store: Store, run_id: str) -> None:
    """An agent run that paused for approval of a refund, was approved and resumed."""
    replies = {0: call("refund", order="o-42", amount=30), 1: "Refund issued."}
    agent = Agent(model=FunctionModel(lambda r: replies[r.turn]), tools=[refund])
    runner = Runner(store=store)
    paused = runner.run_sync(agent, user_message="Refund o-42", run_id=run_id, thread_id="t")
    assert paused.state == "paused"
    done = runner.resume_sync(agent, run_id=run_id, thread_id="t", approvals={"call_0_0": True})
    assert done.state == "completed"


def test_agent_runs_in_the_shell_are_named_by_run_id_and_told_in_turns(
    store_args: list[str],
) -> None:
    # guarantee 428, 429, 430: before, `show bill-1` found nothing, history listed journal
    # rows (phase, intent, snapshot...) and "steps" counted them
    with open_args(store_args) as store:
        _refund_run(store, "bill-1")
    key = "agent:bill-1:checkpoint:latest"
    shown = _json("show", "bill-1", *store_args)
    assert isinstance(shown, dict) and shown["key"] == key and shown["status"] == "done"
    assert shown["steps"] == 3  # model turn 0, the refund, model turn 1
    hist = _json("history", "bill-1", *store_args, "--payloads")
    assert isinstance(hist, list)
    assert [(e["kind"], e["name"]) for e in hist] == [
        ("run", "started"),
        ("model", "function-model"),
        ("end", "paused"),
        ("run", "resumed"),  # where the resume took over
        ("tool", "refund"),
        ("model", "function-model"),
        ("end", "completed"),
    ]
    model, tool_call = hist[1], hist[4]
    assert model["payload"]["tool_calls"] == [
        {"id": "call_0_0", "name": "refund", "arguments": {"order": "o-42", "amount": 30}}
    ]
    assert tool_call["arguments"] == {"order": "o-42", "amount": 30}
    assert tool_call["payload"] == "refunded 30 EUR on o-42" and tool_call["state"] == "done"
    code, out, _ = _run("history", "bill-1", *store_args)
    assert code == 0 and "agent run, 2 turn(s), 1 tool call(s), 2 run(s)" in out
    assert "turn 0: refund(order='o-42', amount=30)" in out and "resumed" in out
    assert "refund(order='o-42', amount=30) -> 'refunded 30 EUR on o-42'" in out
    (listed,) = [r for r in _json("runs", *store_args) if r["key"] == key]  # type: ignore[union-attr]
    assert listed["steps"] == 3 and listed["damaged"] is None


def test_runs_flags_a_run_with_a_damaged_journal_row(tmp_path: Path) -> None:
    # guarantee 431: before, its head read, so `runs` listed it as done
    db = tmp_path / "runs.sqlite"
    with Store(db=db) as store:
        _refund_run(store, "bill-2")
        done_run(store, "fine")
    settle(db)
    flip(db, b"refunded 30 EUR on o-42")  # a byte of the tool's result, on the disk
    listed = {r["key"]: r for r in _json("runs", "--db", str(db))}  # type: ignore[union-attr]
    bad = listed["agent:bill-2:checkpoint:latest"]
    assert bad["status"] == "done" and "does not match its checksum" in bad["damaged"]
    assert listed["fine"]["damaged"] is None
    code, out, _ = _run("runs", "--db", str(db))
    assert code == 0 and "done, damaged" in out
    many = ["agent:bill-2:checkpoint:latest", "fine", *(f"absent-{i}" for i in range(300))]
    with Store(db=db, read_only=True) as store:  # a listing of most of a store: one pass
        assert list(damaged_runs(store, many)) == ["agent:bill-2:checkpoint:latest"]
    with Store(db=db, read_only=True) as store, InspectorServer(store, port=0).start() as server:
        runs = {r["key"]: r for r in _get(server.url + "api/runs")["runs"]}
        assert "does not match its checksum" in runs["agent:bill-2:checkpoint:latest"]["damaged"]
        assert runs["fine"]["damaged"] is None


def test_the_operator_views_name_agent_runs_as_the_runner_keys_them() -> None:
    from stepstone.durable._inspect import agent_key
    from stepstone.engines.llm._durable import location_key

    assert agent_key("bill-1") == location_key("bill-1") == "agent:bill-1:checkpoint:latest"
