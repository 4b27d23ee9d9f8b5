"""One agent shared by many threads: sync calls per second and failures, per SDK.

Each sync ``agent(...)`` call runs on a fresh event loop and so gets a fresh SDK client. The
adapters share one TLS context between those clients; this benchmark measures, in one run,
8 threads x 20 calls through each official SDK against a loopback server, and the cost of
building a client with the shared context against one that loads its own CA bundle.

Target: 0 failures; a client build with the shared context at most 0.2x the cost of one
that builds its own TLS context.

    python bench/llm_threads.py [--threads 8] [--calls 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ssl
import time
from typing import Any

from stepstone import Agent, LLMEngine
from stepstone.providers import AnthropicProvider, GoogleProvider, OpenAIProvider
from stepstone.testing import (
    AnthropicDialect,
    GoogleDialect,
    LoopbackServer,
    OpenAIDialect,
    block_model_requests,
)

CASES: list[tuple[str, Any, Any, str]] = [
    ("anthropic", AnthropicDialect, AnthropicProvider, "claude-sonnet-4-6"),
    ("openai", OpenAIDialect, OpenAIProvider, "gpt-4o"),
    ("google", GoogleDialect, GoogleProvider, "gemini-2.5-flash"),
]


def threaded(case: tuple[str, Any, Any, str], threads: int, calls: int) -> tuple[float, int]:
    _name, dialect, cls, model = case
    with LoopbackServer(dialect(), model=model, default="pong") as server:
        engine = LLMEngine(model, provider=cls(base_url=server.base_url, api_key="k"))
        agent = Agent(engine=engine)

        def worker(_: int) -> int:
            return sum(0 if agent(f"ping {i}").ok else 1 for i in range(calls))

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            failures = sum(pool.map(worker, range(threads)))
        return threads * calls / (time.perf_counter() - start), failures


def build_cost(repeat: int = 20) -> tuple[float, float]:
    """Seconds per client build: shared TLS context vs a fresh one per client."""
    provider = OpenAIProvider(base_url="http://127.0.0.1:9", api_key="k")
    provider._build_client()
    start = time.perf_counter()
    for _ in range(repeat):
        provider._build_client()
    shared = (time.perf_counter() - start) / repeat
    start = time.perf_counter()
    for _ in range(repeat):
        ssl.create_default_context()
        provider._build_client()
    fresh = (time.perf_counter() - start) / repeat
    return shared, fresh


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with block_model_requests():
        for case in CASES:
            rate, failures = threaded(case, args.threads, args.calls)
            print(
                f"{case[0]:<9} {args.threads} threads x {args.calls} sync calls: "
                f"{rate:7.1f} calls/s, {failures} failures"
            )
    shared, fresh = build_cost()
    print(
        f"client build: shared TLS context {shared * 1000:.2f} ms, own TLS context "
        f"{fresh * 1000:.2f} ms, ratio {shared / fresh:.3f}x"
    )
    print("target: 0 failures; ratio <= 0.2x")


if __name__ == "__main__":
    main()
