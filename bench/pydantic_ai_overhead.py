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
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
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

    def journal_bytes(self) -> int:
        """Bytes of journal rows of the last stepstone run."""
        conn = sqlite3.connect(self.tmp / f"ours-{self.runs}.sqlite")
        try:
            tables = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            table = next(t for t in tables if t.endswith("journal"))
            row = conn.execute(f"SELECT sum(length(data)) FROM {table}").fetchone()
            return int(row[0] or 0)
        finally:
            conn.close()

    async def theirs_ms(self) -> float:
        self.runs += 1
        t0 = time.perf_counter()
        with self.set_id(f"bench-{self.runs}"):
            out = await self.theirs_wf(TURNS[0])
        assert out == f"looked up {TURNS[0]} things"
        return (time.perf_counter() - t0) * 1000


class Inside:
    """Time spent inside ``StepstoneOperationBackend.execute`` less the call it runs (the
    model request, the tool): what the journal costs on the run's path, waiting for its
    commits included. pydantic-ai's own cost per turn grows with the conversation; this
    leaves it out, so it shows whether a turn costs stepstone the same late in a run."""

    def __init__(self) -> None:
        self.total = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from stepstone.integrations.pydantic_ai import StepstoneOperationBackend

        original = StepstoneOperationBackend.execute
        meter = self

        async def execute(backend: Any, *, body: Any, **kwargs: Any) -> object:
            inner = [0.0]

            async def timed_body() -> object:
                t0 = time.perf_counter()
                try:
                    return await body()
                finally:
                    inner[0] += time.perf_counter() - t0

            t0 = time.perf_counter()
            try:
                return await original(backend, body=timed_body, **kwargs)
            finally:
                meter.total += time.perf_counter() - t0 - inner[0]

        StepstoneOperationBackend.execute = execute  # type: ignore[method-assign]
        try:
            yield
        finally:
            StepstoneOperationBackend.execute = original  # type: ignore[method-assign]


