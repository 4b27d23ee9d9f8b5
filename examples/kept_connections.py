"""A sync script that asks a model again and again: one connection per thread, not per call.

Each thread's sync calls (``agent("task")``) run on one event loop, reused by every call of
the thread, and the provider's SDK client, with its open HTTP connections, is kept on it:
fifty calls from the main thread go over one connection (against a real API that saves a
TCP and TLS handshake, tens to hundreds of milliseconds, per call). Each thread gets a
client of its own, closed when the thread ends; ``provider.close()`` closes the calling
thread's client early, and a connection the server dropped while idle is replaced on the
next call. A loopback server speaking OpenAI's wire format stands in for the API, so no
key is needed.

Usage: python examples/kept_connections.py
"""

from __future__ import annotations

import threading

from stepstone import Agent, LLMEngine
from stepstone.providers import OpenAIProvider
from stepstone.testing import LoopbackServer, OpenAIDialect


def ask(agent: Agent, n: int) -> None:
    """``n`` sync calls, each one model request."""
    for i in range(n):
        env = agent(f"ping {i}")
        assert env.payload == "pong", env.error


def main() -> None:
    with LoopbackServer(OpenAIDialect(), default="pong", latency=0.001) as server:
        provider = OpenAIProvider(base_url=server.base_url, api_key="test")
        agent: Agent = Agent(engine=LLMEngine("gpt-4o", provider=provider))

        ask(agent, 50)
        print(f"main thread: 50 calls over {server.connections} connection")

        threads = [threading.Thread(target=ask, args=(agent, 25)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()  # each thread's client was closed as the thread ended
        print(f"4 threads x 25 calls: {server.connections - 1} more connections")

        server.close_idle()  # as a server does when its keep-alive timeout expires
        ask(agent, 1)
        print(f"after the server dropped the idle connection: connection #{server.connections}")

        provider.close()  # close the main thread's client now, not at interpreter exit
        ask(agent, 1)
        print(f"after provider.close(): connection #{server.connections}")
        provider.close()


if __name__ == "__main__":
    main()
