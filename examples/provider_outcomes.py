"""What an agent does with what real providers send, offline, through the real SDKs.

Each provider's official SDK talks to a loopback server speaking that provider's wire format,
so every case below goes through the same code path as a real request:

- a refusal ends the run with ModelRefusalError (never an "answer", never retried);
- an answer cut off at the token cap is continued when the engine allows it;
- an overloaded error event inside a stream, before any text, is retried;
- a rate limit asking for an hour ends the step at once with retry_at, instead of sleeping;
- a budget stops the run before the request that would go over it.

Run it: python examples/provider_outcomes.py
"""

from __future__ import annotations

import asyncio
import time

from stepstone import Agent, LLMEngine, ModelRateLimitError, UsageLimits
from stepstone.providers import AnthropicProvider, GoogleProvider, OpenAIProvider, Provider
from stepstone.testing import (
    AnthropicDialect,
    Dialect,
    GoogleDialect,
    LoopbackServer,
    OpenAIDialect,
    Reply,
    block_model_requests,
    call,
)

PROVIDERS: list[tuple[str, type[Dialect], type[Provider], str]] = [
    ("anthropic", AnthropicDialect, AnthropicProvider, "claude-sonnet-4-6"),
    ("openai", OpenAIDialect, OpenAIProvider, "gpt-4o"),
    ("google", GoogleDialect, GoogleProvider, "gemini-2.5-flash"),
]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def one_provider(name: str, dialect: type[Dialect], cls: type[Provider], model: str) -> None:
    with LoopbackServer(dialect(), model=model) as server:
        provider = cls(base_url=server.base_url, api_key="offline")  # type: ignore[call-arg]
        engine = LLMEngine(model, provider=provider, continue_on_length=1, retry_delay=0.01)
        agent = Agent(engine=engine, tools=[add])

        server.push(Reply(text="I won't do that.", stop_reason="refusal"))
        env = await agent.run("something I should not ask")
        print(f"{name}: refusal -> {env.error.type if env.error else env.payload}")

        server.push(Reply(text="Forty ", stop_reason="length"), "two.")
        env = await agent.run("the answer?")
        print(f"{name}: cut off, continued -> {env.payload!r}")

        server.push(Reply(text="lost", stream_error="overloaded"), "streamed after a retry")
        text = "".join([t async for t in agent.stream("stream it")])
        print(f"{name}: overloaded before any text -> {text!r}")

        server.push(server.dialect.error(429, "quota exhausted", retry_after=3600))
        try:
            async for _ in agent.stream("again"):
                pass
        except ModelRateLimitError as exc:
            minutes = round(((exc.retry_at or 0) - time.time()) / 60)
            print(f"{name}: rate limited for an hour -> retry in ~{minutes} min, not slept")

        budget = LLMEngine(model, provider=provider, usage_limits=UsageLimits(max_requests=2))
        server.push(call("add", a=1, b=1), call("add", a=2, b=2), "never sent")
        env = await Agent(engine=budget, tools=[add]).run("keep adding")
        print(f"{name}: budget -> {env.error.type if env.error else env.payload}")
        print(f"{name}: requests the server saw: {len(server.requests)}")
        await engine.aclose()
        await budget.aclose()


async def main() -> None:
    with block_model_requests():  # only the loopback servers can be reached
        for entry in PROVIDERS:
            await one_provider(*entry)


if __name__ == "__main__":
    asyncio.run(main())
