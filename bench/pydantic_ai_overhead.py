"""The same agent made durable by stepstone and by DBOS, on SQLite, side by side in one run.

1. **pydantic-ai.** An agent whose model (a ``FunctionModel``) asks for one tool call per
   turn for N turns, then answers. It runs three ways, each on a new SQLite file:
   plain (no durability: what pydantic-ai itself costs), with ``StepstoneDurability``
   inside a ``@workflow`` (``synchronous=FULL``), and with pydantic-ai's ``DBOSDurability``
   inside a ``@DBOS.workflow`` (its SQLite system database; the tool is a ``@DBOS.step``,
   as DBOS's docs make tools durable, so both journal the same calls). The durable
   overhead per turn is (durable time - plain time) / N. Reported: each framework's
   overhead per turn, their ratio (goal: stepstone's at most a third of DBOS's), each
   overhead as a multiple of a raw SQLite commit (``BEGIN IMMEDIATE; INSERT; COMMIT``, WAL,
   FULL, measured on new files right before and after), and stepstone's overhead per turn
   at 10, 50 and 200 turns (flat: a turn costs the same late in a run as early).
2. **OpenAI Agents SDK.** When ``dbos-openai-agents`` is installed: the same shape of run
   (a scripted ``Model`` asking for one tool call per turn) with stepstone's
   ``DurableRunner`` inside a ``@workflow`` and with DBOS's ``DBOSRunner`` inside a
   ``@DBOS.workflow`` (the tool a ``@DBOS.step``), against a plain ``Runner.run``.

DBOS is not a dependency of stepstone: ``pip install dbos dbos-openai-agents`` to compare;
without it the script measures stepstone alone.

    python bench/pydantic_ai_overhead.py [--turns 20] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from stepstone import Store, workflow
from stepstone.integrations.pydantic_ai import StepstoneDurability

PAYLOAD = "x" * 1000
NO_LIMIT = UsageLimits(request_limit=None)
TURNS = [20]


def raw_commit_ms(path: Path, n: int = 100) -> float:
    """Milliseconds per single-row (~1 KB) committed transaction on a new WAL file, FULL."""
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


def turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One ``lookup`` call per turn for TURNS[0] turns, then the answer."""
    n = sum(1 for m in messages if m.kind == "response")
    if n < TURNS[0]:
        return ModelResponse(parts=[ToolCallPart("lookup", {"i": n}, tool_call_id=f"c{n}")])
    return ModelResponse(parts=[TextPart(f"looked up {n} things")])


def lookup_body(i: int) -> str:
    return f"item {i}"


def pydantic_agent(
    name: str, capabilities: list[Any], tool: Callable[[int], Any]
) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(turns), name=name, capabilities=capabilities)

    async def lookup(i: int) -> str:
        """Look something up."""
        value = tool(i)
        return str(await value if isinstance(value, Awaitable) else value)

    agent.tool_plain(lookup)
    return agent


class PydanticAI:
    """The three ways to run the pydantic-ai agent (see the module docstring)."""

    def __init__(self, tmp: Path, with_dbos: bool) -> None:
        self.tmp = tmp
        self.plain = pydantic_agent("plain", [], lookup_body)
        self.ours = pydantic_agent("ours", [StepstoneDurability()], lookup_body)
        agent = self.ours

        @workflow
        async def ours_wf(n: int) -> str:
            return (await agent.run("look things up", usage_limits=NO_LIMIT)).output

        self.ours_wf = ours_wf
        self.runs = 0
        self.dbos: Any = None
        if with_dbos:
            from dbos import DBOS, SetWorkflowID
            from pydantic_ai.durable_exec.dbos import DBOSDurability

            DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{tmp}/dbos.sqlite"})
            step = DBOS.step(name="lookup")(lookup_body)
            theirs = pydantic_agent("theirs", [DBOSDurability()], step)

            @DBOS.workflow()
            async def theirs_wf(n: int) -> str:
                return (await theirs.run("look things up", usage_limits=NO_LIMIT)).output

            self.theirs_wf, self.set_id, self.dbos = theirs_wf, SetWorkflowID, DBOS

    async def plain_ms(self) -> float:
        t0 = time.perf_counter()
        await self.plain.run("look things up", usage_limits=NO_LIMIT)
        return (time.perf_counter() - t0) * 1000

    async def ours_ms(self) -> float:
        self.runs += 1
        store = Store(db=self.tmp / f"ours-{self.runs}.sqlite")
        t0 = time.perf_counter()
        out = await self.ours_wf.using(store=store, key="bench").run(TURNS[0])
        ms = (time.perf_counter() - t0) * 1000
        store.close()
        assert out == f"looked up {TURNS[0]} things"
        return ms

    async def theirs_ms(self) -> float:
        self.runs += 1
        t0 = time.perf_counter()
        with self.set_id(f"bench-{self.runs}"):
            out = await self.theirs_wf(TURNS[0])
        assert out == f"looked up {TURNS[0]} things"
        return (time.perf_counter() - t0) * 1000


