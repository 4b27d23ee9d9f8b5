"""Bits flipped anywhere in a SQLite store file (after its 100-byte header), as a failing
disk or a bad copy would: every read, check and resume either gives the result an intact
file gives, or refuses with a stepstone error naming the damage, and a refused resume
runs no step (guarantee 131, 132, 157).

The flips are drawn from numbered random generators, so a failure names the number.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Plan, Step, Store
from stepstone.exceptions import StepstoneError
from stepstone.graph import StoreCheckpointer
from stepstone.store import check_store
from tests.engines.graph._graphs import Counter, loop_graph

SEEDS = range(100)


def _flip(src: Path, dst: Path, seed: int) -> list[int]:
    """Copy ``src`` to ``dst`` with 1 to 4 bits flipped past the file header."""
    rng = random.Random(seed)
    data = bytearray(src.read_bytes())
    offsets = [rng.randrange(100, len(data)) for _ in range(rng.choice([1, 1, 2, 4]))]
    for offset in offsets:
        data[offset] ^= 1 << rng.randrange(8)
    dst.write_bytes(data)
    return offsets


def _outcome(fn: Callable[[], Any]) -> Any:
    """What ``fn()`` gives, or the stepstone error it raises (any other error fails)."""
    try:
        return fn()
    except StepstoneError as exc:
        return exc


def _plan(store: Store, calls: list[str], fail: bool) -> Plan:
    def a(payload: Any) -> dict[str, Any]:
        calls.append("a")
        return {"a": payload, "pad": "x" * 300}

    def b(payload: Any) -> str:
        calls.append("b")
        if fail:
            raise RuntimeError("b broke")
        return "b"

    def c(payload: Any) -> str:
        calls.append("c")
        return f"c:{payload}"

    return Plan(Step(a, writes="w"), Step(b), Step(c), store=store, checkpoint_key="k", resume=True)


def _read_everything(db: Path) -> None:
    """Open the store, read the run and check the whole file: none may fail but with a
    stepstone error."""

    def read() -> Any:
        with Store(db=db, read_only=True) as store:
            check_store(store)
            return store.read("k")

    _outcome(read)


@pytest.fixture(scope="module")
def plan_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with 20 finished runs, plain values and one run failed at step b."""
    db = tmp_path_factory.mktemp("flips") / "plan.sqlite"
    with Store(db=db) as store:
        for i in range(20):
            plan = Plan(
                Step(lambda p, i=i: {"i": i, "pad": "y" * 200}, name="s"),
                store=store,
                checkpoint_key=f"other{i}",
            )
            assert Agent(engine=plan)("go").ok
            store.write(f"value{i}", {"n": i})
        assert not Agent(engine=_plan(store, [], fail=True))("go").ok
    return db


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plan_store_with_flipped_bits(plan_store: Path, tmp_path: Path, seed: int) -> None:
    db = tmp_path / "s.sqlite"
    _flip(plan_store, db, seed)
    _read_everything(db)
    calls: list[str] = []

    def resume() -> Any:
        with Store(db=db) as store:
            env = Agent(engine=_plan(store, calls, fail=False))("go")
        if env.error is not None and env.error.type != "RuntimeError":
            return env.error.type
        return env.payload

    outcome = _outcome(resume)
    # Step a was committed before the damage: it never runs again, whatever the outcome.
    assert "a" not in calls, f"seed {seed}: the committed step ran again ({outcome!r})"
    if outcome == "c:b":
        assert calls == ["b", "c"], f"seed {seed}: {calls}"


@pytest.fixture(scope="module")
def graph_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A graph record that failed at its third tick."""
    db = tmp_path_factory.mktemp("flips") / "graph.sqlite"
    with Store(db=db) as store:
        cp = StoreCheckpointer(store)
        with pytest.raises(StepstoneError):
            loop_graph(cp, fail_at=3).invoke(Counter(), correlation_id="g")
        (record,) = cp.list()
    return db, record.invocation_id


@pytest.mark.parametrize("seed", SEEDS)
def test_a_graph_store_with_flipped_bits(
    graph_store: tuple[Path, str], tmp_path: Path, seed: int
) -> None:
    src, invocation = graph_store
    db = tmp_path / "g.sqlite"
    _flip(src, db, seed)
    log = tmp_path / "ticks.log"

    def resume() -> Any:
        with Store(db=db) as store:
            check_store(store)
            return loop_graph(StoreCheckpointer(store), log=log).invoke(
                resume_invocation=invocation
            )

    outcome = _outcome(resume)
    ticks = [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []
    # Ticks 1 and 2 were committed before the damage: they never run again.
    assert not {"1", "2"} & set(ticks), f"seed {seed}: committed nodes ran again ({ticks})"
    if isinstance(outcome, Counter) and outcome.n == 5:
        assert ticks == ["3", "4", "5"], f"seed {seed}: {ticks}"


def test_the_flips_reach_the_records(plan_store: Path, tmp_path: Path) -> None:
    """The random flips are not all harmless: some of them damage what the store holds."""
    problems = 0
    for seed in SEEDS:
        db = tmp_path / f"{seed}.sqlite"
        _flip(plan_store, db, seed)

        def check(db: Path = db) -> Any:
            with Store(db=db, read_only=True) as store:
                return check_store(store)

        report = _outcome(check)
        problems += isinstance(report, StepstoneError) or not report.ok
    assert problems >= 5
