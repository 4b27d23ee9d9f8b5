"""resume=True with a different plan: refused before anything is written, unless the
caller chose on_plan_change="restart" or "continue". And the max_iterations counter
counts routed re-visits only, never failed or paused attempts."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stepstone import (
    Agent,
    Envelope,
    Plan,
    PlanCompileError,
    PlanPaused,
    StaleCheckpointError,
    Step,
    Store,
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "change.sqlite"


def run(plan: Plan) -> Envelope[Any]:
    return Agent(engine=plan)("go")


def tracked(calls: list[str], name: str, fail: set[str] | None = None) -> Any:
    def fn(payload: Any) -> str:
        calls.append(name)
        if fail is not None and name in fail:
            raise RuntimeError(f"{name} broke")
        return f"{name}<{payload}>"

    fn.__name__ = name
    return fn


def plan_of(store: Store, names: list[str], calls: list[str], **kw: Any) -> Plan:
    fail = kw.pop("fail", None)
    steps = [Step(tracked(calls, n, fail), writes=f"w_{n}") for n in names]
    return Plan(*steps, store=store, checkpoint_key="job", resume=True, **kw)


def dump(db: Path) -> list[Any]:
    """Every row of every table, to prove a refused resume wrote nothing."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [(t, sorted(con.execute(f'SELECT * FROM "{t}"').fetchall())) for t in sorted(tables)]
    finally:
        con.close()


def test_done_run_with_a_changed_plan_is_refused_before_anything_is_written(db: Path) -> None:
    # guarantee 128
    calls: list[str] = []
    with Store(db=db) as store:
        assert run(plan_of(store, ["a", "b"], calls)).ok
        before = dump(db)
        with pytest.raises(StaleCheckpointError) as info:
            run(plan_of(store, ["a", "b", "c"], calls))
        msg = str(info.value)
        assert "'job'" in msg and "steps added: 'c'" in msg and "finished" in msg
        assert "store.delete('job')" in msg and "on_plan_change='restart'" in msg
        assert dump(db) == before
        assert calls == ["a", "b"]


def test_shared_step_name_mid_run_is_refused_naming_what_changed(db: Path) -> None:
    # guarantee 128
    calls: list[str] = []
    with Store(db=db) as store:
        assert not run(plan_of(store, ["a", "b", "c"], calls, fail={"b"})).ok
        before = dump(db)
        with pytest.raises(StaleCheckpointError) as info:
            run(plan_of(store, ["x", "b", "c"], calls))
        msg = str(info.value)
        assert "steps added: 'x'" in msg and "steps removed: 'a'" in msg
        assert "stopped at step 'b'" in msg
        assert dump(db) == before


def test_reordered_steps_are_refused(db: Path) -> None:
    # guarantee 128
    calls: list[str] = []
    with Store(db=db) as store:
        assert not run(plan_of(store, ["a", "b", "c"], calls, fail={"c"})).ok
        with pytest.raises(StaleCheckpointError, match=r"reordered \(were a -> b -> c, now"):
            run(plan_of(store, ["b", "a", "c"], calls))
        assert calls == ["a", "b", "c"]  # nothing re-ran


def test_restart_policy_starts_over_under_the_same_key(db: Path) -> None:
    # guarantee 129
    calls: list[str] = []
    with Store(db=db) as store:
        assert run(plan_of(store, ["a", "b"], calls)).ok
        env = run(plan_of(store, ["a", "c"], calls, on_plan_change="restart"))
        assert env.ok and env.payload == "c<a<go>>"
        state = store.read("job")
        assert state["completed_steps"] == ["a", "c"] and state["status"] == "done"
        assert calls == ["a", "b", "a", "c"]
        # The same (new) plan then resumes as usual: cached, nothing runs.
        assert run(plan_of(store, ["a", "c"], calls, on_plan_change="restart")).ok
        assert calls == ["a", "b", "a", "c"]


def test_continue_policy_resumes_by_step_name(db: Path) -> None:
    # guarantee 129
    calls: list[str] = []
    with Store(db=db) as store:
        assert not run(plan_of(store, ["a", "b", "c"], calls, fail={"b"})).ok
        env = run(plan_of(store, ["z", "b", "c"], calls, on_plan_change="continue"))
        assert env.ok and env.payload == "c<b<a<go>>>"
        assert calls == ["a", "b", "b", "c"]


def test_continue_cannot_resume_at_a_step_that_is_gone(db: Path) -> None:
    # guarantee 129
    calls: list[str] = []
    with Store(db=db) as store:
        assert not run(plan_of(store, ["a", "b"], calls, fail={"b"})).ok
        with pytest.raises(StaleCheckpointError, match=r"stopped at step 'b'.*restart"):
            run(plan_of(store, ["a", "c"], calls, on_plan_change="continue"))


def test_unknown_policy_is_a_compile_error() -> None:
    with pytest.raises(PlanCompileError, match=r"on_plan_change='merge'.*'restart'"):
        Plan(Step(lambda p: p, name="a"), on_plan_change="merge")  # type: ignore[arg-type]


# -- the max_iterations counter ------------------------------------------------------------


def test_pause_polls_never_use_up_max_iterations(db: Path) -> None:
    # guarantee 130
    approved = {"yes": False}
    polls = {"n": 0}

    def approve(payload: Any) -> str:
        polls["n"] += 1
        if not approved["yes"]:
            raise PlanPaused("waiting for a human")
        return "approved"

    def plan(store: Store) -> Plan:
        return Plan(
            Step(lambda p: "draft", name="draft"),
            Step(approve),
            Step(lambda p: f"sent {p}", name="send"),
            store=store,
            checkpoint_key="approval",
            resume=True,
            max_iterations=3,
        )

    with Store(db=db) as store:
        for _ in range(10):
            env = run(plan(store))
            assert env.error is not None and env.error.type == "PlanPaused", env.error
        assert store.read("approval")["iteration"] == 0
        approved["yes"] = True
        env = run(plan(store))
        assert env.ok and env.payload == "sent approved"
        assert polls["n"] == 11


def test_failed_attempts_never_use_up_max_iterations(db: Path) -> None:
    # guarantee 130
    calls: list[str] = []
    fail = {"b"}
    with Store(db=db) as store:
        for _ in range(5):
            assert not run(plan_of(store, ["a", "b"], calls, fail=fail, max_iterations=1)).ok
        fail.clear()
        assert run(plan_of(store, ["a", "b"], calls, fail=fail, max_iterations=1)).ok
