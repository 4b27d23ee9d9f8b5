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

    python bench/llm_overhead.py [--turns 30] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from stepstone import Agent, LLMEngine
from stepstone.providers import AnthropicProvider, OpenAIProvider, Provider
from stepstone.testing import AnthropicDialect, Dialect, LoopbackServer, OpenAIDialect, call


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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="samples per measurement")
    parser.add_argument("--latency", type=float, default=0.05, help="simulated latency (s)")
    args = parser.parse_args()
    for latency in (args.latency, 0.0):
        for name, dialect in (("openai", OpenAIDialect()), ("anthropic", AnthropicDialect())):
            await bench_provider(name, dialect, latency, args.turns)
    print("target: ratio <= 1.2x at 50 ms latency")


if __name__ == "__main__":
    asyncio.run(main())