async def measure(
    tmp: Path,
    plain: Callable[[], Awaitable[float]],
    ways: dict[str, Callable[[], Awaitable[float]]],
    repeat: int,
) -> dict[str, tuple[float, float, float, float]]:
    """Per way: (median overhead ms per turn, min, max, median overhead / raw commit)."""
    for run in [plain, *ways.values()]:  # first-run costs (imports, threads, caches)
        await run()
    over: dict[str, list[float]] = {name: [] for name in ways}
    raw: list[float] = []
    for r in range(repeat):
        raw.append(raw_commit_ms(tmp / f"raw-{r}-a.sqlite"))
        for name, run in ways.items():
            base = await plain()
            over[name].append((await run() - base) / TURNS[0])
        raw.append(raw_commit_ms(tmp / f"raw-{r}-b.sqlite"))
    commit = statistics.median(raw)
    return {
        name: (statistics.median(v), min(v), max(v), statistics.median(v) / commit)
        for name, v in over.items()
    }


def report(title: str, found: dict[str, tuple[float, float, float, float]]) -> None:
    print(title)
    for name, (ms, lo, hi, raw) in found.items():
        print(
            f"  {name:<10} {ms:6.3f} ms/turn overhead ({lo:.3f}-{hi:.3f}) = {raw:.2f}x a raw commit"
        )
    if "DBOS" in found and "stepstone" in found:
        ours, theirs = found["stepstone"][0], found["DBOS"][0]
        print(f"  -> stepstone's overhead per turn is {ours / theirs:.2f} of DBOS's (goal <= 0.33)")


async def pydantic_ai(tmp: Path, n: int, repeat: int, with_dbos: bool) -> None:
    bench = PydanticAI(tmp, with_dbos)
    ways: dict[str, Callable[[], Awaitable[float]]] = {"stepstone": bench.ours_ms}
    if bench.dbos is not None:
        bench.dbos.launch()
        ways["DBOS"] = bench.theirs_ms
    try:
        TURNS[0] = n
        report(
            f"pydantic-ai agent, {n} turns, one tool call per turn, SQLite:",
            await measure(tmp, bench.plain_ms, ways, repeat),
        )
        flat = []
        for size in (10, 50, 200):
            TURNS[0] = size
            flat.append(
                (
                    size,
                    (
                        await measure(
                            tmp, bench.plain_ms, {"stepstone": bench.ours_ms}, max(1, repeat // 2)
                        )
                    )["stepstone"],
                )
            )
        print(
            "  stepstone overhead per turn by run length: "
            + ", ".join(f"{size} turns {v[0]:.3f} ms" for size, v in flat)
        )
    finally:
        if bench.dbos is not None:
            bench.dbos.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS comparison")
    args = parser.parse_args()
    with_dbos = not args.no_dbos
    if with_dbos:
        try:
            import dbos  # noqa: F401
        except ImportError:
            print("dbos is not installed (pip install dbos): measuring stepstone alone")
            with_dbos = False
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(pydantic_ai(Path(tmp), args.turns, args.repeat, with_dbos))


if __name__ == "__main__":
    main()
