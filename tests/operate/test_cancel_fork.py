"""Cancelling a run through its head, and forking a run at a step."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.durable._operate import cancel_run, fork_run, retry_run
from stepstone.exceptions import RunCancelledError, StoreKeyConflictError
from tests.operate._runs import done_run, failed_run


def test_cancelling_a_live_run_stops_it_at_its_next_commit(tmp_path: Path) -> None:
    # guarantee 268
    ran: list[str] = []
    started, go = threading.Event(), threading.Event()

    def slow(payload: object) -> str:
        ran.append("slow")
        started.set()
        assert go.wait(60)
        return "slow result"

    def after(payload: object) -> str:
        ran.append("after")
        return "after result"

    with Store(db=tmp_path / "s.sqlite") as store:
        plan = Plan(
            Step(slow, name="slow", writes="slow_out"),
            Step(after, name="after"),
            store=store,
            checkpoint_key="job",
        )
        raised: list[BaseException] = []

        def work() -> None:
            try:
                Agent(engine=plan)("go")
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                raised.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        assert started.wait(60)
        outcome = cancel_run(store, "job", reason="operator said stop")
        assert outcome.startswith("cancel requested")
        go.set()
        worker.join(60)
        assert ran == ["slow"]  # the step after the cancel never ran
        assert len(raised) == 1 and isinstance(raised[0], RunCancelledError)
        assert "resume=True" in str(raised[0])
        state = store.read("job")
        assert state["status"] == "failed"
        assert state["completed_steps"] == ["slow"]  # the running step's result was kept
        assert state["error"]["type"] == "RunCancelledError"
        assert "operator said stop" in state["error"]["message"]
        assert store.read("slow_out") == "slow result"
        # resume=True continues after the cancelled point
        plan2 = Plan(
            Step(slow, name="slow", writes="slow_out"),
            Step(after, name="after"),
            store=store,
            checkpoint_key="job",
            resume=True,
        )
        Agent(engine=plan2)("go")
        assert ran == ["slow", "after"]
        assert store.read("job")["status"] == "done"


def test_cancelling_a_stopped_run_marks_it_at_once(tmp_path: Path) -> None:
    # guarantee 268
    with Store(db=tmp_path / "s.sqlite") as store:
        failed_run(store, "f")
        assert cancel_run(store, "f").startswith("cancelled")
        assert store.read("f")["error"]["type"] == "RunCancelledError"
        done_run(store, "d")
        with pytest.raises(ValueError, match="already done"):
            cancel_run(store, "d")
        with pytest.raises(KeyError, match="no run under key 'nope'"):
            cancel_run(store, "nope")


def test_cancelling_a_failed_run_keeps_why_it_failed(store_args: list[str]) -> None:
    """guarantee 268, 371: the cancel of a failed run keeps its error (before, the
    RunCancelledError replaced it and the failure was lost); a second cancel changes
    nothing and says so, on SQLite and PostgreSQL alike."""
    import json

    from typer.testing import CliRunner

    from stepstone.cli import app
    from tests.operate.conftest import open_args

    with open_args(store_args) as store:
        failed_run(store, "f")
    cli = CliRunner(env={"COLUMNS": "200"})
    first = cli.invoke(app, ["cancel", "f", "--reason", "wrong batch", *store_args])
    assert first.exit_code == 0, first.stderr
    assert "its error is kept as previous_error" in first.stdout
    shown = json.loads(cli.invoke(app, ["show", "f", "--json", *store_args]).stdout)
    err = shown["error"]
    assert shown["status"] == "failed" and err["type"] == "RunCancelledError"
    assert err["previous_error"]["type"] == "ValueError"
    assert err["previous_error"]["message"] == "bad row 7"
    assert "wrong batch" in err["message"] and "ValueError: bad row 7" in err["message"]
    assert err["step"] == "validate"  # still the step a resume runs again
    version = shown["version"]
    second = cli.invoke(app, ["cancel", "f", "--reason", "again", *store_args])
    assert second.exit_code == 0, second.stderr
    assert "already cancelled" in second.stdout and "nothing changed" in second.stdout
    again = json.loads(cli.invoke(app, ["show", "f", "--json", *store_args]).stdout)
    assert again["version"] == version and again["error"] == err
    table = cli.invoke(app, ["show", "f", *store_args])
    assert "ValueError: bad row 7" in table.stdout


def test_cancel_from_another_process(tmp_path: Path) -> None:
    # guarantee 268: the CLI signals an owner in another process through the head
    db = tmp_path / "s.sqlite"
    flag = tmp_path / "go"
    code = f"""
