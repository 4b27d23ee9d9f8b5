"""One agent shared by many threads (a web server's or a thread pool's workers): each
event loop gets its own SDK client, and no client is closed under a live request."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator

import pytest

from stepstone import Agent, LLMEngine
from stepstone.testing import LoopbackServer, block_model_requests
from tests.providers.conftest import CASES, Case

THREADS = 8
CALLS = 20


@pytest.fixture(autouse=True)
def _blocked() -> Iterator[None]:
    with block_model_requests():
        yield


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_agent_many_threads_no_failures(case: Case) -> None:  # guarantee 211
    with LoopbackServer(case.dialect(), model=case.model, default="pong", latency=0.002) as srv:
        # no retries: a single failed call fails the test
        engine = LLMEngine(case.model, provider=case.provider(srv.base_url), max_retries=0)
        agent = Agent(engine=engine)

        def worker(n: int) -> list[str]:
            out = []
            for i in range(CALLS):
                env = agent(f"ping {n}-{i}")
                out.append("ok" if env.ok and env.payload == "pong" else repr(env.error))
            return out

        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            results = [r for rs in pool.map(worker, range(THREADS)) for r in rs]
        failures = [r for r in results if r != "ok"]
        assert failures == [], failures[:3]
        assert len(srv.requests) == THREADS * CALLS
        # each pool thread's loop closed its client as the thread ended: nothing accumulates
        assert len(engine.get_provider()._clients) == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_aclose_waits_for_live_requests(case: Case) -> None:
    with LoopbackServer(case.dialect(), model=case.model, default="done", latency=0.3) as srv:
        provider = case.provider(srv.base_url)
        engine = LLMEngine(case.model, provider=provider, max_retries=0)
        agent = Agent(engine=engine)
        running = asyncio.create_task(agent.run("slow"))
        while not srv.requests:
            await asyncio.sleep(0.01)
        await engine.aclose()  # the live request keeps its client until it ends
        env = await running
        assert env.payload == "done", env.error
        again = await agent.run("after close")  # a fresh client for this loop
        assert again.payload == "done", again.error
        await engine.aclose()
