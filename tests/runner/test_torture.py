"""Randomized crash torture: durable pipelines in real processes, SIGKILLed at random
moments (inside steps, inside commits, between them), resumed until they finish.

Each iteration runs one pipeline on a real store (a SQLite file, or a PostgreSQL database
of its own) from ``torture_worker.py``: Plans with ``writes=``, a parallel band, a routed
loop and an LLM step; a graph with a loop; a ``Runner`` run whose tools have side effects
and in-doubt policies, paused for approvals; a ``ReplanEngine`` run whose planner (a
function or an LLM agent) plans rounds of parallel and sequential tasks, one of them an LLM
agent; runs queued to ``stepstone worker`` processes. A seeded RNG chooses how often and
when each attempt is killed: a random delay after the process is ready, or a random few
side effects in (then at most 3 ms more, so the kill lands in the commit that follows a
step). After every kill the driver stops the other processes (SIGSTOP), reads what the
store holds and checks it, then lets them go on.

What every kill and every finished iteration must satisfy:

* the store passes ``check_store`` after every kill (nothing torn, every record decodes);
* nothing committed is ever lost: each kill's committed steps include the previous kill's;
* a step committed at a kill never runs again after it (no log line written after the
  kill names it), and a step runs at most once plus once per kill that caught it in
  flight (it ran in the killed process, and its commit had not landed): guarantees 39, 43,
  106, 160, 161, 190, 191, 239 (a replan round's planner answer and each task's outcome,
  190, 191; an agent's tool declared ``in_doubt="fail"`` or ``"ask"`` is
  never run again without a person's approval, 171, 173, 381);
* every resume either finishes, pauses for a documented approval, or ends on a documented
  in-doubt failure, never on another error, and no run is left claimed or running;
* the result and every step's side effect equal those of an uninterrupted run.

Iterations: ``STEPSTONE_TORTURE_ITERATIONS`` (default 1 per test) from seed
``STEPSTONE_TORTURE_SEED`` (default 0); iteration ``i`` uses seed ``SEED + i``, which a
failure names, so ``STEPSTONE_TORTURE_SEED=<it> STEPSTONE_TORTURE_ITERATIONS=1`` runs it
alone (the kills' timing still depends on the machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Runner, RunnerConfig, Store, submit
from stepstone.durable import database_now, owner_alive
from stepstone.durable._journal_format import read_entries
from stepstone.graph import StoreCheckpointer
from stepstone.store import check_store
from tests import _spawn
from tests.runner import torture_worker as tw

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("torture_worker.py")
TARGETS = "tests.runner.torture_worker:"
ITERATIONS = int(os.environ.get("STEPSTONE_TORTURE_ITERATIONS", "1"))
SEED = int(os.environ.get("STEPSTONE_TORTURE_SEED", "0"))
#: How long one attempt (or a queue's whole run) may take before the run counts as stuck.
DEADLINE = 120.0

Step = tuple[str, str]  # (run, execution): ("p0", "s4@7")


class TortureFailure(AssertionError):
    """An invariant broke; the message names the scenario and seed."""


# -- reading the log and the store -----------------------------------------------------------
def log_lines(log: Path) -> list[tuple[str, str, int]]:
    """``(run, step, pid)`` of every side effect, in the order they happened."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3:  # a line a kill cut in half was never a finished effect
            out.append((_canonical(parts[0]), parts[1], int(parts[2])))
    return out


def _canonical(run: str) -> str:
    """A run's name in the log and in the checks: the LLM loop of a Plan's step, whose
    key holds the stamp of the Plan's run (``p0:<origin>:llm:13:llm``), is ``p0~llm``,
    as its model calls are logged; an LLM loop of a replan run, keyed by its place in the
    run (``replan-run:<origin>:round2:task2:llm``, guarantee 191), is
    ``replan-run~round2.task2``."""
    if run.endswith(":llm"):
        parts = run.split(":")
        if len(parts) >= 4 and parts[-3].startswith("round"):
            return f"{parts[0]}~{parts[-3]}.{parts[-2]}"
        return parts[0] + "~llm"
    return run


