"""Per-turn cost of a durable agent run (``Runner`` on SQLite) against the same agent with no
store, as a ratio to a raw SQLite commit measured in the same process.

The agent: a zero-latency scripted model that calls one tool per turn, the tool returning
200 bytes, then answers. For each run length (``--turns``, default 10, 100 and 500):

* ``plain``: ``Agent.run`` (no store);
* the durable run (``Runner.run`` on a new SQLite file) in the default write-behind mode
  and in sync mode (``checkpoint_async_writes=False``), with ``durability="full"`` (fsync
  on every commit) and ``"normal"`` (no fsync: what the engine itself costs);
* overhead per turn = (durable - plain) / turns, in microseconds and in raw commits (a
  ~1 KB row committed alone, WAL + ``synchronous=FULL``, measured before and after), and
  the same in CPU time (what the process spent, which a busy disk moves least);
* commits per turn (the head's version counts every commit), journal bytes per turn (the
  rows' data) and file bytes per turn (the database once closed), and the file's size;
* resume: a run killed with SIGKILL inside the tool call of turn ``turns // 2`` (the tool
  kills its own process), then resumed in this process: the time from ``runner.resume``
  to the model's first request (reading the journal, replaying what it holds and running
  the killed call again), median of the rounds.

``--breakdown`` measures instead where a turn's CPU time goes, in one process: the loop with
no store, the durable run on the in-memory store (the journal's own work), on SQLite with
``durability="normal"`` (the commits' SQL added) and ``"full"`` (their fsyncs added), and
beside them a raw ~1 KB commit and the store's own commit of a 600-byte journal row
(``backend.run_commit``, what a turn's commit costs below the engine), in CPU time.

``--baseline-src OLD/src`` measures the same in processes importing stepstone from an
older checkout's ``src/``, interleaved round by round with this code's (both sides under
the same load), and prints both with the ratio. Each round runs every measurement in a
new process per side; the table gives the median of the rounds and their spread.

    python bench/agent_overhead.py [--rounds 3] [--turns 10 100 500] [--baseline-src OLD/src]
    python bench/agent_overhead.py --breakdown [--rounds 3] [--turns 500]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULT = "r" * 200
MODES = (  # (name, async_writes, durability)
    ("write-behind", True, "full"),
    ("sync", False, "full"),
    ("write-behind", True, "normal"),
    ("sync", False, "normal"),
)


def raw_commit_us(path: Path, n: int = 300, *, sync: str = "FULL", cpu: bool = False) -> float:
    """Microseconds per single-row (~1 KB) committed transaction, WAL + ``sync`` (of CPU
    time with ``cpu``, else of wall time)."""
    clock = time.process_time if cpu else time.perf_counter
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    payload = "x" * 1000
    t0 = clock()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", payload))
        conn.execute("COMMIT")
    elapsed = clock() - t0
    conn.close()
    return elapsed * 1e6 / n


def _agent(turns: int, *, die_at: int | None = None, asked: list[int] | None = None) -> Any:
    from stepstone import Agent, tool
    from stepstone.providers import ModelRequest, Usage
    from stepstone.testing import FunctionModel, Reply, call

    usage = Usage(input_tokens=100, output_tokens=20)  # not estimated over the conversation

    @tool
    async def lookup(n: int) -> str:
        """Look a number up."""
        if n == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return RESULT

    def script(request: ModelRequest) -> Any:
        if asked is not None:
            asked.append(request.turn)
        if request.turn < turns - 1:
            return Reply(tool_calls=[call("lookup", n=request.turn)], usage=usage)
        return Reply(text="done", usage=usage)

    return Agent(name="bench", model=FunctionModel(script), tools=[lookup], max_turns=turns + 1)


async def _plain_us(turns: int) -> tuple[float, float]:
    """Wall and CPU microseconds of the loop with no store."""
    start, cpu = time.perf_counter(), time.process_time()
    env = await _agent(turns).run("go")
    assert env.ok, env.error
    return (time.perf_counter() - start) * 1e6, (time.process_time() - cpu) * 1e6


def _config(async_writes: bool) -> Any:
    from stepstone import RunnerConfig

    return RunnerConfig(checkpoint_async_writes=async_writes)


async def _durable(path: Path, turns: int, async_writes: bool, durability: str) -> dict[str, Any]:
    from stepstone import Runner, Store, checkpoint_latest_key

    with Store(db=path, durability=durability) as store:  # type: ignore[arg-type]
        runner = Runner(store=store, config=_config(async_writes))
        start, cpu = time.perf_counter(), time.process_time()
        result = await runner.run(_agent(turns), user_message="go", run_id="b")
        us = (time.perf_counter() - start) * 1e6
        cpu_us = (time.process_time() - cpu) * 1e6
        assert result.state == "completed", result.error
        key = checkpoint_latest_key("b")
        head = store.backend.run_get(key)
        assert head is not None
        journal = sum(len(r.data) for r in store.backend.run_journal(key))
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return {"us": us, "cpu": cpu_us, "commits": head.version, "journal": journal, "file": size}


KILLED = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from agent_overhead import _agent, _config
from stepstone import Runner, Store
turns = int(sys.argv[3])
with Store(db=sys.argv[2]) as store:
    runner = Runner(store=store, config=_config(True))
    asyncio.run(runner.run(_agent(turns, die_at=turns // 2), user_message="go", run_id="k"))
"""


