"""The operator commands on SQLite and PostgreSQL: tables, --json shapes, one-line errors."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Agent, Plan, Step, Store
from stepstone.cli import app
from tests.operate._runs import done_run, failed_run
from tests.operate.conftest import open_args

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def _run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.stdout, result.stderr


def _json(*args: str) -> object:
    code, out, err = _run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_show_history_diff_stranded(store_args: list[str]) -> None:
    # guarantee 270, 271, 272, 273
    with open_args(store_args) as store:
        done_run(store, "a", payload="same")
        done_run(store, "b", payload="other")
        failed_run(store, "bad")
    show = _json("show", "bad", *store_args)
    assert isinstance(show, dict)
    assert show["status"] == "failed" and show["owner"] == "none"
    assert show["error"]["type"] == "ValueError" and show["error"]["message"] == "bad row 7"
    assert show["record"]["completed_steps"] == ["extract"]
    assert [e["kind"] for e in show["timeline"]] == ["step", "failed"]
    code, out, _ = _run("show", "bad", *store_args)
    assert code == 0 and "error at 'validate': ValueError: bad row 7" in out

    hist = _json("history", "a", *store_args)
    assert isinstance(hist, list)
    times = ("started_at", "committed_at", "duration_seconds", "gap_seconds")
    assert all(e.pop(t) is not None for e in hist for t in times)  # guarantee 421
    assert hist == [
        {
            "seq": 1,  # seq 0 is the plan's record of its steps
            "kind": "step",
            "name": "extract",
            "error": None,
            "iteration": 1,
            "writes": "a.raw",
        },
        {"seq": 2, "kind": "step", "name": "load", "error": None, "iteration": 2},
    ]
    with_payloads = _json("history", "a", "--payloads", *store_args)
    assert isinstance(with_payloads, list)
    assert [e["payload"] for e in with_payloads] == ["same", "same!"]
    code, out, _ = _run("history", "a", "--payloads", *store_args)
    assert code == 0 and "same!" in out

    diff = _json("diff", "a", "b", *store_args)
    assert isinstance(diff, dict)
    assert diff["same_prefix"] == 0 and not diff["identical"]
    assert diff["first_difference"]["a"]["payload"] == "same"
    assert diff["first_difference"]["b"]["payload"] == "other"
    code, out, _ = _run("diff", "a", "b", *store_args)
    assert code == 0 and "a: #1 step extract: same" in out

    assert _json("stranded", *store_args) == []


def test_prune_dry_run_then_prune(store_args: list[str]) -> None:
    # guarantee 274
    with open_args(store_args) as store:
        for i in range(3):
            done_run(store, f"job-{i}")
        failed_run(store, "job-failed")
    time.sleep(0.05)
    args = ["prune", "--keep-last", "1", "--min-age", "0s", *store_args]
    dry = _json(*args, "--dry-run")
    assert isinstance(dry, dict) and dry["dry_run"] is True
    assert [d["key"] for d in dry["deleted"]] == ["job-0", "job-1"]
    assert set(dry["deleted"][0]) == {"key", "kind", "status", "updated_at", "reason", "values"}
    with open_args(store_args) as store:
        assert len(store.backend.run_list(None)) == 4
    code, out, _ = _run(*args)
    assert code == 0 and "deleted 2 run(s)" in out
    with open_args(store_args) as store:
        assert sorted(h.key for h in store.backend.run_list(None)) == ["job-2", "job-failed"]
    done = _json("prune", "--ttl", "0s", "--min-age", "0s", "--status", "failed", *store_args)
    assert isinstance(done, dict) and [d["key"] for d in done["deleted"]] == ["job-failed"]
    both = _json(  # --status takes a comma list, as `runs --status` does
        "prune",
        "--dry-run",
        "--ttl",
        "0s",
        "--min-age",
        "0s",
        "--status",
        "done,failed",
        *store_args,
    )
    assert isinstance(both, dict) and [d["key"] for d in both["deleted"]] == ["job-2"]
    with open_args(store_args) as store:
        for i in range(2):
            done_run(store, f"a-{i}")
            done_run(store, f"b-{i}")
    per = ["--keep-last", "1", "--min-age", "0s", "--prefix", "a-", "--prefix", "b-"]
    grouped = _json("prune", *per, *store_args)
    assert isinstance(grouped, dict)
    assert sorted(d["key"] for d in grouped["deleted"]) == ["a-0", "b-0"]


def test_cancel_and_fork_commands(store_args: list[str]) -> None:
    # guarantee 268, 269
    with open_args(store_args) as store:
        failed_run(store, "bad")
        done_run(store, "ok")
    assert _json("cancel", "bad", *store_args) == {
        "key": "bad",
        "outcome": "cancelled (failed run, no live owner): marked failed; its error is kept "
        "as previous_error",
    }
    forked = _json("fork", "ok", "--at", "extract", "--to", "ok-2", *store_args)
    assert forked == {"key": "ok-2", "from": "ok", "next_step": "load"}
    code, out, _ = _run("show", "ok-2", *store_args)
    assert code == 0 and "status paused" in out
    retried = _json("retry", "ok", "--from", "load", *store_args)
    assert retried == {
        "key": "ok",
        "next_step": "load",
        "status": "paused",
        "requeued": None,
        "queued": None,
    }


def test_failures_are_one_line_with_exit_status_1(store_args: list[str], tmp_path: Path) -> None:
    # guarantee 275
    with open_args(store_args) as store:
        done_run(store, "ok")
    cases = [
        (["show", "nope", *store_args], "no run under key 'nope'"),
        (["history", "nope", *store_args], "no run under key 'nope'"),
        (["diff", "ok", "nope", *store_args], "no run under key 'nope'"),
        (["cancel", "ok", *store_args], "already done"),
        (["fork", "ok", "--at", "zz", "--to", "x", *store_args], "no step 'zz'"),
        (["retry", "ok", "--from", "zz", *store_args], "no step 'zz'"),
        (["prune", *store_args], "pass --ttl AGE"),
        (["prune", "--ttl", "soon", *store_args], "bad age 'soon'"),
        (["show", "ok", "--db", str(tmp_path / "missing.sqlite")], "no store file at"),
        (["show", "ok"], "pass exactly one of --db FILE or --url URL"),  # a wrong command line
    ]
    for args, message in cases:
        code, out, err = _run(*args)
        assert code == (2 if "--db" not in args and "--url" not in args else 1), (args, out, err)
        assert err.startswith("error: ") and message in err, (args, err)
        assert err.count("\n") == 1, err
        assert "Traceback" not in out + err
    # --debug lets the exception (and so its traceback) through instead
    debug = runner.invoke(app, ["show", "nope", *store_args, "--debug"], env=ENV)
    assert debug.exit_code == 1 and "no run under key 'nope'" in str(debug.exception)


def test_vacuum_command_reports_the_shrink(tmp_path: Path) -> None:
    # guarantee 267
    db = tmp_path / "v.sqlite"
    from stepstone import Store

    with Store(db=db) as store:
        for i in range(40):
            done_run(store, f"big-{i}", payload="z" * 20_000)
            store.delete(f"big-{i}.raw")
    assert _run("prune", "--keep-last", "0", "--min-age", "0s", "--db", str(db))[0] == 0
    report = _json("vacuum", "--db", str(db))
    assert isinstance(report, dict) and report["full"] is True
    assert report["bytes_after"] < report["bytes_before"] / 3
    assert db.stat().st_size == report["bytes_after"]
    code, out, _ = _run("vacuum", "--db", str(db))
    assert code == 0 and "(incremental)" in out


@pytest.mark.postgres
def test_vacuum_on_postgres_frees_pruned_space(pg_url: str) -> None:
    # guarantee 267
    from stepstone import Store

    with Store(url=pg_url) as store:
        for key in store.keys():
            store.delete(key)
        for i in range(30):  # incompressible: PostgreSQL would store "q" * 20_000 in bytes
            done_run(store, f"pg-big-{i}", payload=base64.b64encode(os.urandom(15_000)).decode())
    assert _run("prune", "--keep-last", "0", "--min-age", "0s", "--url", pg_url)[0] == 0
    report = _json("vacuum", "--url", pg_url)
    assert isinstance(report, dict) and report["full"] is False
    assert report["bytes_after"] < report["bytes_before"], report


@pytest.mark.parametrize(
    "command",
    [
        ["show", "k"],
        ["history", "k"],
        ["stranded"],
        ["diff", "a", "b"],
        ["prune", "--dry-run", "--ttl", "1d"],
        ["prune", "--ttl", "1d"],
        ["vacuum"],
        ["cancel", "k"],
    ],
)
def test_commands_never_write_to_a_database_that_is_not_a_stepstone_store(
    tmp_path: Path, command: list[str]
) -> None:
    # guarantee 144
    import sqlite3

    path = tmp_path / "app.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    before = path.read_bytes()
    code, _, err = _run(*command, "--db", str(path))
    assert code == 1 and "not a stepstone store" in err and len(err.strip().splitlines()) == 1
    assert path.read_bytes() == before  # no table created, journal mode untouched


def test_text_that_looks_like_markup_is_printed_as_it_is(tmp_path: Path) -> None:
    # guarantee 270, 282: keys, payloads and error messages are the users'; a "[/]" in one
    # made the commands crash after their write had landed, and "[bold]" vanished
    db = str(tmp_path / "markup.sqlite")
    with Store(db=db) as store:
        done_run(store, "weird[/]key", payload="payload [/] here")
        done_run(store, "[bold]loud", payload="x")

        def broken(payload: object) -> str:
            raise ValueError("expected [/] closing")

        plan = Plan(Step(lambda p: "rows", name="extract"), Step(broken, name="validate"),
                    store=store, checkpoint_key="bad[/]")  # fmt: skip
        Agent(engine=plan)("go")
    assert "expected [/] closing" in _run("show", "bad[/]", "--db", db)[1]
    for args in (
        ("show", "weird[/]key"),
        ("show", "[bold]loud"),
        ("show", "bad[/]"),
        ("history", "weird[/]key", "--payloads"),
        ("diff", "weird[/]key", "[bold]loud"),
        ("fork", "weird[/]key", "--at", "extract", "--to", "fork[/]x"),
        ("retry", "bad[/]", "--from", "validate"),
        ("cancel", "bad[/]"),
    ):
        code, out, err = _run(*args, "--db", db)
        assert code == 0, (args, out, err)
        assert "Traceback" not in out + err
    assert "[bold]loud" in _run("show", "[bold]loud", "--db", db)[1]
    assert "payload [/] here" in _run("history", "weird[/]key", "--payloads", "--db", db)[1]


def test_debug_before_the_command_or_in_the_environment_shows_the_traceback(
    tmp_path: Path,
) -> None:
    # guarantee 145: the operator commands honoured only a --debug after the command
    db = str(tmp_path / "d.sqlite")
    Store(db=db).close()
    for args, env in (
        (["--debug", "show", "nope", "--db", db], ENV),
        (["show", "nope", "--db", db], {**ENV, "STEPSTONE_DEBUG": "1"}),
        (["--debug", "check", "--url", "sqlite:///nowhere/x.sqlite"], ENV),
    ):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 1 and result.exception is not None, args
        assert not isinstance(result.exception, SystemExit), args
    plain = runner.invoke(app, ["show", "nope", "--db", db], env=ENV)
    assert isinstance(plain.exception, SystemExit) and "error: no run under key" in plain.stderr


def test_diff_tells_runs_that_differ_only_in_how_they_ended(tmp_path: Path) -> None:
    # guarantee 272: the same journal, one failed and one cancelled, is no identical pair
    from stepstone.durable import cancel_run

    db = str(tmp_path / "ends.sqlite")
    with Store(db=db) as store:
        failed_run(store, "one")
        failed_run(store, "two")
        cancel_run(store, "two")
    diff = _json("diff", "one", "two", "--db", db)
    assert isinstance(diff, dict) and not diff["identical"]
    assert diff["ends"]["a"]["error"]["type"] == "ValueError"
    assert diff["ends"]["b"]["error"]["type"] == "RunCancelledError"
    code, out, _ = _run("diff", "one", "two", "--db", db)
    assert code == 0 and "identical" in out and "the two runs are identical" not in out
    assert "ValueError: bad row 7" in out and "RunCancelledError" in out
    with Store(db=db) as store:
        failed_run(store, "three")
    assert _json("diff", "one", "three", "--db", db)["identical"]  # type: ignore[index]


def test_out_of_range_arguments_are_refused_without_a_traceback(tmp_path: Path) -> None:
    # guarantee 275: these were OverflowError or ValueError tracebacks, or accepted
    db = str(tmp_path / "r.sqlite")
    Store(db=db).close()
    for args, code, said in (
        (["prune", "--ttl", "1000000000w", "--dry-run", "--db", db], 1, "bad age"),
        (["runs", "--newer-than", "1000000000w", "--db", db], 2, "bad age"),
        (["check", "--url", "mysql://x/y"], 1, "unsupported store URL scheme 'mysql'"),
        (["ui", "--db", db, "--port", "99999"], 2, "--port"),
        (["worker", "--db", db, "--shutdown-timeout", "-5", "--until-idle"], 2, "shutdown"),
        (["worker", "--db", db, "--max-runs", "0"], 2, "max-runs"),
    ):
        result = runner.invoke(app, args, env=ENV)
        text = result.stdout + result.stderr
        assert result.exit_code == code, (args, text)
        assert said in text and "Traceback" not in text, (args, text)
        assert not isinstance(result.exception, OverflowError | ValueError), args


def test_retry_and_fork_of_a_graph_or_agent_run_say_they_take_plan_runs(
    store_args: list[str],
) -> None:
    """guarantee 375: retry and fork cut a Plan's journal of steps; on a graph or an agent
    run they say so and how to run it again, and write nothing (before, they answered
    that the run has no such step, `steps: []`, for a node the graph had run)."""
    from stepstone import Runner
    from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer
    from stepstone.testing import FunctionModel

    class Claim(State):
        amount: int = 0

    def decide(state: Claim) -> dict[str, int]:
        raise RuntimeError("too big")

    with open_args(store_args) as store:
        graph = (
            GraphBuilder(Claim)
            .add_node("assess", lambda s: {"amount": s.amount + 50})
            .add_node("decide", decide)
            .add_edge("assess", "decide")
            .add_edge("decide", END)
            .set_entry("assess")
            .with_checkpointer(StoreCheckpointer(store))
            .compile()
        )
        with pytest.raises(Exception, match="too big"):
            graph.invoke(Claim(amount=10))
        agent = Agent(model=FunctionModel(lambda r: "hello"), name="greeter")
        Runner(store=store).run_sync(agent, user_message="hi", run_id="greet", thread_id="t")
        heads = {h.kind: h for h in store.backend.run_list(None)}
    cases = [
        (heads["graph"], ["retry", heads["graph"].key, "--from", "assess"], "retry"),
        (heads["graph"], ["fork", heads["graph"].key, "--at", "assess", "--to", "g2"], "fork"),
        (heads["agent"], ["retry", heads["agent"].key, "--from", "run_started"], "retry"),
    ]
    for head, args, what in cases:
        code, out, err = _run(*args, *store_args)
        assert code == 1 and out == "" and err.count("\n") == 1, (args, err)
        kind = "a graph" if head.kind == "graph" else "an agent"
        assert f"run {head.key!r} is {kind} run: `stepstone {what}` works on Plan" in err
        assert "nothing was changed" in err
        assert ("resume_invocation" if head.kind == "graph" else "runner.resume") in err
    with open_args(store_args) as store:
        for head in heads.values():
            assert store.backend.run_get(head.key) == head  # untouched
        assert store.backend.run_get("g2") is None


def test_keys_are_printed_whole_in_every_table_on_a_narrow_terminal(
    store_args: list[str], tmp_path: Path
) -> None:
    """guarantee 377: on a 40-column terminal, `queue`, `prune`, `stranded` and `migrate`
    print every run key whole (to copy into the next command) and their other cells
    wrapped, not cut (before, `queue` showed `etl/3d8da2…` even at 80 columns and statuses
    as `q…`); `migrate` prints a key holding `[bold]` as it is (it was read as markup)."""
    import subprocess
    import sys

    from stepstone import submit
    from tests.workers.targets import task

    long_key = "nightly/" + "backfill-2026-11-24-" * 3 + "end"
    with open_args(store_args) as store:
        queued = submit(store, "tests.workers.targets:make_plan", task("x", "a"), queue="etl")
        queued_key = queued.key
        done_run(store, long_key)
        done_run(store, "[bold]loud")
    narrow = {"COLUMNS": "40"}

    def run(*args: str) -> str:
        result = runner.invoke(app, [*args, *store_args], env=narrow)
        assert result.exit_code == 0, result.output
        return result.stdout

    out = run("queue")
    assert queued_key in out and "queued" in out and "…" not in out
    out = run("prune", "--keep-last", "0", "--min-age", "0s", "--dry-run")
    assert long_key in out and "[bold]loud" in out and "…" not in out
    module = tmp_path / "narrow_target.py"
    module.write_text(
        "from stepstone import Plan, Step\n"
        "plan = Plan(Step(lambda p: p, name='extract'), Step(lambda p: p, name='load'))\n"
    )
    target = ["narrow_target:plan", *store_args]
    migrate = subprocess.run(
        [sys.executable, "-m", "stepstone.cli", "migrate", "--dry-run", "--target", *target],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **narrow},
    )
    assert migrate.returncode == 0, migrate.stderr
    assert long_key in migrate.stdout and "[bold]loud" in migrate.stdout
    assert "…" not in migrate.stdout
    # a run whose owner died: stranded
    url_or_db = store_args[1]
    opener = "db" if store_args[0] == "--db" else "url"
    code = (
        "import time\nfrom stepstone import Agent, Plan, Step, Store\n"
        "def hang(p):\n    print('started', flush=True)\n    time.sleep(600)\n"
        f"Agent(engine=Plan(Step(hang, name='hang'), store=Store({opener}={url_or_db!r}),\n"
        f"      checkpoint_key={long_key + '-stranded'!r}))('go')\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        finally:
            proc.kill()
    out = run("stranded")
    assert f"{long_key}-stranded" in out and "…" not in out


def test_a_key_that_holds_no_run_is_answered_with_the_runs_meant(store_args: list[str]) -> None:
    """guarantee 378: the run id of an agent run (its key is `agent:ID:checkpoint:latest`),
    a prefix, a key in the wrong case: every command that takes a key answers with the runs
    whose key holds it (before: only `list them with stepstone runs`)."""
    from stepstone import Runner
    from stepstone.testing import FunctionModel

    with open_args(store_args) as store:
        done_run(store, "nightly-11-20")
        done_run(store, "nightly-11-21")
        failed_run(store, "weekly")
        agent = Agent(model=FunctionModel(lambda r: "hello"), name="greeter")
        Runner(store=store).run_sync(agent, user_message="hi", run_id="greet-7", thread_id="t")
    nightly = "runs whose key holds it: 'nightly-11-20', 'nightly-11-21'"
    agent_key = "runs whose key holds it: 'agent:greet-7:checkpoint:latest'"
    cases = [
        (["show", "GREET-7"], "GREET-7", agent_key),  # its run id names it: guarantee 428
        (["history", "NIGHTLY-11"], "NIGHTLY-11", nightly),
        (["cancel", "nightly"], "nightly", nightly),
        (["retry", "nightly", "--from", "load"], "nightly", nightly),
        (["fork", "nightly", "--at", "load", "--to", "n2"], "nightly", nightly),
        (["approve", "Greet-7", "call_0_0"], "Greet-7", agent_key),
        (["diff", "weekly", "nightly-11"], "nightly-11", nightly),
        (["show", "zzz"], "zzz", "list them with `stepstone runs`"),
    ]
    for args, key, said in cases:
        code, out, err = _run(*args, *store_args)
        assert code == 1 and out == "" and err.count("\n") == 1, (args, err)
        assert f"no run under key {key!r} in Store(" in err and said in err, (args, err)