def _agent_run_id(key: str) -> str:
    prefix, suffix = "agent:", ":checkpoint:latest"
    if key.startswith(prefix) and key.endswith(suffix):
        return key[len(prefix) : -len(suffix)]
    return key  # a loop inside a Plan step: its key is its run id


def committed(store: Store) -> set[Step]:
    """Every step execution the store records as committed: a Plan's step rows (a band's
    branch rows included: a resume reuses them), a graph's completed positions, an agent
    run's recorded outcomes, a replan run's planner answers (``round`` rows, as
    ``plan:<n>``) and task outcomes (``task`` rows ``<n>.<i>``, as ``task:<n>.<i>``)."""
    out: set[Step] = set()
    backend = store.backend
    for head in backend.run_list(None):
        if head.kind == "plan":
            for row in backend.run_journal(head.key):
                if row.kind == "step":
                    out.add((head.key, f"{row.name}@{json.loads(row.data)['iteration']}"))
        elif head.kind == "agent":
            run = _canonical(_agent_run_id(head.key))
            for row in read_entries(backend.run_journal(head.key)):
                if row.kind != "outcome":
                    continue
                data = row.data
                if data["kind"] == "model":
                    out.add((run, f"model:{data['turn']}"))
                else:
                    out.add((run, f"tool:{data['turn']}:{data['index']}"))
        elif head.kind == "replan":  # guarantee 190, 191
            for row in backend.run_journal(head.key):
                if row.kind == "round":
                    out.add((head.key, f"plan:{row.name}"))
                elif row.kind == "task":
                    out.add((head.key, f"task:{row.name}"))
    for record in StoreCheckpointer(store).list():
        for pos in record.completed_positions:
            out.add((record.correlation_id, f"{pos.node_name}@{pos.step}"))
    return out


def in_doubt(store: Store) -> set[Step]:
    """Agent tool calls whose intent is committed without an outcome."""
    out: set[Step] = set()
    backend = store.backend
    for head in backend.run_list(None):
        if head.kind != "agent":
            continue
        intents: set[str] = set()
        outcomes: set[str] = set()
        for row in read_entries(backend.run_journal(head.key)):
            if row.kind in ("intent", "outcome") and str(row.name).startswith("tool:"):
                (intents if row.kind == "intent" else outcomes).add(str(row.name))
        run = _canonical(_agent_run_id(head.key))
        out |= {(run, name) for name in intents - outcomes}
    return out


def open_store(where: str, *, read_only: bool = False) -> Store:
    if "://" in where:
        return Store(url=where, read_only=read_only)
    return Store(db=where, read_only=read_only)


@dataclasses.dataclass
class Kill:
    """What the store held right after one SIGKILL (the other processes stopped)."""

    pid: int
    log_len: int
    committed: set[Step]
    in_flight: set[Step]  # effects the killed process made whose commit never landed
    in_doubt: set[Step]
    #: Stopped, not killed: the steps it runs when it goes on count as in flight too.
    frozen: bool = False


