"""Per-turn overhead of a durable agent run (Runner on SQLite) vs the same LLMEngine with no
store, as ratios to a raw SQLite commit measured in the same run.

Setup: a zero-latency scripted model that calls two tools per turn (both return at once),
for conversations of 10 and 200 turns. Measured:

* the plain loop (``Agent.run``: no store) and the durable run (``Runner.run`` on a new
  SQLite file, ``synchronous=FULL``), in sync mode (``checkpoint_async_writes=False``) and
  write-behind mode (the default), and sync mode with ``durability="normal"`` (no fsync:
  the CPU cost of journaling);
* overhead per turn = (durable - plain) / turns, in ms and in raw FULL commits;
* commits per turn (the run's head version counts every commit);
* the ratio of per-turn durable cost at 200 and at 10 turns (does a turn get dearer as the
  conversation grows?), and journal bytes per turn at both sizes.

Targets: sync overhead <= 2 raw FULL commits per turn (one for the turn, one for its tool
batch); cost ratio 200/10 <= 1.2; bytes per turn flat.

    python bench/agent_overhead.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from stepstone import Agent, Runner, RunnerConfig, Store, checkpoint_latest_key, tool
from stepstone.providers import ModelRequest, Usage
from stepstone.testing import FunctionModel, Reply, call

PAYLOAD = "x" * 1000
# Given usage: the scripted model would otherwise estimate tokens over the whole
# conversation on every turn (its own cost, not the engine's).
USAGE = Usage(input_tokens=100, output_tokens=20)
MODES = (
    ("sync", False, "full"),
    ("write-behind", True, "full"),
    ("sync NORMAL", False, "normal"),  # no fsync: what the engine itself costs
)


def raw_commit_ms(path: Path, n: int = 300) -> float:
    """Milliseconds per single-row (~1 KB) committed transaction, WAL + FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", PAYLOAD))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed * 1000 / n


@tool
async def lookup(n: int) -> str:
    """Look a number up."""
    return f"value {n}"


@tool
async def note(n: int) -> str:
    """Write a note."""
    return f"noted {n}"


def agent(turns: int, stamps: list[float] | None = None) -> Agent:
    def script(request: ModelRequest) -> Any:
        if stamps is not None:
            stamps.append(time.perf_counter())
        if request.turn < turns - 1:
            t = request.turn
            return Reply(tool_calls=[call("lookup", n=t), call("note", n=t)], usage=USAGE)
        return Reply(text="done", usage=USAGE)

    return Agent(
        name="bench", model=FunctionModel(script), tools=[lookup, note], max_turns=turns + 1
    )


async def plain_ms(turns: int) -> float:
    start = time.perf_counter()
    env = await agent(turns).run("go")
    assert env.ok, env.error
    return (time.perf_counter() - start) * 1000


async def durable_ms(
    path: Path, turns: int, async_writes: bool, durability: str = "full"
) -> tuple[float, int, int]:
    """(ms, commits, journal bytes) of one durable run on a new file."""
    with Store(db=path, durability=durability) as store:  # type: ignore[arg-type]
        runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=async_writes))
        start = time.perf_counter()
        result = await runner.run(agent(turns), user_message="go", run_id="b")
        ms = (time.perf_counter() - start) * 1000
        assert result.state == "completed", result.error
        key = checkpoint_latest_key("b")
        head = store.backend.run_get(key)
        assert head is not None
        size = sum(len(r.data) for r in store.backend.run_journal(key))
        return ms, head.version, size


async def turn_cost(path: Path, durability: str) -> tuple[float, float]:
    """Median ms per turn over turns 10-59 and 150-199 of one 200-turn sync run: does a
    turn get dearer as the conversation grows (fixed per-run costs excluded)?"""
    stamps: list[float] = []
    with Store(db=path, durability=durability) as store:  # type: ignore[arg-type]
        runner = Runner(store=store, config=RunnerConfig(checkpoint_async_writes=False))
        await runner.run(agent(200, stamps), user_message="go", run_id="t")
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    return statistics.median(gaps[10:60]), statistics.median(gaps[150:200])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepstone-agent-bench-") as name:
        await measure(Path(name), args.repeat)


async def measure(tmp: Path, repeat: int) -> None:
    """Print every measurement (database files go in ``tmp``)."""
    raw = statistics.median(raw_commit_ms(tmp / f"raw{r}.sqlite") for r in range(repeat))
    print(f"raw SQLite FULL commit of a ~1 KB row: {raw:.3f} ms")
    print(
        f"{'turns':>5} {'mode':>12} {'plain/turn':>11} {'durable/turn':>13} "
        f"{'overhead':>9} {'x raw':>6} {'commits/turn':>13} {'bytes/turn':>11}"
    )
    per_turn: dict[tuple[int, str], float] = {}
    for turns in (10, 200):
        plain = statistics.median([await plain_ms(turns) for _ in range(repeat)])
        for mode, async_writes, durability in MODES:
            runs = [
                await durable_ms(
                    tmp / f"d-{turns}-{mode}-{r}.sqlite", turns, async_writes, durability
                )
                for r in range(repeat)
            ]
            ms = statistics.median(r[0] for r in runs)
            commits, size = runs[0][1], runs[0][2]
            over = (ms - plain) / turns
            per_turn[(turns, mode)] = ms / turns
            print(
                f"{turns:>5} {mode:>12} {plain / turns:>9.3f}ms {ms / turns:>11.3f}ms "
                f"{over:>7.3f}ms {over / raw:>6.2f} {commits / turns:>13.2f} "
                f"{size / turns:>11.0f}"
            )
    for mode, _, _ in MODES:
        ratio = per_turn[(200, mode)] / per_turn[(10, mode)]
        print(f"cost ratio per turn, 200-turn run / 10-turn run ({mode}): {ratio:.2f}")
    for durability in ("full", "normal"):
        costs = [
            await turn_cost(tmp / f"t-{durability}-{r}.sqlite", durability) for r in range(repeat)
        ]
        early = statistics.median(c[0] for c in costs)
        late = statistics.median(c[1] for c in costs)
        print(
            f"within one 200-turn sync run ({durability.upper()}): turns 10-59 {early:.3f} ms, "
            f"turns 150-199 {late:.3f} ms per turn, ratio {late / early:.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
