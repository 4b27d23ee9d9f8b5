"""Commits shared across threads: on SQLite, the commits and claims that threads of one
process make at the same moment (each on its own private loop, as the sync API runs them)
are written as one transaction, each run's compare-and-swap checked on its own.

Each test holds the backend's turn with one commit (its thread waits inside the backend's
``run_commit``) until the other threads' items are queued behind it, so the batch they form
is certain, not left to the scheduler."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Envelope, Plan, Step, Store
from stepstone.durable import OwnedRun, claim_run, delete_run
from stepstone.durable._group import turns
from stepstone.exceptions import ConcurrentRunError, StoreKeyConflictError
from stepstone.store import JournalRow, RunHead
from stepstone.store._sqlite import SQLiteBackend

KIND = "shared-test"


class _Holding(SQLiteBackend):
    """A real SQLite backend that counts its write transactions and can hold a commit:
    the ``run_commit`` of the run under ``hold_key`` waits for ``go`` (its thread holds
    the backend's turn meanwhile). ``interrupt``: ``("before" | "after", thread id)``
    raises ``KeyboardInterrupt`` in that thread's next transaction, before or after its
    COMMIT, as a signal handler would."""

    def __init__(self, path: Path) -> None:
        self.count_lock = threading.Lock()
        self.txs = 0
        self.hold_key: str | None = None
        self.entered = threading.Event()
        self.go = threading.Event()
        self.interrupt: tuple[str, int] | None = None
        super().__init__(path)

    def run_commit(
        self,
        head: RunHead,
        expected_version: int,
        rows: Sequence[JournalRow],
        writes: Sequence[tuple[str, str]],
    ) -> bool:
        if head.key == self.hold_key:
            self.entered.set()
            assert self.go.wait(30)
        return super().run_commit(head, expected_version, rows, writes)

    @contextmanager
    def _tx(self, *, flush: bool = True) -> Iterator[Any]:
        if flush:  # a claim's transaction (flush=False) is counted once, by the inner call
            with self.count_lock:
                self.txs += 1
        when = None
        if self.interrupt is not None and self.interrupt[1] == threading.get_ident():
            when, self.interrupt = self.interrupt[0], None
        with super()._tx(flush=flush) as conn:
            yield conn
            if when == "before":
                raise KeyboardInterrupt
        if when == "after":
            raise KeyboardInterrupt


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Store, _Holding]]:
    backend = _Holding(tmp_path / "shared.sqlite")
    with Store(backend=backend) as store:
        yield store, backend


def _until(what: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _claim(store: Store, key: str) -> OwnedRun:
    claimed = claim_run(store, key, kind=KIND, resume=False, first_step="a")
    assert claimed.run is not None
    return claimed.run


@contextmanager
def _turn_held(store: Store, backend: _Holding, queued: int) -> Iterator[Callable[[], None]]:
    """Hold the backend's turn with a commit of the run ``holder`` (in a thread of its
    own); inside, start the threads whose items must queue, then call the function given
    to wait until ``queued`` items wait and let the holder go. The backend counts write
    transactions from there on: the holder's commit is the first."""
    holder = _claim(store, "holder")
    backend.hold_key = "holder"
    thread = threading.Thread(
        target=lambda: holder.commit_sync(status="done", next_step=None, rows=[("step", "a", 0)])
    )
    thread.start()
    assert backend.entered.wait(20)
    shared = turns(backend)

    def release() -> None:
        _until(lambda: sum(len(w.items) for w in shared.queue) >= queued)
        backend.txs = 0
        backend.go.set()
        thread.join(20)

    try:
        yield release
    finally:
        backend.go.set()
        thread.join(20)
        backend.hold_key = None
        holder.release()


def _journal(store: Store, key: str) -> list[str]:
    return [row.data for row in store.backend.run_journal(key)]