@dataclasses.dataclass
class Trial:
    """One iteration: a pipeline driven to its end through kills, and the checks."""

    name: str
    where: str
    log: Path
    rng: random.Random
    kills: list[Kill] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: Its processes are fresh interpreters (else forked from the tests' warm server).
    fresh: bool = False

    def fail(self, what: str) -> TortureFailure:
        lines = "\n".join(" ".join(map(str, line)) for line in log_lines(self.log))
        return TortureFailure(
            f"[{self.name}] {what}\nattempts: {'; '.join(self.notes)}\nlog:\n{lines}"
        )

    # -- after each kill ------------------------------------------------------------------
    def killed(self, pid: int, *, frozen: bool = False) -> None:
        """Check the store right after ``pid`` was SIGKILLed (and reaped), or ``frozen``
        (stopped until its leases run out: what it does when it goes on is in flight)."""
        lines = log_lines(self.log)
        with contextlib.closing(open_store(self.where, read_only=True)) as store:
            report = check_store(store)
            if not report.ok:
                raise self.fail(f"check_store after killing {pid}: {report.problems}")
            now = committed(store)
            doubt = in_doubt(store)
        previous = self.kills[-1].committed if self.kills else set()
        if not previous <= now:  # guarantee 39, 40, 109
            raise self.fail(f"committed steps lost at the kill of {pid}: {previous - now}")
        flight = {(r, s) for r, s, p in lines if p == pid and (r, s) not in now}
        self.kills.append(Kill(pid, len(lines), now, flight, doubt, frozen))

    # -- at the end -----------------------------------------------------------------------
    def report(self) -> None:
        """One line on what the iteration did (shown with ``pytest -s``)."""
        flight = sum(len(k.in_flight) for k in self.kills)
        print(f"[{self.name}] {len(self.kills)} kills, {flight} in flight: {'; '.join(self.notes)}")

    def check_effects(self, expected: set[Step], *, ended_in_doubt: set[Step]) -> None:
        """Every expected effect happened, no committed step ran again after a kill, and
        each ran at most once plus once per kill that caught it in flight."""
        lines = log_lines(self.log)
        seen = Counter((r, s) for r, s, _ in lines)
        missing = expected - set(seen) - ended_in_doubt
        if missing:
            raise self.fail(f"side effects never happened: {sorted(missing)}")
        extra = set(seen) - expected
        if extra:
            raise self.fail(f"side effects an uninterrupted run never makes: {sorted(extra)}")
        for kill in self.kills:
            again = {(r, s) for r, s, _ in lines[kill.log_len :]} & kill.committed
            if again:  # guarantee 39, 43, 106, 160, 161, 191, 239
                raise self.fail(f"steps committed at the kill of {kill.pid} ran again: {again}")
        allowed = Counter(step for kill in self.kills for step in kill.in_flight)
        for kill in self.kills:  # a frozen process finishes the steps it was in
            if kill.frozen:
                allowed.update({(r, s) for r, s, p in lines[kill.log_len :] if p == kill.pid})
        for step, n in seen.items():
            if n > 1 + allowed[step]:  # guarantee 43, 160, 172
                raise self.fail(
                    f"{step} ran {n} times, {allowed[step]} kill(s) caught it in flight"
                )

    def check_settled(self) -> None:
        """The store checks clean and no run is left owned: a run still ``claimed`` or
        ``running`` (a graph invocation a resume superseded keeps that status, guarantee
        112) must have a dead owner that any process may take over at once (guarantee
        121, 122), and every Plan, agent and replan run ended."""
        with contextlib.closing(open_store(self.where, read_only=True)) as store:
            report = check_store(store)
            if not report.ok:
                raise self.fail(f"check_store at the end: {report.problems}")
            now = database_now(store)
            heads = store.backend.run_list(None)
        owned = [(h.key, h.status) for h in heads if owner_alive(h, now=now)]
        if owned:
            raise self.fail(f"runs left owned after the pipeline finished: {owned}")
        unfinished = [
            (h.key, h.status)
            for h in heads
            if h.kind in ("plan", "agent", "replan") and h.status not in ("done", "failed")
        ]
        if unfinished:
            raise self.fail(f"runs left unfinished: {unfinished}")


# -- one attempt of a scripted pipeline --------------------------------------------------------
@dataclasses.dataclass
class Attempt:
    """What the processes of one attempt printed (those not killed)."""

    killed: bool
    results: list[dict[str, Any]]


def _env() -> dict[str, str]:
    # this tree's sources first, so a copy of the tree tortures its own code
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}


def _wait_lines(log: Path, target: int, alive: Callable[[], bool], deadline: float) -> bool:
    """Wait until ``log`` has ``target`` effects; False when ``alive()`` stopped first."""
    while len(log_lines(log)) < target:
        if not alive():
            return False
        if time.monotonic() > deadline:
            raise TortureFailure(f"no progress to {target} effects in {DEADLINE} s: stuck")
        time.sleep(0.001)
    return True


