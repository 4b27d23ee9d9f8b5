"""Plan checkpoint and resume: guarantees 1-45 and the failure modes we rule out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stepstone import (
    CHECKPOINT_VERSION,
    Agent,
    CheckpointCorruptError,
    ConcurrentPlanRunError,
    Envelope,
    EventType,
    Plan,
    PlanCompileError,
    PlanPaused,
    SerializationError,
    Session,
    StaleCheckpointError,
    Step,
    Store,
    StoreKeyConflictError,
    UnserializableValueWarning,
    from_parallel_all,
    from_step,
)
from stepstone.durable import claim_run, fork_run, retry_run
from stepstone.store import RunHead


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(db=tmp_path / "plan.sqlite")
    yield s
    s.close()


class Counter:
    """Counts calls per step name; optionally fails or pauses a step while a flag is set."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.fail: set[str] = set()
        self.pause: set[str] = set()

    def step(self, name: str, result: Any = None) -> Any:
        def fn(payload: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.fail:
                raise RuntimeError(f"{name} broke")
            if name in self.pause:
                raise PlanPaused(f"{name} waits for approval")
            return result if result is not None else f"{name}({payload})"

        fn.__name__ = name
        return fn


def etl_plan(store: Store, c: Counter, **kw: Any) -> Plan:
    return Plan(
        Step(c.step("extract"), writes="raw"),
        Step(c.step("transform"), writes="clean"),
        Step(c.step("validate"), writes="verdict"),
        Step(c.step("load"), writes="loaded"),
        store=store,
        checkpoint_key=kw.pop("key", "etl"),
        **kw,
    )


def run(plan: Plan, task: str = "batch", **kw: Any) -> Envelope[Any]:
    return Agent(engine=plan, **kw)(task)


# -- construction --------------------------------------------------------------------------


def test_signature_defaults_and_store_and_key_both_needed(store: Store) -> None:
    # guarantee 1
    plan = Plan(Step(lambda p: p, name="a"))
    assert (plan.resume, plan.on_concurrent, plan.max_iterations) == (False, "fail", 100)
    assert plan.store is None and plan.checkpoint_key is None
    with pytest.raises(PlanCompileError, match="checkpoint_key= is missing"):
        Plan(Step(lambda p: p, name="a"), store=store)
    with pytest.raises(PlanCompileError, match="store= is missing"):
        Plan(Step(lambda p: p, name="a"), checkpoint_key="k")


def test_a_key_with_a_nul_character_or_a_lone_surrogate_is_a_compile_error(
    store: Store,
) -> None:
    """guarantee 349: caught when the Plan is built, naming the key, before any run (a
    step name too: it is stored with every journal row)."""
    with pytest.raises(PlanCompileError, match=r"checkpoint_key 'k\\x00' contains a NUL"):
        Plan(Step(lambda p: p, name="a"), store=store, checkpoint_key="k\0")
    with pytest.raises(PlanCompileError, match=r"step 'a': writes='w\\x00' contains a NUL"):
        Plan(Step(lambda p: p, name="a", writes="w\0"), store=store, checkpoint_key="k")
    with pytest.raises(PlanCompileError, match=r"checkpoint_key 'k\\udcff' contains a lone"):
        Plan(Step(lambda p: p, name="a"), store=store, checkpoint_key="k\udcff")
    with pytest.raises(PlanCompileError, match=r"writes='\\ud800w' contains a lone surrogate"):
        Plan(Step(lambda p: p, name="a", writes="\ud800w"), store=store, checkpoint_key="k")
    for name in ("a\0", "a\udcff"):
        with pytest.raises(PlanCompileError, match=r"Step name 'a\\(x00|udcff)' contains a"):
            Step(lambda p: p, name=name)
    assert store.keys() == []


def test_fork_with_resume_is_a_compile_error(store: Store) -> None:
    # guarantee 29 (and the known fault: PlanCompileError, not ValueError)
    with pytest.raises(PlanCompileError, match="fork"):
        Plan(
            Step(lambda p: p, name="a"),
            store=store,
            checkpoint_key="k",
            on_concurrent="fork",
            resume=True,
        )
    with pytest.raises(PlanCompileError, match="on_concurrent"):
        Plan(Step(lambda p: p, name="a"), store=store, checkpoint_key="k", on_concurrent="steal")  # type: ignore[arg-type]


# -- the persisted shape ---------------------------------------------------------------------


def test_checkpoint_written_after_every_step_with_documented_shape(store: Store) -> None:
    # guarantee 2, 3, 4, 5, 6, 7, 8, 12, 15, 16, 17, 22, 41 (claimed, running, done; paused and
    # failed in the tests below)
    seen: list[dict[str, Any]] = []

    def observe(name: str):  # a step that records the checkpoint as it is when it starts
        def fn(payload: Any) -> str:
            seen.append(store.read("etl"))
            return f"{name}:{payload}"

        fn.__name__ = name
        return fn

    plan = Plan(
        Step(observe("a"), writes="wa"),
        Step(observe("b"), writes="wb"),
        Step(observe("c")),
        store=store,
        checkpoint_key="etl",
    )
    env = run(plan, "go")
    assert env.ok and env.payload == "c:b:a:go"
    first, second, third = seen
    assert first["status"] == "claimed" and first["next_step"] == "a"  # guarantee 15, 16
    assert first["completed_steps"] == [] and first["kv"] == {}
    assert second["status"] == "running" and second["next_step"] == "b"  # guarantee 8, 17
    assert second["completed_steps"] == ["a"] and second["kv"] == {"wa": "a:go"}
    assert third["next_step"] == "c" and third["kv"] == {"wa": "a:go", "wb": "b:a:go"}
    # Sidecar readers: the Store already holds what the checkpoint's kv holds (guarantee 41).
    assert store.read("wa") == "a:go" and store.read("wb") == "b:a:go"
    final = store.read("etl")
    assert set(final) >= {
        "next_step",
        "kv",
        "completed_steps",
        "status",
        "run_uid",
        "checkpoint_version",
        "history",
    }  # guarantee 4
    assert final["checkpoint_version"] == CHECKPOINT_VERSION == 2  # guarantee 3
    assert final["status"] == "done" and final["next_step"] is None  # guarantee 22
    assert final["completed_steps"] == ["a", "b", "c"]
    assert int(final["run_uid"], 16) and len(final["run_uid"]) == 32  # guarantee 6
    assert [h["step"] for h in final["history"]] == ["a", "b", "c"]  # guarantee 7
    assert final["history"][1]["envelope"]["payload"] == "b:a:go"
    assert final["kv"] == {"wa": "a:go", "wb": "b:a:go"}  # guarantee 12
    entry = store.read_entry("etl")
    assert entry is not None and entry.kind == "checkpoint" and entry.run_kind == "plan"


def test_failure_keeps_next_step_and_is_inspectable(store: Store) -> None:
    # guarantee 2, 9, 18, 34, 43
    c = Counter()
    c.fail.add("validate")
    env = run(etl_plan(store, c, resume=True))
    assert not env.ok and env.error is not None
    assert env.error.type == "RuntimeError" and "validate broke" in env.error.message
    assert env.metadata["step"] == "validate"
    state = store.read("etl")
    assert state["status"] == "failed"  # guarantee 34
    assert state["next_step"] == "validate"  # guarantee 9
    assert state["completed_steps"] == ["extract", "transform"]
    assert state["kv"]["clean"] == "transform(extract(batch))"
    assert state["error"]["type"] == "RuntimeError"
    c.fail.clear()
    env = run(etl_plan(store, c, resume=True))  # guarantee 18: retried from next_step
    assert env.ok, env.error
    assert c.calls == {"extract": 1, "transform": 1, "validate": 2, "load": 1}  # guarantee 43
    assert store.read("etl")["status"] == "done"


def test_resume_on_done_short_circuits_with_cached_kv(store: Store) -> None:
    # guarantee 23, 24
    c = Counter()
    run(etl_plan(store, c, resume=True))
    head_before = store.backend.run_get("etl")
    env = run(etl_plan(store, c, resume=True))
    assert env.ok and env.metadata["cached"] is True
    assert env.payload == {
        "raw": "extract(batch)",
        "clean": "transform(extract(batch))",
        "verdict": "validate(transform(extract(batch)))",
        "loaded": "load(validate(transform(extract(batch))))",
    }
    assert c.calls == {"extract": 1, "transform": 1, "validate": 1, "load": 1}
    # Only reads: the head was not rewritten.
    assert store.backend.run_get("etl") == head_before


def test_a_resume_of_an_empty_key_claims_it_without_reading_it_first(tmp_path: Path) -> None:
    """guarantee 360: ``resume=True`` on a key that holds nothing starts the run with its
    claim alone (the journal is read only for a key that holds a run)."""
    from stepstone.store._sqlite import SQLiteBackend

    reads: list[str] = []

    class Counting(SQLiteBackend):  # the real backend; it only notes the reads of runs
        def run_get(self, key: str) -> RunHead | None:
            reads.append(f"head {key}")
            return super().run_get(key)

        def run_journal(self, key: str, since_seq: int = 0) -> list[Any]:
            reads.append(f"journal {key}")
            return super().run_journal(key, since_seq)

    store = Store(backend=Counting(str(tmp_path / "s.db")))
    c = Counter()
    assert run(etl_plan(store, c, resume=True)).ok
    assert reads == []
    env = run(etl_plan(store, c, resume=True))  # done: read, then the cached result
    assert env.metadata["cached"] is True and "journal etl" in reads
    assert c.calls == {"extract": 1, "transform": 1, "validate": 1, "load": 1}


def test_fresh_run_after_failure_or_done_starts_over(store: Store) -> None:
    # known fault: a failed/paused key must not block fresh runs
    c = Counter()
    c.fail.add("transform")
    run(etl_plan(store, c))
    c.fail.clear()
    assert run(etl_plan(store, c)).ok  # resume=False: fresh
    assert c.calls["extract"] == 2
    assert run(etl_plan(store, c)).ok  # done + resume=False: fresh again
    assert c.calls["extract"] == 3
    assert store.read("etl")["completed_steps"] == ["extract", "transform", "validate", "load"]


def test_resume_rebuilds_history_for_sentinels(store: Store) -> None:
    # guarantee 13, 14, 44: from_step resolves to the earlier run's payload after a resume
    c = Counter()
    c.fail.add("c")
    seen: list[Any] = []

    def consumer(payload: Any) -> str:
        seen.append(payload)
        return "used"

    def make() -> Plan:
        return Plan(
            Step(c.step("a", {"rows": [1, 2]}), writes="wa"),
            Step(c.step("b")),
            Step(c.step("c")),
            Step(consumer, task=from_step("a")),
            store=store,
            checkpoint_key="hist",
            resume=True,
        )

    assert not run(make()).ok
    c.fail.clear()
    assert run(make()).ok
    assert seen == [{"rows": [1, 2]}]
    assert c.calls == {"a": 1, "b": 1, "c": 2}


class Verdict(BaseModel):
    accepted: int
    note: str


def test_pydantic_payloads_persist_via_model_dump_and_reload_typed(store: Store) -> None:
    # guarantee 37
    c = Counter()
    c.fail.add("after")
    got: list[Any] = []

    def judge(payload: Any) -> Verdict:
        return Verdict(accepted=3, note="ok")

    def use(v: Verdict) -> str:
        got.append(v)
        return v.note

    def make() -> Plan:
        return Plan(
            Step(judge, writes="verdict", output=Verdict),
            Step(c.step("after")),
            Step(use, task=from_step("judge")),
            store=store,
            checkpoint_key="typed",
            resume=True,
        )

    run(make())
    assert store.read("verdict") == {"accepted": 3, "note": "ok"}
    assert store.read("typed")["kv"]["verdict"] == {"accepted": 3, "note": "ok"}
    c.fail.clear()
    assert run(make()).ok
    assert got == [Verdict(accepted=3, note="ok")]  # typed again after the resume


def test_steps_without_writes_leave_nothing_to_restore(store: Store) -> None:
    # guarantee 42
    plan = Plan(
        Step(lambda p: "x", name="a"),
        Step(lambda p: "y", name="b"),
        store=store,
        checkpoint_key="nowrites",
    )
    assert run(plan).ok
    assert store.read("nowrites")["kv"] == {}
    assert store.keys() == ["nowrites"]


# -- pause -------------------------------------------------------------------------------


def test_pause_and_resume_reinvokes_the_paused_step(store: Store) -> None:
    # guarantee 19, 20, 21, 62, 63
    c = Counter()
    c.pause.add("validate")
    env = run(etl_plan(store, c, resume=True))
    assert not env.ok and env.error is not None
    assert env.error.type == "PlanPaused" and env.error.retryable is True
    # guarantee 595: the message names the step that paused
    assert env.error.message == "Plan paused at step 'validate': validate waits for approval"
    assert env.metadata["step"] == "validate"
    state = store.read("etl")
    assert state["status"] == "paused" and state["next_step"] == "validate"  # guarantee 19, 21
    assert state["error"]["type"] == "PlanPaused"
    c.pause.clear()
    assert run(etl_plan(store, c, resume=True)).ok
    assert c.calls["validate"] == 2 and c.calls["extract"] == 1  # guarantee 20


def test_a_pause_in_a_parallel_band_names_the_branch(store: Store) -> None:
    # guarantee 595
    def waits(task: str) -> str:
        raise PlanPaused("the bank has not answered")

    plan = Plan(
        Step(lambda t: "ok", name="quote", parallel=True),
        Step(waits, name="payment", parallel=True),
        store=store,
        checkpoint_key="band-pause",
    )
    env = run(plan)
    assert env.error is not None
    assert env.error.message == "Plan paused at step 'payment': the bank has not answered"
    assert store.read("band-pause")["error"]["message"] == env.error.message


def test_pause_is_base_exception_with_message() -> None:
    # guarantee 62
    assert issubclass(PlanPaused, BaseException) and not issubclass(PlanPaused, Exception)
    assert PlanPaused().message == "Plan paused"
    assert PlanPaused("waiting").message == "waiting"


# -- parallel bands ------------------------------------------------------------------------


def band_plan(store: Store, c: Counter, consumer: Any = None) -> Plan:
    steps = [
        Step(c.step("prep"), writes="prep"),
        Step(c.step("left"), writes="left", parallel=True),
        Step(c.step("mid"), writes="mid", parallel=True),
        Step(c.step("right"), writes="right", parallel=True),
        Step(consumer or c.step("after"), name="after", task=from_parallel_all("left")),
    ]
    return Plan(*steps, store=store, checkpoint_key="band", resume=True)


def test_band_failure_points_at_band_start_and_applies_writes_atomically(store: Store) -> None:
    # guarantee 10, 11
    c = Counter()
    c.fail.add("mid")
    env = run(band_plan(store, c))
    assert not env.ok and env.metadata["step"] == "mid"
    state = store.read("band")
    assert state["status"] == "failed" and state["next_step"] == "left"  # guarantee 10
    # The finished siblings were journaled but their writes are not applied (guarantee 11).
    assert state["completed_steps"] == ["prep"]
    assert state["kv"] == {"prep": "prep(batch)"}
    assert store.read("left") is None and store.read("right") is None
    c.fail.clear()
    assert run(band_plan(store, c)).ok
    # Branches already journaled are not re-executed; the band completes as a whole.
    assert c.calls == {"prep": 1, "left": 1, "mid": 2, "right": 1, "after": 1}
    state = store.read("band")
    assert {k: store.read(k) for k in ("left", "mid", "right")} == {
        k: state["kv"][k] for k in ("left", "mid", "right")
    }


def test_band_pause_points_at_band_start(store: Store) -> None:
    # guarantee 19 (band -> first step)
    c = Counter()
    c.pause.add("right")
    env = run(band_plan(store, c))
    assert env.error is not None and env.error.type == "PlanPaused"
    assert store.read("band")["next_step"] == "left"


def test_from_parallel_all_correct_across_a_crash(store: Store) -> None:
    # guarantee 25: the band's outputs come back from v2 history after the resume
    c = Counter()
    got: list[Any] = []
    crash = {"on": True}

    def after(payload: Any) -> str:
        if crash["on"]:
            raise RuntimeError("crash before the aggregate is used")
        got.append(payload)
        return "ok"

    run(band_plan(store, c, consumer=after))
    crash["on"] = False
    assert run(band_plan(store, c, consumer=after)).ok
    assert got == [
        {"left": "left(prep(batch))", "mid": "mid(prep(batch))", "right": "right(prep(batch))"}
    ]
    assert c.calls["left"] == 1


def test_v1_checkpoint_without_history_resumes_and_aggregator_falls_back(store: Store) -> None:
    # guarantee 26: a v1 checkpoint (stored by an older writer, no history) resumes without crashing
    store.write(
        "band",
        {
            "next_step": "after",
            "kv": {"prep": "old-prep", "left": "L", "mid": "M", "right": "R"},
            "completed_steps": ["prep", "left", "mid", "right"],
            "status": "failed",
            "run_uid": "abc",
            "checkpoint_version": 1,
        },
    )
    c = Counter()
    got: list[Any] = []

    def after(payload: Any) -> str:
        got.append(payload)
        return "done"

    env = run(band_plan(store, c, consumer=after), "the start task")
    assert env.ok, env.error
    assert got == ["the start task"]  # falls back to the start envelope
    assert "left" not in c.calls
    state = store.read("band")
    assert state["kv"]["left"] == "L" and state["status"] == "done"
    assert state["completed_steps"][-1] == "after"


@pytest.mark.parametrize("status", ["running", "claimed"])
def test_an_old_format_running_checkpoint_is_not_overwritten_by_a_fresh_run(
    store: Store, status: str
) -> None:
    # guarantee 404: before, a resume=False run claimed the key over it without a word
    old = {
        "next_step": "transform",
        "kv": {"raw": "old-raw"},
        "completed_steps": ["extract"],
        "status": status,
        "run_uid": "0ld",
        "checkpoint_version": 2,
        "history": [],
    }
    store.write("etl", old)
    c = Counter()
    with pytest.raises(ConcurrentPlanRunError) as caught:
        run(etl_plan(store, c))
    message = str(caught.value)
    assert (
        f"checkpoint_key 'etl' holds a Plan checkpoint in an older format with status {status!r}"
        in message
    )
    assert "resume=True" in message and "store.delete('etl')" in message
    assert c.calls == {} and store.read("etl") == old  # nothing ran, nothing was written
    env = run(etl_plan(store, c, resume=True))  # the fix: it is imported and continued
    assert env.ok and "extract" not in c.calls
    assert store.read("etl")["kv"]["raw"] == "old-raw"


def test_an_old_format_failed_checkpoint_is_started_over_by_a_fresh_run(store: Store) -> None:
    # guarantee 404: only claimed and running ones may have a live writer
    store.write(
        "etl",
        {
            "next_step": "transform",
            "kv": {"raw": "old"},
            "completed_steps": ["extract"],
            "status": "failed",
            "run_uid": "0ld",
            "checkpoint_version": 2,
            "history": [],
        },
    )
    c = Counter()
    assert run(etl_plan(store, c)).ok and c.calls["extract"] == 1
    assert store.read("etl")["kv"]["raw"] == "extract(batch)"


# -- concurrency ---------------------------------------------------------------------------


def test_second_concurrent_run_fails_and_never_steals(store: Store) -> None:
    # guarantee 27, 30, and the known fault "resuming a live owner's key steals the run"
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(payload: Any) -> str:
        calls.append("slow")
        started.set()
        release.wait(10)
        return "slow done"

    def make(resume: bool) -> Plan:
        return Plan(Step(slow, writes="w"), store=store, checkpoint_key="live", resume=resume)

    result: list[Envelope[Any]] = []
    t = threading.Thread(target=lambda: result.append(run(make(False))))
    t.start()
    assert started.wait(10)
    try:
        for resume in (False, True):
            with pytest.raises(ConcurrentPlanRunError, match="live") as info:
                run(make(resume))
            assert isinstance(info.value, RuntimeError)  # guarantee 30
    finally:
        release.set()
        t.join(10)
    assert calls == ["slow"] and result[0].ok


def test_run_many_same_key_fail_mode_gives_error_envelopes(store: Store) -> None:
    # guarantee 27 + 65: run_many never raises; the losers get error envelopes
    gate = threading.Event()

    def step(payload: Any) -> str:
        gate.wait(5)
        return f"done {payload}"

    plan = Plan(Step(step), store=store, checkpoint_key="shared")
    timer = threading.Timer(0.5, gate.set)
    timer.start()
    out = plan.run_many(["a", "b", "c"])
    timer.cancel()
    gate.set()
    errors = [e for e in out if not e.ok]
    assert len([e for e in out if e.ok]) == 1 and len(errors) == 2
    assert all(e.error is not None and e.error.type == "ConcurrentPlanRunError" for e in errors)


def test_fork_isolates_checkpoint_and_writes_and_can_be_pruned(store: Store) -> None:
    # guarantee 28 + known fault: concurrent forks overwrite each other's writes; no cleanup
    def load(ticker: str) -> str:
        time.sleep(0.05)
        return f"prices:{ticker}"

    def score(prices: str) -> str:
        return prices.upper()

    plan = Plan(
        Step(load, writes="prices"),
        Step(score, writes="score"),
        store=store,
        checkpoint_key="backtest",
        on_concurrent="fork",
    )
    out = plan.run_many(["AAPL", "GOOG", "MSFT"], concurrency=3)
    assert all(e.ok for e in out)
    keys = {e.metadata["checkpoint_key"] for e in out}
    assert len(keys) == 3
    for env in out:
        key, uid = env.metadata["checkpoint_key"], env.metadata["run_uid"]
        assert key == f"backtest:{uid}"
        state = store.read(key)
        assert state["status"] == "done" and state["run_uid"] == uid
        assert store.read(f"{key}:score") == env.payload == state["kv"]["score"]
    assert store.read("prices") is None and store.read("backtest") is None
    # a run of its own under a longer key, and a value beside it, are not forks
    other = Plan(Step(score, writes="out"), store=store, checkpoint_key="backtest:2026-04-30")
    assert Agent(engine=other)("own").ok
    store.write("backtest:2026-04-30:notes", {"keep": "me"})
    assert plan.prune_forks() == 3
    assert sorted(store.keys()) == ["backtest:2026-04-30", "backtest:2026-04-30:notes", "out"]


def test_lost_ownership_never_overwrites(store: Store) -> None:
    # guarantee 31: every checkpoint write is a compare-and-swap; a run that lost its claim
    # (its lease expired and another run took over) writes nothing
    took: list[str] = []

    def sabotage(payload: Any) -> str:
        head = store.backend.run_get("cas")
        assert head is not None
        store.backend.run_renew("cas", head.run_uid, time.time() - 1)
        # another host takes the expired run over
        import os

        os.environ["STEPSTONE_HOST_ID"] = "other-host"
        from stepstone.core import _ids

        _ids.host_id.cache_clear()
        try:
            taken = claim_run(store, "cas", kind="plan", resume=True, first_step="first")
        finally:
            del os.environ["STEPSTONE_HOST_ID"]
            _ids.host_id.cache_clear()
        assert taken.run is not None
        took.append(taken.head.run_uid)
        taken.run.release()
        return "late"

    plan = Plan(
        Step(lambda p: "ok", name="first"),
        Step(sabotage, writes="w"),
        store=store,
        checkpoint_key="cas",
    )
    with pytest.raises(ConcurrentPlanRunError, match="lost checkpoint 'cas'"):
        run(plan)
    state = store.read("cas")
    assert state["run_uid"] == took[0] and state["status"] == "claimed"
    assert store.read("w") is None


# -- loops ----------------------------------------------------------------------------------


def loop_plan(
    store: Store, counter: dict[str, int], crash_at: int | None, max_iterations: int = 100
) -> Plan:
    def work(payload: Any) -> int:
        counter["n"] += 1
        if crash_at is not None and counter["n"] == crash_at:
            raise RuntimeError("crash mid-loop")
        return counter["n"]

    return Plan(
        Step(lambda p: 0, name="init"),
        Step(work, name="work", writes="n", routes={"work": lambda env: env.payload < 5}),
        Step(lambda p: f"finished at {p}", name="end"),
        store=store,
        checkpoint_key="loop",
        resume=True,
        max_iterations=max_iterations,
    )


def test_loop_resume_continues_iteration_counter(store: Store) -> None:
    # guarantee 59, 130
    counter = {"n": 0}
    assert not run(loop_plan(store, counter, crash_at=3)).ok
    # the counter counts routed re-visits that completed: work(n=2); not the failed n=3
    assert store.read("loop")["iteration"] == 1
    env = run(loop_plan(store, counter, crash_at=None))
    assert env.ok and env.payload == "finished at 5"
    assert store.read("loop")["iteration"] == 3  # 1 before + work(n=4), work(n=5)


def test_max_iterations_is_an_error_and_resume_cannot_exceed_it(store: Store) -> None:
    # guarantee 33, 130 + known fault: the counter restarting on resume
    counter = {"n": 0}
    env = run(loop_plan(store, counter, crash_at=2, max_iterations=2))
    assert not env.ok
    env = run(loop_plan(store, counter, crash_at=None, max_iterations=2))
    assert not env.ok and env.error is not None
    assert env.error.type == "MaxIterationsExceeded" and "max_iterations=2" in env.error.message
    assert "routed re-visits" in env.error.message
    state = store.read("loop")
    assert state["status"] == "failed" and state["iteration"] == 2
    # work ran: n=1 (first visit), n=2 (re-visit, failed: not counted), after the resume
    # n=3 and n=4 (re-visits 1 and 2 = the cap); the third re-visit is refused
    assert counter["n"] == 4


MAX_ITERATIONS_RULE = (
    "`max_iterations` (default 100) caps routed re-visits: each time a step, or a parallel "
    "band counted once, completes again after it already completed in the run; first visits "
    "and failed or paused attempts never count, and a resumed run goes on counting from its "
    "journal."
)


def _flat(text: str) -> str:
    return " ".join(text.replace("``", "`").split())


def test_max_iterations_has_one_rule_said_the_same_everywhere(store: Store) -> None:
    # guarantee 130: before, guarantee 32 said it counted every executed step
    root = Path(__file__).resolve().parents[3]
    guarantees = (root / "docs" / "guarantees.md").read_text("utf-8")
    assert MAX_ITERATIONS_RULE in _flat(
        re.search(r"^130\. .*?(?=^\d+\. )", guarantees, re.M | re.S)[0]
    )
    assert re.search(r"^32\. Withdrawn\b", guarantees, re.M)
    assert MAX_ITERATIONS_RULE in _flat((root / "docs" / "plans.md").read_text("utf-8"))
    assert MAX_ITERATIONS_RULE in _flat((Plan.__doc__ or "") + (Plan.__init__.__doc__ or ""))
    # the rule, run: a straight plan longer than the cap finishes
    steps = [Step(Counter().step(f"s{i}")) for i in range(5)]
    assert run(Plan(*steps, store=store, checkpoint_key="long", max_iterations=1)).ok


# -- stale checkpoints, corruption, conflicts ---------------------------------------------


def test_stale_next_step_after_plan_change_is_a_clear_error(store: Store) -> None:
    # guarantee 35 + known fault: silent success
    c = Counter()
    c.fail.add("validate")
    run(etl_plan(store, c, resume=True))
    changed = Plan(
        Step(c.step("extract"), writes="raw"),
        Step(c.step("check"), writes="v"),
        store=store,
        checkpoint_key="etl",
        resume=True,
    )
    with pytest.raises(StaleCheckpointError, match=r"'validate'.*store\.delete\('etl'\)"):
        run(changed)
    assert store.read("etl")["status"] == "failed"  # nothing was claimed
    store.delete("etl")
    assert run(changed).ok


def test_key_holding_a_plain_value_is_never_overwritten(store: Store) -> None:
    store.write("etl", {"some": "user data"})
    with pytest.raises(StoreKeyConflictError, match=r"store\.delete\('etl'\)"):
        run(etl_plan(store, Counter()))
    assert store.read("etl") == {"some": "user data"}


def test_corrupt_checkpoint_names_the_key(store: Store, tmp_path: Path) -> None:
    c = Counter()
    c.fail.add("load")
    run(etl_plan(store, c, resume=True))
    with contextlib.closing(sqlite3.connect(tmp_path / "plan.sqlite")) as raw, raw:
        raw.execute(
            "UPDATE stepstone_journal SET data = '{not json' WHERE run_key = 'etl' AND seq = 1"
        )
    with pytest.raises(CheckpointCorruptError, match="'etl'"):
        store.read("etl")
    c.fail.clear()
    with pytest.raises(CheckpointCorruptError, match="'etl'"):
        run(etl_plan(store, c, resume=True))


def test_unserializable_writes_are_stringified_with_warning_or_strict_error(store: Store) -> None:
    # guarantee 36
    handle = threading.Lock()
    plan = Plan(
        Step(lambda p: {"fh": handle}, name="open", writes="res"), store=store, checkpoint_key="ser"
    )
    with pytest.warns(UnserializableValueWarning, match=r"step 'open' writes\['res'\]"):
        assert run(plan).ok
    assert store.read("res") == {"fh": str(handle)}
    strict = Plan(
        Step(lambda p: {"fh": handle}, name="open", writes="res"),
        store=store,
        checkpoint_key="ser2",
        strict=True,
    )
    env = run(strict)
    assert env.error is not None and env.error.type == SerializationError.__name__
    assert store.read("ser2")["status"] == "failed"


def test_resume_does_not_reinject_session(store: Store) -> None:
    # guarantee 38
    c = Counter()
    c.fail.add("validate")
    first = Session()
    run(etl_plan(store, c, resume=True), session=first)
    n = len(first.events)
    assert first.of_type(EventType.STEP_ERROR)
    c.fail.clear()
    second = Session()
    run(etl_plan(store, c, resume=True), session=second)
    assert len(first.events) == n  # nothing flows to the first run's session
    assert [e.payload["step"] for e in second.of_type(EventType.STEP_START)] == [
        "validate",
        "load",
    ]


def test_store_backends_and_delete(tmp_path: Path) -> None:
    # guarantee 45
    path = tmp_path / "wal.sqlite"
    Store(db=path).close()
    with contextlib.closing(sqlite3.connect(path)) as raw, raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    mem = Store()
    mem.write("k", 1)
    assert mem.delete("k") and mem.read("k") is None


def test_journal_grows_linearly_one_head(store: Store, tmp_path: Path) -> None:
    # "append, don't rewrite": one head row updated in place, one journal row per step (and
    # one for the plan's shape, written once at the start), and a head that does not grow
    # with the plan.
    steps = [Step(lambda p, i=i: f"v{i}", name=f"s{i}", writes=f"w{i}") for i in range(30)]
    assert run(Plan(*steps, store=store, checkpoint_key="lin")).ok
    with contextlib.closing(sqlite3.connect(tmp_path / "plan.sqlite")) as raw, raw:
        assert raw.execute("SELECT COUNT(*) FROM stepstone_runs").fetchone()[0] == 1
        kinds = [k for (k,) in raw.execute("SELECT kind FROM stepstone_journal ORDER BY seq")]
        assert kinds == ["plan"] + ["step"] * 30
        sizes = [
            len(d)
            for (d,) in raw.execute(
                "SELECT data FROM stepstone_journal WHERE kind = 'step' ORDER BY seq"
            )
        ]
        (meta,) = raw.execute("SELECT meta FROM stepstone_runs").fetchone()
    assert max(sizes) - min(sizes) < 10  # row 30 is no bigger than row 1
    assert len(meta) < 300  # the head holds a fingerprint of the steps, not the steps


def test_async_api_inside_event_loop(store: Store) -> None:
    agent = Agent(engine=etl_plan(store, Counter()))

    async def go() -> Envelope[Any]:
        with pytest.raises(RuntimeError, match=r"await agent\.run"):
            agent("inside a loop")
        return await agent.run("batch")

    assert asyncio.run(go()).ok
    assert json.loads(json.dumps(store.read("etl")))["status"] == "done"


def test_idempotency_key_is_stable_across_crash_and_resume(store: Store) -> None:
    # guarantee 43: a failed step is retried as-is; its idempotency key lets an external API
    # deduplicate the retried side effect (same key), while a new execution gets a new one.
    seen: list[str] = []
    fail = {"on": True}

    def charge(env: Envelope[Any]) -> str:
        seen.append(env.metadata["idempotency_key"])
        if fail["on"]:
            raise ConnectionError("gateway timeout after the charge was sent")
        return "charged"

    def make() -> Plan:
        return Plan(
            Step(lambda p: "order-7", name="prepare"),
            Step(charge, writes="receipt"),
            store=store,
            checkpoint_key="orders",
            resume=True,
        )

    assert not run(make()).ok
    fail["on"] = False
    assert run(make()).ok
    origin = store.backend.run_get("orders").meta["origin"]  # type: ignore[union-attr]
    assert re.fullmatch("[0-9a-f]{12}", origin)
    assert seen == [f"orders:{origin}:charge:2"] * 2
    assert run(Plan(Step(charge), store=store, checkpoint_key="orders2")).ok
    assert re.fullmatch("orders2:[0-9a-f]{12}:charge:1", seen[-1])
    # another run of the key is another execution: a fresh start, a retry's re-run and a
    # fork's copy each get keys of their own, so an external API does not deduplicate them
    # into the old charge
    fresh = Plan(*make().steps, store=store, checkpoint_key="orders", resume=False)
    assert run(fresh).ok
    retry_run(store, "orders", from_step="charge")
    assert run(make()).ok
    fork_run(store, "orders", at="prepare", to="orders-copy")
    assert run(Plan(*make().steps, store=store, checkpoint_key="orders-copy", resume=True)).ok
    charged = [k for k in seen if k.endswith(":charge:2")]
    assert len(charged) == 5 and len(set(charged)) == 4, charged


def test_an_output_with_a_lone_surrogate_is_stored_and_resumed(store: Store) -> None:
    # guarantee 45: text decoded from bytes that are not UTF-8 (os.fsdecode) reads back as
    # it was; on SQLite it was a raw UnicodeEncodeError that failed the run on every resume
    calls: list[str] = []

    def name(_: object) -> str:
        calls.append("name")
        return "report-\udcff.txt"

    def plan() -> Agent:
        return Agent(
            engine=Plan(Step(name, writes="file"), Step(len), store=store,
                        checkpoint_key="fs", resume=True)
        )  # fmt: skip

    assert plan()("go").payload == 12
    assert store.read("file") == "report-\udcff.txt"
    assert plan()("go").metadata["cached"] and calls == ["name"]