def test_commits_of_many_threads_share_one_transaction(held: tuple[Store, _Holding]) -> None:
    # guarantee 620
    store, backend = held
    runs = [_claim(store, f"run-{i}") for i in range(7)]
    results: dict[int, Any] = {}

    def commit(i: int) -> None:
        runs[i].commit_sync(
            status="running", next_step="b", rows=[("step", "a", i)], writes=[(f"v{i}", i)]
        )
        results[i] = runs[i].head.version

    with _turn_held(store, backend, 7) as release:
        threads = [threading.Thread(target=commit, args=(i,)) for i in range(7)]
        for t in threads:
            t.start()
        release()
        for t in threads:
            t.join(20)
    assert backend.txs == 2  # the holder's commit, then the seven in one transaction
    assert results == {i: 2 for i in range(7)}
    for i in range(7):
        assert _journal(store, f"run-{i}") == [str(i)]
        assert store.read(f"v{i}") == i
        runs[i].release()


def test_a_run_that_fails_in_a_shared_batch_lands_nothing_and_loses_nothing(
    held: tuple[Store, _Holding],
) -> None:
    # guarantee 621: one run lost its key, one writes a key that holds a run; the others
    # land, and nothing of the two failed runs does
    store, backend = held
    runs = [_claim(store, f"run-{i}") for i in range(6)]
    _claim(store, "a-run").release()
    delete_run(store, "run-1")  # run-1's next commit misses its version
    outcome: dict[int, Any] = {}

    def commit(i: int) -> None:
        writes = [("a-run", 1)] if i == 2 else [(f"v{i}", i)]
        try:
            runs[i].commit_sync(
                status="running", next_step="b", rows=[("step", "a", i)], writes=writes
            )
            outcome[i] = "ok"
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome[i] = exc

    with _turn_held(store, backend, 6) as release:
        threads = [threading.Thread(target=commit, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        release()
        for t in threads:
            t.join(20)
    assert isinstance(outcome.pop(1), ConcurrentRunError)
    assert isinstance(outcome.pop(2), StoreKeyConflictError)
    assert outcome == {i: "ok" for i in (0, 3, 4, 5)}
    assert backend.txs == 2  # the holder's; the failures were decided inside the batch
    assert store.backend.run_get("run-1") is None and store.read("v1") is None
    assert _journal(store, "run-2") == [] and store.backend.run_get("run-2").version == 1  # type: ignore[union-attr]
    for i in (0, 3, 4, 5):
        assert _journal(store, f"run-{i}") == [str(i)] and store.read(f"v{i}") == i
    for run in runs:
        run.release()


def test_claims_of_many_threads_share_a_transaction_and_a_refused_one_stays_its_own(
    held: tuple[Store, _Holding],
) -> None:
    # guarantee 620, 621
    store, backend = held
    live = _claim(store, "taken")  # owned by a live run: a claim of it is refused
    got: dict[str, Any] = {}

    def claim(key: str) -> None:
        try:
            got[key] = claim_run(store, key, kind=KIND, resume=True, first_step="a")
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            got[key] = exc

    keys = ["taken", *(f"new-{i}" for i in range(5))]
    with _turn_held(store, backend, len(keys)) as release:
        threads = [threading.Thread(target=claim, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        release()
        for t in threads:
            t.join(20)
    assert backend.txs == 2  # the holder's commit, then the six claims
    assert isinstance(got.pop("taken"), ConcurrentRunError)
    assert store.backend.run_get("taken") == live.head
    for key, claimed in got.items():
        assert claimed.outcome == "fresh" and store.backend.run_get(key) == claimed.head
        claimed.run.release()
    live.release()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_writer_interrupted_in_a_shared_batch_leaves_no_one_waiting_or_wrong(
    held: tuple[Store, _Holding], when: str
) -> None:
    """guarantee 622: a signal's exception (a second Ctrl-C) in the thread writing a
    shared batch, before or after its COMMIT: that thread raises it; every other thread
    gets its true outcome (a commit written once, never twice; a claim that landed is
    its run's), and the turn passes on."""
    store, backend = held
    runs = {i: _claim(store, f"run-{i}") for i in range(4)}
    outcome: dict[str, Any] = {}
    first_queued = threading.Event()

    def commit(i: int) -> None:
        if i == 0:
            backend.interrupt = (when, threading.get_ident())
            first_queued.set()
        try:
            runs[i].commit_sync(status="running", next_step="b", rows=[("step", "a", i)])
            outcome[f"run-{i}"] = "ok"
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome[f"run-{i}"] = exc

    def claim() -> None:
        outcome["fresh"] = claim_run(store, "fresh", kind=KIND, resume=True, first_step="a")

    shared = turns(backend)
    with _turn_held(store, backend, 5) as release:
        writer = threading.Thread(target=commit, args=(0,))  # first in the queue: it writes
        writer.start()
        assert first_queued.wait(20)
        _until(lambda: len(shared.queue) == 1)
        others = [threading.Thread(target=commit, args=(i,)) for i in (1, 2, 3)]
        others.append(threading.Thread(target=claim))
        for t in others:
            t.start()
        release()
        for t in [writer, *others]:
            t.join(20)
            assert not t.is_alive()
    assert isinstance(outcome.pop("run-0"), KeyboardInterrupt)
    assert _journal(store, "run-0") == (["0"] if when == "after" else [])
    fresh = outcome.pop("fresh")
    assert fresh.outcome == "fresh" and store.backend.run_get("fresh") == fresh.head
    assert outcome == {f"run-{i}": "ok" for i in (1, 2, 3)}
    for i in (1, 2, 3):
        assert _journal(store, f"run-{i}") == [str(i)]  # written once
        assert store.backend.run_get(f"run-{i}") == runs[i].head
    assert shared.writer is None and shared.queue == []
    # the turn works as before
    runs[1].commit_sync(status="done", next_step=None, rows=[("step", "b", 9)])
    assert _journal(store, "run-1") == ["1", "9"]
    for run in runs.values():
        run.release()
    fresh.run.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_commits_while_a_parent_thread_held_the_turn(
    held: tuple[Store, _Holding],
) -> None:
    # guarantee 623: the child has no thread holding the turn; it starts with none
    store, backend = held
    with _turn_held(store, backend, 0):
        assert turns(backend).writer is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
            pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                backend.hold_key = None
                run = _claim(store, "child")
                run.commit_sync(status="done", next_step=None, rows=[("step", "a", 7)])
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on the turn its parent held")
            time.sleep(0.005)
        assert os.waitstatus_to_exitcode(done[1]) == 0
    assert _journal(store, "child") == ["7"]


# -- every engine, run from a thread pool --------------------------------------------------
def _add_one(x: int) -> int:
    return x + 1


def _writes(store: Store, prefix: str) -> tuple[int, int]:
    """(runs, claims and commits) of the runs under ``prefix``: a run's version counts
    its claim and its commits."""
    heads = store.backend.run_list(prefix)
    return len(heads), sum(h.version for h in heads)


def _fan_out(store: Store, backend: _Holding, n: int, call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` for i < n from a ThreadPoolExecutor(n), the first claims all queued
    behind a held turn."""
    with _turn_held(store, backend, n) as release, ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(call, i) for i in range(n)]
        release()
        return [f.result(timeout=60) for f in futures]


def test_plans_called_from_a_thread_pool_share_commits(held: tuple[Store, _Holding]) -> None:
    # guarantee 624
    store, backend = held
    plan = Plan(
        *[Step(_add_one, name=f"s{i}") for i in range(5)],
        store=store,
        checkpoint_key="fan",
        on_concurrent="fork",
    )
    agent = Agent(engine=plan)
    envs = _fan_out(store, backend, 8, lambda i: agent(Envelope(task="t", payload=i)))
    assert [e.payload for e in envs] == [i + 5 for i in range(8)]
    runs, writes = _writes(store, "fan:")
    assert runs == 8 and writes == 8 * 6
    assert backend.txs < writes


def test_workflows_run_from_a_thread_pool_share_commits(held: tuple[Store, _Holding]) -> None:
    # guarantee 624
    from stepstone import step, workflow

    store, backend = held

    @step
    def double(x: int) -> int:
        return 2 * x

    @workflow(store=store, key="wf-{n}")
    async def flow(n: int) -> int:
        total = n
        for _ in range(3):
            total = await double(total)
        return total

    got = _fan_out(store, backend, 8, flow.run_sync)
    assert got == [8 * i for i in range(8)]
    runs, writes = _writes(store, "wf-")
    assert runs == 8 and backend.txs < writes


def test_graphs_invoked_from_a_thread_pool_share_commits(held: tuple[Store, _Holding]) -> None:
    # guarantee 624
    from stepstone.graph import END, GraphBuilder, State, StoreCheckpointer

    store, backend = held

    class Count(State):
        n: int = 0

    def bump(state: Count) -> dict[str, int]:
        return {"n": state.n + 1}

    graph = (
        GraphBuilder(Count)
        .add_node("a", bump)
        .add_node("b", bump)
        .add_edge("a", "b")
        .add_edge("b", END)
        .set_entry("a")
        .with_checkpointer(StoreCheckpointer(store, prefix="g:"))
        .compile()
    )
    got = _fan_out(store, backend, 8, lambda i: graph.invoke(Count(n=i)))
    assert [s.n for s in got] == [i + 2 for i in range(8)]
    runs, writes = _writes(store, "g:")
    assert runs == 8 and backend.txs < writes


def test_durable_agent_runs_from_a_thread_pool_share_commits(
    held: tuple[Store, _Holding],
) -> None:
    # guarantee 624
    from stepstone import Runner, tool
    from stepstone.testing import FunctionModel, call

    store, backend = held

    @tool
    def echo(x: str) -> str:
        """Echo x."""
        return x

    def reply(request: Any) -> Any:
        return call("echo", x="hi") if request.turn == 0 else "done"

    agent = Agent(name="echoer", model=FunctionModel(reply), tools=[echo])
    runner = Runner(store=store)
    got = _fan_out(
        store,
        backend,
        8,
        lambda i: runner.run_sync(agent, user_message=f"m{i}", run_id=f"agent-{i}"),
    )
    assert [r.state for r in got] == ["completed"] * 8
    assert [r.final_text for r in got] == ["done"] * 8
    runs, writes = _writes(store, "agent:agent-")
    assert runs == 8 and backend.txs < writes


def test_a_loop_group_and_threads_share_the_same_turns(held: tuple[Store, _Holding]) -> None:
    """guarantee 620: a loop's batch (runs sharing one event loop) waits for its turn like
    any thread's commit, and is written with what other threads queued meanwhile."""
    from stepstone.durable import aclaim_run

    store, backend = held
    third = _claim(store, "c")
    claimed, holding = threading.Event(), threading.Event()
    heads: dict[str, RunHead] = {}

    async def two_on_a_loop() -> None:
        claims = [await aclaim_run(store, k, kind=KIND, resume=False, first_step="a") for k in "ab"]
        claimed.set()
        await asyncio.to_thread(holding.wait, 20)
        runs = [c.run for c in claims]
        await asyncio.gather(
            *(r.commit(status="done", next_step=None, rows=[("step", "a", r.key)]) for r in runs)
        )
        for r in runs:
            heads[r.key] = r.head
            r.release()

    loop_thread = threading.Thread(target=lambda: asyncio.run(two_on_a_loop()))
    loop_thread.start()
    assert claimed.wait(20)  # (the claims are written before the turn is held)
    with _turn_held(store, backend, 3) as release:
        holding.set()
        thread = threading.Thread(
            target=lambda: third.commit_sync(
                status="running", next_step="b", rows=[("step", "a", "c")]
            )
        )
        thread.start()
        release()
        for t in (thread, loop_thread):
            t.join(20)
    assert backend.txs == 2  # the holder's commit, then the loop's two and the thread's
    for key in "ab":
        assert _journal(store, key) == [f'"{key}"'] and store.backend.run_get(key) == heads[key]
    assert _journal(store, "c") == ['"c"']
    third.release()


if sys.platform == "win32":  # pragma: no cover - the suite runs on POSIX
    pytestmark = pytest.mark.skip("POSIX threads and fork")