def _first_line(proc: _spawn.Process) -> str:
    """The first line ``proc`` prints, read a byte at a time from its pipe: a buffered
    ``readline`` would read ahead what ``communicate`` (which reads the pipe itself) must
    get later."""
    assert proc.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(proc.stdout.fileno(), 1)
        if not byte:
            break
        line += byte
    return line.decode().strip()


def stop(proc: _spawn.Process) -> None:
    """SIGSTOP ``proc`` and wait until it is stopped (a signal is delivered when the
    process next enters the kernel: until then it may still write and commit)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, IndexError):
            return  # gone
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.0005)
    raise TortureFailure(f"process {proc.pid} did not stop")


#: Seconds an uninterrupted attempt of each scenario ran after it was ready (the latest
#: seen), so a random delay lands anywhere in an attempt: in its claim, its replay of the
#: journal, its steps and their commits.
PACE: dict[str, float] = {}


def run_attempt(
    trial: Trial, argv: list[str], *, kill: bool, left: int, racers: int = 1
) -> Attempt:
    """Start ``racers`` processes of ``torture_worker.py`` with ``argv`` at once; unless it
    ends first, SIGKILL one of them at a moment the trial's RNG picks (when ``kill``): a
    random delay after it is ready, or a random number of side effects (at most ``left``,
    those a finished run still lacks) and then at most 3 ms, so the kill lands in the
    commit that follows a step. The other racer is stopped while the store is read."""
    rng = trial.rng
    scenario = argv[0]
    how = rng.choice(["delay", "effects"]) if kill else "none"
    delay = rng.uniform(0.0, 1.2 * PACE.get(scenario, 0.05))
    effects, extra = rng.randint(1, max(1, left)), rng.uniform(0.0, 0.003)
    procs = [
        _spawn.Popen(
            [sys.executable, str(WORKER), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            fresh=trial.fresh,
        )
        for _ in range(racers)
    ]
    victim = rng.choice(procs)
    try:
        readies = [_first_line(p) for p in procs]
        start = time.monotonic()
        deadline = start + DEADLINE
        if how == "delay":
            with contextlib.suppress(subprocess.TimeoutExpired):
                victim.wait(timeout=delay)
        elif how == "effects":
            target = len(log_lines(trial.log)) + effects
            if _wait_lines(trial.log, target, lambda: victim.poll() is None, deadline):
                time.sleep(extra)
        killed = how != "none" and victim.poll() is None
        if killed:
            others = [p for p in procs if p is not victim and p.poll() is None]
            for p in others:
                stop(p)
            try:
                victim.send_signal(signal.SIGKILL)
                victim.communicate()
                what = f"{delay:.3f} s" if how == "delay" else f"{effects} effects + {extra:.4f} s"
                trial.notes.append(f"{victim.pid} killed after {what}")
                trial.killed(victim.pid)
            finally:
                for p in others:
                    p.send_signal(signal.SIGCONT)
        results = []
        for proc, ready in zip(procs, readies, strict=True):
            if killed and proc is victim:
                continue
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise trial.fail(f"attempt {proc.pid} did not finish in {DEADLINE} s") from None
            if proc.returncode != 0 or ready != "ready":
                raise trial.fail(f"attempt {proc.pid} exited {proc.returncode}: {ready}{out}{err}")
            trial.notes.append(f"{proc.pid} ended")
            results.append(json.loads(out.strip().splitlines()[-1]))
        if how == "none" and racers == 1:
            PACE[scenario] = time.monotonic() - start
        return Attempt(killed, results)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


# -- uninterrupted references, computed in this process on a store in memory --------------------
def reference(scenario: str, opts: dict[str, Any]) -> tuple[dict[str, Any], set[Step]]:
    """The result of an uninterrupted run, and the side effects it makes."""
    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "ref.log")
        with Store() as store:
            if scenario == "plan":
                result = asyncio.run(tw.run_plans(store, log, {**opts, "gather": True}))
            elif scenario == "graph":
                result = asyncio.run(tw.run_graph(store, log, opts))
            elif scenario == "replan":
                result = asyncio.run(tw.run_replan(store, log, opts))
            else:
                result = asyncio.run(_approve_all(store, log, opts))
        return result, {(r, s) for r, s, _ in log_lines(Path(log))}


async def _approve_all(store: Store, log: str, opts: dict[str, Any]) -> dict[str, Any]:
    approvals: dict[str, bool] | None = None
    for _ in range(10):
        result = await tw.run_agent(store, log, {**opts, "approvals": approvals})
        mine = result[opts["run"]]
        if mine["state"] != "paused":
            return result
        approvals = {p["call_id"]: True for p in mine["pending"]}
    raise AssertionError("the reference agent run never stopped pausing")


# -- scenarios ---------------------------------------------------------------------------------
def torture_script(
    scenario: str,
    where: str,
    log: Path,
    seed: int,
    opts: dict[str, Any],
    max_kills: int,
    *,
    fresh: bool = False,
) -> Trial:
    """Drive one scripted pipeline to its end through up to ``max_kills`` kills; now and
    then two processes resume it at once (not for a graph: each resume of a graph's
    record is a new invocation, so two in a row would both run its nodes)."""
    rng = random.Random(f"{scenario}:{seed}")
    trial = Trial(f"{scenario} seed={seed} opts={opts}", where, log, rng, fresh=fresh)
    expected_result, expected = reference(scenario, opts)
    kills = rng.randint(1, max_kills)
    approvals: dict[str, bool] | None = None
    ended_in_doubt: set[Step] = set()
    finished: dict[str, Any] = {}
    for _ in range(max_kills + 16):
        racers = 2 if scenario != "graph" and rng.random() < 0.3 else 1
        attempt = run_attempt(
            trial,
            [scenario, where, str(log), json.dumps({**opts, "approvals": approvals})],
            kill=len(trial.kills) < kills,
            left=len(expected - (trial.kills[-1].committed if trial.kills else set())),
            racers=racers,
        )
        owned = [  # per run, what the processes that owned it gave
            (run, mine)
            for result in attempt.results
            for run, mine in result.items()
            if "concurrent" not in mine
        ]
        if scenario != "agent":
            for run, mine in owned:
                if not _same_result({run: mine}, {run: expected_result[run]}):
                    raise trial.fail(f"{run}: {mine} != uninterrupted {expected_result[run]}")
                finished[run] = mine
            if finished.keys() == expected_result.keys():
                break
            continue
        if not owned:
            continue  # the same resume again: a decision already applied is a retry (182)
        mine = owned[0][1]
        if any(other != mine for _, other in owned):
            raise trial.fail(f"racers that each owned the run disagree: {attempt.results}")
        if mine["state"] == "paused":
            approvals = _approvals(trial, mine["pending"])
            continue
        if mine["state"] == "failed":
            ended_in_doubt = _in_doubt_failure(trial, mine)
            break
        if {opts["run"]: mine} != expected_result:
            raise trial.fail(f"result {mine} != uninterrupted {expected_result}")
        break
    else:
        raise trial.fail("the pipeline never finished")
    trial.check_effects(expected, ended_in_doubt=ended_in_doubt)
    trial.check_settled()
    trial.report()
    return trial


def _same_result(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether a result is the uninterrupted one (a Plan that a killed attempt finished
    gives its ``kv`` to the next, guarantee 23: its ``kv`` is compared)."""
    if got.keys() != expected.keys():
        return False
    for run, mine in got.items():
        if mine.get("payload") == "cached":
            mine = {**mine, "payload": expected[run].get("payload")}
        if mine != expected[run]:
            return False
    return True