async def _resume_ms(tmp: Path, turns: int) -> float:
    """Milliseconds from ``runner.resume`` of a run killed in the tool call of turn
    ``turns // 2`` to the model's first request (of the next turn: the journal read and
    replayed, the killed call run again)."""
    from stepstone import Runner, Store

    db = tmp / f"killed-{turns}.sqlite"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(Path(__file__).parent), str(db), str(turns)],
        env=os.environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    stamps: list[float] = []

    def note(turn: int) -> None:
        if turn > turns // 2 and not stamps:
            stamps.append(time.perf_counter())

    class Asked(list[int]):
        def append(self, turn: int) -> None:
            note(turn)
            super().append(turn)

    asked = Asked()
    with Store(db=db) as store:
        runner = Runner(store=store, config=_config(True))
        thread = runner.runs()[0]["thread_id"]
        start = time.perf_counter()
        result = await runner.resume(_agent(turns, asked=asked), run_id="k", thread_id=thread)
    assert result.state == "completed", result.error
    # the killed turn's answer was committed: its tool runs again (in doubt), the model
    # is asked from the next turn on
    assert asked[0] == turns // 2 + 1, asked[:3]
    return (stamps[0] - start) * 1000


async def measure(turns: list[int]) -> dict[str, Any]:
    """Every measurement of one round, in this process."""
    out: dict[str, Any] = {"raw": [], "plain": {}, "plain_cpu": {}, "runs": {}, "resume": {}}
    with tempfile.TemporaryDirectory(prefix="stepstone-agent-bench-") as name:
        tmp = Path(name)
        out["raw"].append(raw_commit_us(tmp / "raw0.sqlite"))
        for t in turns:
            plain = [await _plain_us(t) for _ in range(3)]
            out["plain"][t] = statistics.median(p[0] for p in plain)
            out["plain_cpu"][t] = statistics.median(p[1] for p in plain)
            for mode, async_writes, durability in MODES:
                path = tmp / f"d-{t}-{mode}-{durability}" / "runs.sqlite"
                path.parent.mkdir()
                got = await _durable(path, t, async_writes, durability)
                out["runs"][f"{t} {mode} {durability}"] = got
        out["raw"].append(raw_commit_us(tmp / "raw1.sqlite"))
        out["resume"][max(turns)] = await _resume_ms(tmp, max(turns))
    return out


