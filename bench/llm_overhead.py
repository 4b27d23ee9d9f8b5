"""LLMEngine overhead per model turn, as a ratio to calling the official SDK directly.

Both sides talk to the same loopback server (``stepstone.testing.LoopbackServer``) that
answers in the provider's wire format after a simulated model latency, in the same run:

* SDK: ``client.chat.completions.create(...)`` / ``client.messages.create(...)`` with the
  same messages and tool definitions the engine sends, one call per turn;
* engine: ``Agent(engine=LLMEngine(model, provider=...), tools=[add]).run(...)``, for a
  one-turn run (text answer) and a three-turn run (two tool turns, then the answer); the
  engine's time includes building requests, events, tool execution, retries bookkeeping
  and the envelope.

Target: engine/SDK <= 1.2x per turn at 50 ms simulated latency. Absolute milliseconds are
printed too (the overhead in ms is what a 0 ms server shows most clearly).

Then sync calls (``agent("hi")``, one turn, 0 ms server) on the main thread, per provider
(OpenAI, Anthropic, Google), rounds interleaved, medians of the rounds:

* kept: the thread's sync calls share the SDK client and its connection (today);
* closed: ``agent("hi")`` then ``provider.close()``, the client closed after every call as
  sync calls did before (the close itself is a second, tiny sync call);
* awaited: ``await agent.run("hi")`` repeatedly in one loop, the floor;

with the connections the loopback server accepted per 100 calls in each mode.

    python bench/llm_overhead.py [--turns 30] [--latency 0.05] [--sync-calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from stepstone import Agent, LLMEngine
from stepstone.providers import AnthropicProvider, GoogleProvider, OpenAIProvider, Provider
from stepstone.testing import (
    AnthropicDialect,
    Dialect,
    GoogleDialect,
    LoopbackServer,
    OpenAIDialect,
    call,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TOOLS_ANTHROPIC = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": TOOLS_OPENAI[0]["function"]["parameters"],  # type: ignore[index]
    }
]


async def timed(n: int, fn: Callable[[], Awaitable[Any]]) -> float:
    """Median milliseconds of ``n`` calls (after one warm-up)."""
    await fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


async def bench_provider(name: str, dialect: Dialect, latency: float, turns: int) -> None:
    with LoopbackServer(dialect, latency=latency, default="the answer is 42") as server:
        if name == "openai":
            import openai

            sdk: Any = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            provider: Provider = OpenAIProvider(base_url=server.base_url, api_key="k")
            model = "gpt-4o"

            async def sdk_turn() -> Any:
                return await sdk.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "what is 40 + 2?"}],
                    tools=TOOLS_OPENAI,
                    tool_choice="auto",
                )
        else:
            import anthropic

            sdk = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="k", max_retries=0)
            provider = AnthropicProvider(base_url=server.base_url, api_key="k")
            model = "claude-sonnet-4-6"

            async def sdk_turn() -> Any:
                return await sdk.messages.create(
                    model=model,
                    max_tokens=4096,
                    messages=[{"role": "user", "content": "what is 40 + 2?"}],
                    tools=TOOLS_ANTHROPIC,
                    tool_choice={"type": "auto"},
                )

        agent = Agent(engine=LLMEngine(model, provider=provider), tools=[add])

        async def engine_turn() -> Any:
            env = await agent.run("what is 40 + 2?")
            assert env.ok, env.error
            return env

        async def engine_three_turns() -> Any:
            server.push(call("add", a=20, b=20), call("add", a=40, b=2))
            env = await agent.run("what is 40 + 2?")
            assert env.ok and env.metadata["turns"] == 3, env.error
            return env

        async def sdk_three_turns() -> Any:
            for _ in range(3):
                await sdk_turn()

        # interleave the measurements so drift hits both sides alike
        sdk_ms, engine_ms, sdk3_ms, engine3_ms = [], [], [], []
        for _ in range(3):
            sdk_ms.append(await timed(turns, sdk_turn))
            engine_ms.append(await timed(turns, engine_turn))
            sdk3_ms.append(await timed(max(3, turns // 3), sdk_three_turns) / 3)
            engine3_ms.append(await timed(max(3, turns // 3), engine_three_turns) / 3)
        await sdk.close()
        await provider.aclose()

    one_sdk, one_engine = min(sdk_ms), min(engine_ms)
    three_sdk, three_engine = min(sdk3_ms), min(engine3_ms)
    print(
        f"{name:9} latency {latency * 1000:4.0f} ms | 1-turn run: sdk {one_sdk:7.2f} ms, "
        f"engine {one_engine:7.2f} ms, ratio {one_engine / one_sdk:4.2f}x "
        f"(+{one_engine - one_sdk:5.2f} ms) | 3-turn run, per turn: sdk {three_sdk:7.2f} ms, "
        f"engine {three_engine:7.2f} ms, ratio {three_engine / three_sdk:4.2f}x "
        f"(+{three_engine - three_sdk:5.2f} ms)"
    )


SYNC_CASES: list[tuple[str, Callable[[], Dialect], Callable[[str], Provider], str]] = [
    ("openai", OpenAIDialect, lambda url: OpenAIProvider(base_url=url, api_key="k"), "gpt-4o"),
    (
        "anthropic",
        AnthropicDialect,
        lambda url: AnthropicProvider(base_url=url, api_key="k"),
        "claude-sonnet-4-6",
    ),
    (
        "google",
        GoogleDialect,
        lambda url: GoogleProvider(base_url=url, api_key="k"),
        "gemini-2.5-flash",
    ),
]


def sync_provider(
    name: str, dialect: Dialect, make: Callable[[str], Provider], model: str, n: int, rounds: int
) -> None:
    """One provider's sync calls: client kept vs closed after every call vs awaited."""
    with LoopbackServer(dialect, default="pong") as server:
        provider = make(server.base_url)
        agent = Agent(engine=LLMEngine(model, provider=provider, max_retries=0))

        def kept() -> None:
            assert agent("hi").payload == "pong"

        def closed() -> None:
            assert agent("hi").payload == "pong"
            provider.close()

        def sync_ms(fn: Callable[[], None], calls: int) -> float:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - start) * 1000 / calls

        async def awaited_ms(calls: int) -> float:
            start = time.perf_counter()
            for _ in range(calls):
                assert (await agent.run("hi")).payload == "pong"
            return (time.perf_counter() - start) * 1000 / calls

        def opened(run: Callable[[], object]) -> int:
            """Connections the server accepted during ``run()``, from a fresh client."""
            provider.close()
            before = server.connections
            run()
            return server.connections - before

        conns = {
            "kept": opened(lambda: sync_ms(kept, 100)),
            "closed": opened(lambda: sync_ms(closed, 100)),
            "awaited": opened(lambda: asyncio.run(awaited_ms(100))),
        }
        results: dict[str, list[float]] = {"kept": [], "closed": [], "awaited": []}
        for _ in range(rounds):  # interleaved: drift hits every mode alike
            results["kept"].append(sync_ms(kept, n))
            results["closed"].append(sync_ms(closed, n))
            results["awaited"].append(asyncio.run(awaited_ms(n)))
        provider.close()
    ms = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"{name:9} kept {ms['kept']:5.2f} ms ({conns['kept']} conn/100 calls) | "
        f"closed per call {ms['closed']:5.2f} ms ({conns['closed']}/100) | "
        f"awaited {ms['awaited']:5.2f} ms ({conns['awaited']}/100) | "
        f"closed/kept {ms['closed'] / ms['kept']:4.2f}x, "
        f"kept/awaited {ms['kept'] / ms['awaited']:4.2f}x"
    )


def sync_modes(n: int, rounds: int) -> None:
    """Sync ``agent("hi")`` per call on every provider."""
    print(f"sync agent('hi'), 0 ms server, median of {rounds} rounds of {n} calls:")
    for name, dialect, make, model in SYNC_CASES:
        sync_provider(name, dialect(), make, model, n, rounds)


async def main(args: argparse.Namespace) -> None:
    for latency in (args.latency, 0.0):
        for name, dialect in (("openai", OpenAIDialect()), ("anthropic", AnthropicDialect())):
            await bench_provider(name, dialect, latency, args.turns)
    print("target: ratio <= 1.2x at 50 ms latency")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="samples per measurement")
    parser.add_argument("--latency", type=float, default=0.05, help="simulated latency (s)")
    parser.add_argument("--sync-calls", type=int, default=200, help="sync calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of sync calls")
    parser.add_argument("--sync-only", action="store_true", help="only the sync calls")
    arguments = parser.parse_args()
    if not arguments.sync_only:
        asyncio.run(main(arguments))
    sync_modes(arguments.sync_calls, arguments.rounds)