def _approvals(trial: Trial, pending: list[dict[str, Any]]) -> dict[str, bool]:
    """Approve every pending call; a call asked about as in doubt must have been left in
    doubt by a kill (guarantee 173, 381)."""
    for p in pending:
        if p["reason"] == "in_doubt":
            step = ("agent-run", f"tool:{p['turn']}:{p['index']}")
            if not any(step in k.in_doubt for k in trial.kills):
                raise trial.fail(f"{p} asked about in doubt, but no kill left it in doubt")
        elif p["reason"] != "requires_approval" or p["tool"] != "gated":
            raise trial.fail(f"an unexpected pause: {p}")
    return {p["call_id"]: True for p in pending}


def _in_doubt_failure(trial: Trial, result: dict[str, Any]) -> set[Step]:
    """A run may fail only on its ``in_doubt="fail"`` tool left in doubt by a kill
    (guarantee 171); the calls it never made are then not expected."""
    error = result["error"] or {}
    once = ("agent-run", "tool:2:1")
    if error.get("type") != "EffectInDoubtError" or not trial.kills:
        raise trial.fail(f"the run failed: {result}")
    if once not in trial.kills[-1].in_doubt:
        raise trial.fail(f"in-doubt failure, but the kill left {once} with an outcome: {result}")
    # the calls of turn 2 ran (or not) beside it; nothing after turn 2 was asked for
    later = {("agent-run", f"tool:{t}:{i}") for t in (2, 3) for i in range(4)}
    return later | {("agent-run", "model:3"), ("agent-run", "model:4")}