async def _cpu_per_turn(store: Any, turns: int, run_id: str) -> float:
    """CPU microseconds per turn of a sync-write durable run on ``store`` (None: no store)."""
    from stepstone import Runner

    start = time.process_time()
    if store is None:
        env = await _agent(turns).run("go")
        assert env.ok, env.error
    else:
        runner = Runner(store=store, config=_config(False))
        result = await runner.run(_agent(turns), user_message="go", run_id=run_id)
        assert result.state == "completed", result.error
    return (time.process_time() - start) * 1e6 / turns


async def _store_commit_cpu_us(path: Path, n: int = 1000) -> float:
    """CPU microseconds of the store's own commit (``backend.run_commit``: the head's
    compare-and-swap and one 600-byte journal row) on SQLite, ``durability="normal"``, in
    the file of a short agent run, commit after commit on that run's head."""
    import dataclasses

    from stepstone import Runner, Store, checkpoint_latest_key
    from stepstone.store import JournalRow

    with Store(db=path, durability="normal") as store:
        await Runner(store=store, config=_config(False)).run(
            _agent(3), user_message="go", run_id="c"
        )
        backend = store.backend
        head = backend.run_get(checkpoint_latest_key("c"))
        assert head is not None
        heads = [head]
        for _ in range(n):
            head = dataclasses.replace(
                head, version=head.version + 1, journal_len=head.journal_len + 1
            )
            heads.append(head)
        data = "x" * 600
        start = time.process_time()
        for before, after in itertools.pairwise(heads):
            row = JournalRow(seq=before.journal_len, kind="entries", name=None, data=data)
            assert backend.run_commit(after, before.version, [row], [])
        return (time.process_time() - start) * 1e6 / n


async def breakdown(turns: int) -> dict[str, float]:
    """CPU microseconds per turn of one ``turns``-turn run per layer, and per commit of
    the raw commit and the store's commit (one round, in this process)."""
    from stepstone import Store

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stepstone-agent-bench-") as name:
        tmp = Path(name)
        await _cpu_per_turn(None, 3, "warm")  # imports, the price table
        out["plain"] = await _cpu_per_turn(None, turns, "plain")
        with Store() as store:
            out["memory"] = await _cpu_per_turn(store, turns, "m")
        for durability in ("normal", "full"):
            with Store(db=tmp / f"{durability}.sqlite", durability=durability) as store:
                out[durability] = await _cpu_per_turn(store, turns, durability[0])
        out["raw normal"] = raw_commit_us(tmp / "rawn.sqlite", sync="NORMAL", cpu=True)
        out["raw full"] = raw_commit_us(tmp / "rawf.sqlite", sync="FULL", cpu=True)
        out["raw full wall"] = raw_commit_us(tmp / "rawfw.sqlite")
        out["store commit"] = await _store_commit_cpu_us(tmp / "commit.sqlite")
    return out


def report_breakdown(rounds: list[dict[str, float]], turns: int) -> None:
    """Print where a turn's CPU time goes (medians of the rounds, their spread)."""

    def col(name: str, minus: str | None = None, per: float = 1.0) -> str:
        values = [(r[name] - (r[minus] if minus else 0.0)) / per for r in rounds]
        return _spread(values, ".0f")

    print(f"\nCPU time per turn of a {turns}-turn run (sync writes), us:")
    print(f"  the loop, no store:                         {col('plain')}")
    print(f"  + the journal, in-memory store:             +{col('memory', 'plain')}")
    print(f"  + SQLite's commits (durability=normal):     +{col('normal', 'memory')}")
    print(f"  + their fsyncs (durability=full):           +{col('full', 'normal')}")
    over = f"{col('normal', 'plain')} / {col('full', 'plain')}"
    print(f"  overhead per turn, normal / full:           {over}")
    print("per commit (a turn makes 2), us:")
    print(f"  the store's commit of a 600-byte row, CPU:  {col('store commit')}")
    print(f"  a raw 1 KB commit, CPU, normal / full:      {col('raw normal')} / {col('raw full')}")
    print(f"  a raw 1 KB commit, wall, full:              {col('raw full wall')}")