import pathlib, time
from stepstone import Agent, Plan, Step, Store
from stepstone.exceptions import RunCancelledError
def slow(p):
    print("started", flush=True)
    while not pathlib.Path({str(flag)!r}).exists():
        time.sleep(0.05)
    return "slow"
def after(p):
    print("after ran", flush=True)
    return "after"
try:
    Agent(engine=Plan(Step(slow, name="slow"), Step(after, name="after"),
                      store=Store(db={str(db)!r}), checkpoint_key="job"))("go")
except RunCancelledError as exc:
    print("cancelled:", exc, flush=True)
"""
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        cli = subprocess.run(
            [sys.executable, "-m", "stepstone.cli", "cancel", "job", "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert "cancel requested" in cli.stdout
        flag.touch()
        out = proc.stdout.read()
        assert proc.wait(60) == 0
    assert "after ran" not in out and "cancelled:" in out
    with Store(db=db) as store:
        assert store.read("job")["error"]["type"] == "RunCancelledError"


def test_fork_copies_a_run_up_to_a_step_and_resumes_there(tmp_path: Path) -> None:
    # guarantee 269
    calls: list[str] = []

    def step(name: str, fail: bool = False):  # type: ignore[no-untyped-def]
        def fn(payload: object) -> str:
            calls.append(name)
            if fail:
                raise ValueError(f"{name} broke")
            return f"{payload}>{name}"

        fn.__name__ = name
        return fn

    with Store(db=tmp_path / "s.sqlite") as store:

        def plan(key: str, *, resume: bool = False, fail: bool = False) -> Plan:
            return Plan(
                Step(step("a"), name="a"),
                Step(step("b"), name="b"),
                Step(step("c", fail=fail), name="c"),
                store=store,
                checkpoint_key=key,
                resume=resume,
            )

        Agent(engine=plan("orig"))("go")
        assert calls == ["a", "b", "c"]
        head = fork_run(store, "orig", at="a", to="copy")
        assert head.status == "paused" and head.next_step == "b"
        assert store.read("copy")["completed_steps"] == ["a"]
        calls.clear()
        out = Agent(engine=plan("copy", resume=True))("go")
        assert calls == ["b", "c"]  # a was not re-run
        assert out.payload == "go>a>b>c"
        assert store.read("orig")["status"] == "done"  # the original is untouched
        with pytest.raises(StoreKeyConflictError, match="already used"):
            fork_run(store, "orig", at="a", to="copy")
        with pytest.raises(KeyError, match="no step 'zz'"):
            fork_run(store, "orig", at="zz", to="copy2")


def test_retry_rewinds_a_run_to_a_step(tmp_path: Path) -> None:
    # guarantee 282
    calls: list[str] = []

    def make(name: str):  # type: ignore[no-untyped-def]
        def fn(payload: object) -> str:
            calls.append(name)
            return f"{payload}>{name}"

        fn.__name__ = name
        return fn

    with Store(db=tmp_path / "s.sqlite") as store:

        def plan(resume: bool) -> Plan:
            return Plan(
                Step(make("a"), name="a"),
                Step(make("b"), name="b", writes="b_out"),
                Step(make("c"), name="c"),
                store=store,
                checkpoint_key="job",
                resume=resume,
            )

        Agent(engine=plan(False))("go")
        from stepstone.durable import retry_run

        head = retry_run(store, "job", from_step="b")
        assert (head.status, head.next_step) == ("paused", "b")
        assert store.read("job")["completed_steps"] == ["a"]
        calls.clear()
        out = Agent(engine=plan(True))("go")
        assert calls == ["b", "c"] and out.payload == "go>a>b>c"
        assert store.read("job")["completed_steps"] == ["a", "b", "c"]
        with pytest.raises(KeyError, match="no step 'zz'"):
            retry_run(store, "job", from_step="zz")


def test_retry_refuses_a_live_run(tmp_path: Path) -> None:
    # guarantee 282
    from stepstone.durable import retry_run
    from stepstone.exceptions import ConcurrentPlanRunError
    from tests.operate._live import SteppedRun

    with Store(db=tmp_path / "s.sqlite") as store:
        live = SteppedRun(store, "live", steps=3).start()
        try:
            live.advance(0)
            with pytest.raises(ConcurrentPlanRunError, match="stepstone cancel live"):
                retry_run(store, "live", from_step="step_0")
        finally:
            live.finish()
        assert store.read("live")["status"] == "done"


def test_cancelling_a_live_graph_run(tmp_path: Path) -> None:
    # guarantee 268
    from typing import ClassVar

    from stepstone.graph import END, GraphBuilder, SQLiteCheckpointer, State

    started, go = threading.Event(), threading.Event()
    ran: list[str] = []

    class Count(State):
        schema_version: ClassVar[str] = "v1"
        n: int = 0

    def first(state: Count) -> dict[str, int]:
        started.set()
        assert go.wait(60)
        ran.append("first")
        return {"n": 1}

    def second(state: Count) -> dict[str, int]:
        ran.append("second")
        return {"n": 2}

    db = tmp_path / "g.sqlite"
    graph = (
        GraphBuilder(Count)
        .add_node("first", first)
        .add_node("second", second)
        .add_edge("first", "second")
        .add_edge("second", END)
        .set_entry("first")
        .with_checkpointer(SQLiteCheckpointer(str(db)))
        .compile()
    )
    raised: list[BaseException] = []

    def work() -> None:
        try:
            graph.invoke(Count(), correlation_id="c1")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            raised.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(60)
    with Store(db=db) as store:
        key = next(h.key for h in store.backend.run_list(None) if h.kind == "graph")
        assert cancel_run(store, key).startswith("cancel requested")
        go.set()
        worker.join(60)
        assert ran == ["first"]
        assert len(raised) == 1 and "resume_invocation=" in str(raised[0])
        head = store.backend.run_get(key)
        assert head is not None and head.status == "failed"
        assert head.meta["error"]["type"] == "RunCancelledError"


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM stepstone_journal WHERE run_key = 'job' AND seq = 1",
        "UPDATE stepstone_journal SET data = '[1]' WHERE run_key = 'job' AND seq = 1",
    ],
)
def test_fork_and_retry_refuse_a_corrupt_record(tmp_path: Path, damage: str) -> None:
    """guarantee 131, 132: a corrupt record is never copied or rewound (its damage would
    spread to the copy, or a lost step be dropped for good); nothing is written."""
    import sqlite3

    from stepstone.durable import retry_run
    from stepstone.exceptions import CheckpointCorruptError

    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        done_run(store, "job")
    conn = sqlite3.connect(db)
    conn.execute(damage)
    conn.commit()
    before = conn.execute("SELECT * FROM stepstone_runs ORDER BY key").fetchall()
    conn.close()
    with Store(db=db) as store:
        with pytest.raises(CheckpointCorruptError, match="'job'"):
            fork_run(store, "job", at="extract", to="copy")
        with pytest.raises(CheckpointCorruptError, match="'job'"):
            retry_run(store, "job", from_step="extract")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT * FROM stepstone_runs ORDER BY key").fetchall() == before
    conn.close()


def test_fork_refuses_a_step_row_whose_iteration_is_not_a_count(tmp_path: Path) -> None:
    # guarantee 131: a row edited through SQL (its checksum dropped) reads as written;
    # before, fork_run failed on it with a raw ValueError
    import json
    import sqlite3

    from stepstone.exceptions import CheckpointCorruptError

    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        done_run(store, "job")
    conn = sqlite3.connect(db)
    (text,) = conn.execute("SELECT data FROM stepstone_journal WHERE name = 'extract'").fetchone()
    edited = json.dumps({**json.loads(text), "iteration": "x"})
    conn.execute("UPDATE stepstone_journal SET data = ? WHERE name = 'extract'", (edited,))
    conn.commit()
    conn.close()
    with Store(db=db) as store:
        with pytest.raises(CheckpointCorruptError, match="iteration 'x', not a count"):
            fork_run(store, "job", at="extract", to="copy")
        assert store.read("copy") is None


def test_fork_and_retry_treat_a_parallel_band_as_one_unit(tmp_path: Path) -> None:
    # guarantee 269, 282: a band's steps are applied together, so they are copied and re-run
    # together (a cut inside a band lost its outputs, or left a run no resume accepted)
    calls: list[str] = []

    def make(name: str, value: object):  # type: ignore[no-untyped-def]
        def fn(payload: object) -> object:
            calls.append(name)
            return value if value is not None else payload

        fn.__name__ = name
        return fn

    store = Store(db=tmp_path / "band.sqlite")

    def plan(key: str) -> Agent:
        return Agent(
            engine=Plan(
                Step(make("pre", None)),
                Step(make("p1", 1), parallel=True),
                Step(make("p2", 2), parallel=True),
                Step(make("after", None)),
                store=store,
                checkpoint_key=key,
                resume=True,
            )
        )

    assert plan("orig")("task").payload == {"p1": 1, "p2": 2}
    for at, runs in (("p1", ["after"]), ("p2", ["after"]), ("pre", ["p1", "p2", "after"])):
        calls.clear()
        copy = fork_run(store, "orig", at=at, to=f"copy-{at}")
        assert copy.next_step == ("p1" if at == "pre" else "after")
        assert plan(f"copy-{at}")("task").payload == {"p1": 1, "p2": 2}
        assert sorted(calls) == sorted(runs)
    for step in ("p2", "p1"):
        calls.clear()
        assert retry_run(store, "orig", from_step=step).next_step == "p1"
        assert plan("orig")("task").payload == {"p1": 1, "p2": 2}
        assert sorted(calls) == ["after", "p1", "p2"]
    store.close()


@pytest.mark.parametrize("to", ["", 5, "x\0y"])
def test_fork_refuses_a_new_key_no_store_can_hold(tmp_path: Path, to: object) -> None:
    # guarantee 269: a run under such a key could be neither read nor deleted
    with Store(db=tmp_path / "f.sqlite") as store:
        done_run(store, "src")
        with pytest.raises((TypeError, ValueError), match="fork's new key"):
            fork_run(store, "src", at="extract", to=to)  # type: ignore[arg-type]
        assert [h.key for h in store.backend.run_list(None)] == ["src"]
    if to == "":
        from typer.testing import CliRunner

        from stepstone.cli import app

        done = CliRunner().invoke(
            app, ["fork", "src", "--at", "extract", "--to", "", "--db", str(tmp_path / "f.sqlite")]
        )
        assert done.exit_code == 1 and "fork's new key" in done.stderr


def test_retry_and_fork_keep_the_branch_routing_chose(tmp_path: Path) -> None:
    # guarantee 269: before, a run rewound or forked to just after a routed step with
    # after_branches forgot its rejoin and ran the branch routing had not chosen
    ran: list[str] = []

    def step(name: str, out: str, **options: Any) -> Step:
        def fn(payload: object) -> str:
            ran.append(name)
            return out

        fn.__name__ = name
        return Step(fn, **options)

    routes = {"b1": lambda e: e.payload == "go-b1", "b2": lambda e: e.payload == "go-b2"}
    steps = (
        step("r", "go-b1", routes=routes, after_branches="join"),
        step("b1", "b1 done"),
        step("b2", "b2 done"),
        step("join", "joined"),
    )
    with Store(db=tmp_path / "s.sqlite") as store:

        def plan(key: str) -> Agent:
            return Agent(engine=Plan(*steps, store=store, checkpoint_key=key, resume=True))

        assert plan("k")("t").ok and ran == ["r", "b1", "join"]
        ran.clear()
        retry_run(store, "k", from_step="b1")
        assert plan("k")("t").ok and ran == ["b1", "join"]
        ran.clear()
        fork_run(store, "k", at="r", to="k2")
        assert plan("k2")("t").ok and ran == ["b1", "join"]