def plan_options(rng: random.Random) -> dict[str, Any]:
    gather = rng.random() < 0.5
    runs = [f"p{i}" for i in range(rng.randint(1, 3) if gather else 1)]
    return {"runs": runs, "llm": rng.random() < 0.6, "gather": gather}


def agent_options(rng: random.Random) -> dict[str, Any]:
    return {"run": "agent-run", "async_writes": rng.random() < 0.5}


def sqlite_options(rng: random.Random) -> dict[str, Any]:
    """The SQLite backend's knobs: often a WAL of a few pages, so that SQLite checkpoints
    and restarts its WAL many times a run and kills land there too."""
    return {
        "checkpoint_pages": rng.choice([1000, 16, 4, 1]),
        "durability": rng.choice(["full", "full", "normal"]),
        "preallocate_wal": rng.random() < 0.8,
    }


OPTIONS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "plan": plan_options,
    "graph": lambda rng: {"run": "walk"},
    "agent": agent_options,
    "replan": lambda rng: {"run": "replan-run", "llm_planner": rng.random() < 0.5},
}


def each_seed(body: Callable[[int], object]) -> None:
    """Run ``body(seed)`` for every seed of this run (see the module's docstring). A
    failing iteration does not stop the others: every failure is printed in full, and
    the test fails at the end naming each failed seed."""
    failed: list[str] = []
    for seed in range(SEED, SEED + ITERATIONS):
        try:
            body(seed)
        except TortureFailure as exc:
            print(f"FAILED seed={seed}: {exc}")
            failed.append(f"seed={seed}: {str(exc).splitlines()[0]}")
    if failed:
        raise TortureFailure(
            f"{len(failed)} of {ITERATIONS} iterations failed:\n" + "\n".join(failed)
        )


@pytest.mark.crash
@pytest.mark.parametrize("scenario", ["plan", "graph", "agent", "replan"])
def test_torture_sqlite(tmp_path: Path, scenario: str) -> None:
    # guarantee 39, 40, 43, 106, 109, 157, 160, 161, 171, 172, 173, 182, 190, 191, 197, 198

    def one(seed: int) -> None:
        where = tmp_path / f"{scenario}-{seed}.sqlite"
        rng = random.Random(f"options:{scenario}:{seed}")
        opts = {**OPTIONS[scenario](rng), "sqlite": sqlite_options(rng)}
        log = tmp_path / f"{scenario}-{seed}.log"
        # the Plan's processes are fresh interpreters, the others forked ones
        torture_script(scenario, str(where), log, seed, opts, 4, fresh=scenario == "plan")

    each_seed(one)