async def timed(run: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    """(wall ms, CPU ms of the process, its threads included) of one run."""
    c0 = time.process_time()
    ms = await run()
    return ms, (time.process_time() - c0) * 1000


Found = dict[str, tuple[float, float, float, float, float]]


async def measure(
    tmp: Path,
    plain: Callable[[], Awaitable[float]],
    ways: dict[str, Callable[[], Awaitable[float]]],
    repeat: int,
) -> Found:
    """Per way: (median overhead ms per turn, min, max, median overhead / raw commit,
    median CPU overhead ms per turn)."""
    for run in [plain, *ways.values()]:  # first-run costs (imports, threads, caches)
        await run()
    over: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    raw: list[float] = []
    for r in range(repeat):
        raw.append(raw_commit_ms(tmp / f"raw-{r}-a.sqlite"))
        for name, run in ways.items():
            base, base_cpu = await timed(plain)
            ms, cpu_ms = await timed(run)
            over[name].append((ms - base) / TURNS[0])
            cpu[name].append((cpu_ms - base_cpu) / TURNS[0])
        raw.append(raw_commit_ms(tmp / f"raw-{r}-b.sqlite"))
    commit = statistics.median(raw)
    return {
        name: (
            statistics.median(v),
            min(v),
            max(v),
            statistics.median(v) / commit,
            statistics.median(cpu[name]),
        )
        for name, v in over.items()
    }


def report(title: str, found: Found) -> None:
    print(title)
    for name, (ms, lo, hi, raw, cpu) in found.items():
        print(
            f"  {name:<10} {ms:6.3f} ms/turn overhead ({lo:.3f}-{hi:.3f}) = {raw:.2f}x a raw "
            f"commit; CPU {cpu:.3f} ms/turn"
        )
    if "DBOS" in found and "stepstone" in found:
        ours, theirs = found["stepstone"][0], found["DBOS"][0]
        print(f"  -> stepstone's overhead per turn is {ours / theirs:.2f} of DBOS's (goal <= 0.33)")
        print(f"     CPU: {found['stepstone'][4] / found['DBOS'][4]:.2f} of DBOS's")


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
        inside = Inside()
        with inside.installed():
            spent = []
            for size in (10, 50, 200):
                TURNS[0] = size
                ms = []
                for _ in range(max(1, repeat // 2)):
                    inside.total = 0.0
                    await bench.ours_ms()
                    ms.append(inside.total * 1000 / size)
                spent.append((size, statistics.median(ms), bench.journal_bytes() / size))
        print(
            "  time the run spends in stepstone per turn (outside the model and the tool), "
            "by run length: "
            + ", ".join(f"{size} turns {v:.3f} ms ({b:.0f} B journaled)" for size, v, b in spent)
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
            + ", ".join(f"{size} turns {v[0]:.3f} ms (CPU {v[4]:.3f})" for size, v in flat)
        )
    finally:
        if bench.dbos is not None:
            bench.dbos.destroy()


def agents_sdk_model() -> Any:
    """A scripted Agents SDK ``Model``: one ``lookup`` call per turn, then the answer."""
    import json

    from agents import Model, ModelResponse, Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class Scripted(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            items = args[1] if len(args) > 1 else kwargs["input"]
            n = sum(
                1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
            )
            output: list[Any]
            if n < TURNS[0]:
                args_json = json.dumps({"i": n})
                output = [
                    ResponseFunctionToolCall(
                        type="function_call", call_id=f"c{n}", name="lookup", arguments=args_json
                    )
                ]
            else:
                text = ResponseOutputText(
                    type="output_text", text=f"looked up {n} things", annotations=[]
                )
                output = [
                    ResponseOutputMessage(
                        type="message", id="m", role="assistant", status="completed", content=[text]
                    )
                ]
            usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
            return ModelResponse(output=output, usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return Scripted()


async def agents_sdk(tmp: Path, n: int, repeat: int, with_dbos: bool) -> None:
    from agents import Agent as SDKAgent
    from agents import Runner, function_tool, set_tracing_disabled

    from stepstone.integrations.openai_agents import DurableRunner

    set_tracing_disabled(True)
    TURNS[0] = n
    runs = [0]

    def sdk_agent(tool: Callable[[int], str]) -> Any:
        async def lookup(i: int) -> str:
            """Look something up."""
            return tool(i)

        return SDKAgent(name="desk", tools=[function_tool(lookup)], model=agents_sdk_model())

    plain_agent, ours_agent = sdk_agent(lookup_body), sdk_agent(lookup_body)

    async def plain() -> float:
        t0 = time.perf_counter()
        await Runner.run(plain_agent, "look things up", max_turns=n + 5)
        return (time.perf_counter() - t0) * 1000

    @workflow
    async def ours_wf(k: int) -> str:
        result = await DurableRunner.run(ours_agent, "look things up", max_turns=n + 5)
        return str(result.final_output)

    async def ours() -> float:
        runs[0] += 1
        store = Store(db=tmp / f"sdk-{runs[0]}.sqlite")
        t0 = time.perf_counter()
        assert await ours_wf.using(store=store, key="bench").run(n) == f"looked up {n} things"
        ms = (time.perf_counter() - t0) * 1000
        store.close()
        return ms

    ways: dict[str, Callable[[], Awaitable[float]]] = {"stepstone": ours}
    dbos: Any = None
    if with_dbos:
        from dbos import DBOS, SetWorkflowID
        from dbos_openai_agents import DBOSRunner

        DBOS(
            config={"name": "bench-sdk", "system_database_url": f"sqlite:///{tmp}/dbos-sdk.sqlite"}
        )
        theirs_agent = sdk_agent(DBOS.step(name="sdk_lookup")(lookup_body))

        @DBOS.workflow()
        async def theirs_wf(k: int) -> str:
            result = await DBOSRunner.run(theirs_agent, "look things up", max_turns=n + 5)
            return str(result.final_output)

        async def theirs() -> float:
            runs[0] += 1
            t0 = time.perf_counter()
            with SetWorkflowID(f"sdk-{runs[0]}"):
                assert await theirs_wf(n) == f"looked up {n} things"
            return (time.perf_counter() - t0) * 1000

        DBOS.launch()
        dbos = DBOS
        ways["DBOS"] = theirs
    try:
        title = f"OpenAI Agents SDK, {n} turns, one tool call per turn, SQLite:"
        report(title, await measure(tmp, plain, ways, repeat))
    finally:
        if dbos is not None:
            dbos.destroy()


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
    try:
        import agents  # noqa: F401
    except ImportError:
        print("openai-agents is not installed: no Agents SDK comparison")
        return
    sdk_dbos = with_dbos
    if sdk_dbos:
        try:
            import dbos_openai_agents  # noqa: F401
        except ImportError:
            print("dbos-openai-agents is not installed: measuring DurableRunner alone")
            sdk_dbos = False
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(agents_sdk(Path(tmp), args.turns, args.repeat, sdk_dbos))


if __name__ == "__main__":
    main()