def _child(src: str | None, turns: list[int], what: str = "measure") -> dict[str, Any]:
    """One round measured in a new process (importing stepstone from ``src`` if given):
    ``measure`` of ``turns``, or ``breakdown`` of the last of them."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    call = (
        "measure([int(t) for t in sys.argv[2:]])"
        if what == "measure"
        else ("breakdown(int(sys.argv[-1]))")
    )
    code = (
        "import asyncio, json, sys; sys.path.insert(0, sys.argv[1]); "
        f"from agent_overhead import {what}; "
        f"print(json.dumps(asyncio.run({call})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), *map(str, turns)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"measuring {src or 'this code'} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def _spread(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) < 2:
        return format(mid, fmt)
    return f"{format(mid, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(rounds: list[dict[str, Any]], turns: list[int], label: str) -> dict[str, float]:
    """Print one side's table; returns its median overhead ratios, by row."""
    raw = [statistics.median(r["raw"]) for r in rounds]
    print(f"\n{label}: raw FULL commit {_spread(raw, '.0f')} us")
    print(
        f"{'turns':>5} {'mode':>12} {'sync':>6} {'overhead us/turn':>22} {'x raw':>16} "
        f"{'CPU us/turn':>18} {'commits/turn':>12} {'journal B/turn':>14} "
        f"{'file B/turn':>11} {'file KB':>8}"
    )
    ratios: dict[str, float] = {}
    for t in turns:
        for mode, _, durability in MODES:
            name = f"{t} {mode} {durability}"
            over = [
                (r["runs"][name]["us"] - r["plain"][str(t)]) / t
                for r in rounds  # JSON keys are text
            ]
            x = [o / w for o, w in zip(over, raw, strict=True)]
            cpu = [(r["runs"][name]["cpu"] - r["plain_cpu"][str(t)]) / t for r in rounds]
            first = rounds[0]["runs"][name]
            ratios[name] = statistics.median(x)
            ratios[f"{name} cpu"] = statistics.median(cpu)
            print(
                f"{t:>5} {mode:>12} {durability:>6} {_spread(over, '.0f'):>22} "
                f"{_spread(x, '.2f'):>16} {_spread(cpu, '.0f'):>18} "
                f"{first['commits'] / t:>12.2f} "
                f"{first['journal'] / t:>14.0f} {first['file'] / t:>11.0f} "
                f"{first['file'] / 1024:>8.0f}"
            )
    resume = [next(iter(r["resume"].values())) for r in rounds]
    print(
        f"resume of a {max(turns)}-turn run killed at turn {max(turns) // 2}: "
        f"{_spread(resume, '.1f')} ms to its first new request"
    )
    ratios["resume"] = statistics.median(resume)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="measure where a turn's CPU time goes instead (the last --turns)",
    )
    parser.add_argument(
        "--baseline-src",
        help="also measure stepstone imported from this folder (an older checkout's src/), "
        "round by round with this code, to compare in one run",
    )
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; load average before: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    if args.breakdown:
        rounds = [_child(None, args.turns, "breakdown") for _ in range(args.rounds)]
        report_breakdown(rounds, args.turns[-1])
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        return
    sides: list[str | None] = [None] if args.baseline_src is None else [args.baseline_src, None]
    got: dict[str | None, list[dict[str, Any]]] = {s: [] for s in sides}
    for _ in range(args.rounds):  # interleaved: drift in the machine's load hits both
        for side in sides:
            got[side].append(_child(side, args.turns))
    medians = {
        side: report(got[side], args.turns, "baseline" if side else "this code") for side in sides
    }
    if args.baseline_src is not None:
        base, this = medians[args.baseline_src], medians[None]
        print("\nthis code / baseline (median x raw commit, CPU per turn, resume time):")
        for name in this:
            print(f"  {name:>24}: {this[name] / base[name]:.2f}")
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