@pytest.mark.crash
@pytest.mark.postgres
@pytest.mark.parametrize("scenario", ["plan", "graph", "agent", "replan"])
def test_torture_postgres(tmp_path: Path, pg_server: Any, scenario: str) -> None:
    # guarantee 39, 43, 106, 160, 161, 171, 172, 173, 190, 191, 197, 198

    def one(seed: int) -> None:
        name = f"torture_{scenario}_{seed}"
        url = pg_server.create_database(name)
        try:
            # the schema first: the driver reads the store read-only after the first kill,
            # when a stopped racer may be the one creating it
            with Store(url=url) as store:
                store.setup()
            opts = OPTIONS[scenario](random.Random(f"options:{scenario}:{seed}"))
            torture_script(scenario, url, tmp_path / f"{scenario}-{seed}.log", seed, opts, 3)
        finally:
            pg_server.drop_database(name)

    each_seed(one)


# -- queued runs served by `stepstone worker` processes -----------------------------------------
def _spawn_worker(
    where: str, queue: str, lease: float, out: Path, *, fresh: bool
) -> _spawn.Process:
    store = ["--url", where] if "://" in where else ["--db", where]
    argv = ["worker", *store, "--queue", queue, "--concurrency", "2", "--poll-interval", "0.05"]
    argv += ["--lease-seconds", str(lease), "--until-idle"]
    with out.open("a") as fh:  # a file, not a pipe nobody reads until the worker ends
        fh.write(f"-- worker started at {time.monotonic():.3f}\n")
        fh.flush()
        return _spawn.Popen(
            [sys.executable, "-m", "stepstone.cli", *argv],
            cwd=ROOT,
            env=_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            fresh=fresh,
        )


def queue_reference(runs: dict[str, str]) -> tuple[dict[str, Any], set[Step]]:
    """Each queued run's result, uninterrupted, and the side effects it makes."""
    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "ref.log")
        out: dict[str, Any] = {}
        with Store() as store:
            for run, kind in runs.items():
                out[run] = asyncio.run(_queued_once(store, log, run, kind))
        return out, {(r, s) for r, s, _ in log_lines(Path(log))}


async def _queued_once(store: Store, log: str, run: str, kind: str) -> Any:
    if kind == "plan":
        env = await Agent(engine=tw.queued_plan).run(tw.queued_task(log, run))
        return env.payload["acc"]
    if kind == "graph":
        final = await tw.queued_graph.ainvoke(tw.Walk(run=run, log=log))
        return tw.graph_result(final)
    result = await Runner(store=store, config=RunnerConfig()).run(
        tw.queued_agent(), user_message=tw.queued_task(log, run), run_id=run, thread_id=run
    )
    return result.final_text


def _queued_result(kind: str, payload: Any) -> Any:
    if kind == "plan":
        return payload["acc"]
    if kind == "graph":
        return {k: payload[k] for k in ("n", "acc", "trace")}
    return payload["final_text"]


def torture_queue(where: str, log: Path, seed: int, max_kills: int) -> Trial:
    """Queue a few runs of every kind and serve them with ``stepstone worker`` processes,
    SIGKILLing workers at random moments and starting new ones until every run ended."""
    rng = random.Random(f"queue:{seed}")
    kinds = ["plan", "plan", "graph", "agent"]
    runs = {f"q{seed}-{i}-{kind}": kind for i, kind in enumerate(kinds)}
    lease = rng.choice([2.0, 30.0])
    width = rng.randint(1, 2)
    fresh = "://" not in where  # on SQLite fresh interpreters, on PostgreSQL forked ones
    trial = Trial(f"queue seed={seed} lease={lease} workers={width}", where, log, rng, fresh=fresh)
    expected_results, expected = queue_reference(runs)
    queue = f"torture{seed}"
    with contextlib.closing(open_store(where)) as store:
        handles = {}
        for run, kind in runs.items():
            target = TARGETS + {"plan": "queued_plan", "graph": "queued_graph"}.get(
                kind, "queued_agent"
            )
            task: Any = tw.queued_task(str(log), run)
            if kind == "graph":
                task = tw.Walk(run=run, log=str(log))
            handles[run] = submit(store, target, task, key=run, queue=queue, max_attempts=50)
        workers: list[_spawn.Process] = []
        kills = rng.randint(1, max_kills)
        deadline = time.monotonic() + DEADLINE
        try:
            while True:
                workers = [w for w in workers if _alive_or_checked(trial, w)]
                if all(h.status() in ("done", "failed", "cancelled") for h in handles.values()):
                    break
                if time.monotonic() > deadline:
                    raise trial.fail(f"queued runs stuck: {[h.entry() for h in handles.values()]}")
                while len(workers) < width:
                    out = log.with_suffix(".out")
                    workers.append(_spawn_worker(where, queue, lease, out, fresh=trial.fresh))
                    trial.notes.append(f"worker {workers[-1].pid} started")
                if len(trial.kills) < kills:
                    _kill_a_worker(trial, workers, deadline, 2.5 * lease if lease < 5 else None)
                else:
                    time.sleep(0.02)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
                w.communicate(timeout=60)
        for run, kind in runs.items():
            env = handles[run].result(timeout=5)
            if not env.ok:
                raise trial.fail(f"queued run {run} failed: {env.error}")
            got = _queued_result(kind, env.payload)
            if got != expected_results[run]:
                raise trial.fail(f"{run}: {got} != uninterrupted {expected_results[run]}")
    trial.check_effects(expected, ended_in_doubt=set())
    trial.check_settled()
    trial.report()
    return trial


def _alive_or_checked(trial: Trial, worker: _spawn.Process) -> bool:
    """Whether ``worker`` still runs; one that ended must have ended cleanly."""
    if worker.poll() is None:
        return True
    worker.communicate()
    if worker.returncode not in (0, -signal.SIGKILL):
        out = trial.log.with_suffix(".out").read_text()
        raise trial.fail(f"worker {worker.pid} exited {worker.returncode}: {out}")
    return False


def _kill_a_worker(
    trial: Trial, workers: list[_spawn.Process], deadline: float, freeze: float | None
) -> None:
    """Wait a random while (a delay, or a few side effects and at most 3 ms), then SIGKILL
    a random live worker, stop the others while the store is read, and let them go on.
    With ``freeze`` (seconds), the worker is sometimes stopped that long instead (SIGSTOP,
    as a host that froze): its leases run out, other workers take its runs over, then it
    goes on where it was."""
    rng = trial.rng
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 0.6))
    else:
        target = len(log_lines(trial.log)) + rng.randint(1, 10)
        alive = lambda: any(w.poll() is None for w in workers)  # noqa: E731
        if _wait_lines(trial.log, target, alive, deadline):
            time.sleep(rng.uniform(0.0, 0.003))
    live = [w for w in workers if w.poll() is None]
    if not live:
        return
    victim = rng.choice(live)
    others = [w for w in live if w is not victim]
    for w in others:
        stop(w)
    try:
        if freeze is not None and rng.random() < 0.4:
            stop(victim)
            trial.notes.append(f"worker {victim.pid} frozen for {freeze:g} s")
            trial.killed(victim.pid, frozen=True)
        else:
            freeze = None
            victim.send_signal(signal.SIGKILL)
            victim.communicate(timeout=60)
            trial.notes.append(f"worker {victim.pid} killed")
            trial.killed(victim.pid)
    finally:
        for w in others:
            w.send_signal(signal.SIGCONT)
    if freeze is not None:  # its leases run out; the others take its runs over meanwhile
        time.sleep(freeze)
        victim.send_signal(signal.SIGCONT)


@pytest.mark.crash
def test_torture_queue_sqlite(tmp_path: Path) -> None:
    # guarantee 238, 239, 249
    each_seed(
        lambda seed: torture_queue(
            str(tmp_path / f"queue-{seed}.sqlite"), tmp_path / f"q{seed}.log", seed, 3
        )
    )


@pytest.mark.crash
@pytest.mark.postgres
def test_torture_queue_postgres(tmp_path: Path, pg_server: Any) -> None:
    # guarantee 238, 239, 249

    def one(seed: int) -> None:
        name = f"torture_queue_{seed}"
        url = pg_server.create_database(name)
        try:
            torture_queue(url, tmp_path / f"q{seed}.log", seed, 3)
        finally:
            pg_server.drop_database(name)

    each_seed(one)
