"""Sync calls keep the provider's SDK client, and its open connections, across calls.

Connections are counted where they are accepted, on the loopback server. Each test makes
its sync calls on a thread of its own, so that the test process's main thread keeps
nothing between tests; crossing a process boundary (fork, interpreter exit) is tested in
real subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, LLMEngine
from stepstone.core import _sync
from stepstone.providers import Provider
from stepstone.testing import LoopbackServer
from tests.providers.conftest import CASES, Case

ROOT = Path(__file__).resolve().parents[2]
CALLS = 20
has_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")


def sockets() -> int:
    """Open sockets of this process (both ends of every loopback connection)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    return count


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until ``check()`` holds (the server sees a close when its loop gets to it)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {timeout} s"
        time.sleep(0.01)


@pytest.fixture
def young_heap() -> Iterator[None]:
    """Make the test's ``gc.collect()`` calls look only at objects made during the test.

    The process's older heap (pytest, every SDK's modules: hundreds of thousands of
    objects, millions in a worker that ran other tests first) is frozen, so a collection
    costs microseconds instead of up to a second. Nothing a test drops is in it: the
    providers, clients and loops these tests collect are all made after the freeze.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def on_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a new thread that then ends; its result (or exception)."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - raised again below
            out.append((False, exc))

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def agent_for(case: Case, server: LoopbackServer) -> tuple[Agent, Provider]:
    provider = case.provider(server.base_url)
    # no retries: a call that fails on a stale connection fails the test
    return Agent(engine=LLMEngine(case.model, provider=provider, max_retries=0)), provider


def clients(provider: Provider) -> int:
    return len(provider._clients)  # type: ignore[attr-defined]


def answers(agent: Agent, n: int) -> list[Any]:
    return [agent(f"ping {i}").payload for i in range(n)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sync_calls_on_one_thread_share_one_connection(case: Case) -> None:
    # guarantee 334
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, provider = agent_for(case, srv)

        def calls() -> list[Any]:
            out = answers(agent, CALLS)
            assert srv.open_connections == 1 and clients(provider) == 1  # kept between calls
            return out

        assert on_thread(calls) == ["pong"] * CALLS
        assert len(srv.requests) == CALLS
        assert srv.connections == 1  # one per call before


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_loop_of_your_own_closes_its_client_when_it_closes(case: Case) -> None:
    # guarantee 334: asyncio.run per call keeps its behaviour (one client, one connection each)
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, provider = agent_for(case, srv)
        for _ in range(3):
            assert asyncio.run(agent.run("ping")).payload == "pong"
            assert clients(provider) == 0
        assert srv.connections == 3
        eventually(lambda: srv.open_connections == 0, "closed")


@has_proc
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.usefixtures("young_heap")
def test_threads_that_end_leave_no_clients_or_sockets(case: Case) -> None:
    # guarantee 335, guarantee 324
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, provider = agent_for(case, srv)
        on_thread(lambda: answers(agent, 2))  # one-time costs (imports, the TLS context)
        eventually(lambda: srv.open_connections == 0, "closed")
        gc.collect()
        baseline = sockets()
        finalizers = len(weakref.finalize._registry)  # type: ignore[attr-defined]
        loops: list[asyncio.AbstractEventLoop] = []

        def worker() -> None:
            assert answers(agent, 3) == ["pong"] * 3
            assert sockets() > baseline  # the connection is open while the thread lives
            loops.append(_sync._local.bridge.loop)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):  # ten threads at a time: a loaded 2-core machine
                threads = [threading.Thread(target=worker) for _ in range(10)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            gc.collect()
            # closed on each thread as it ended, before join() returned
            assert clients(provider) == 0
            assert all(loop.is_closed() for loop in loops) and len(loops) == 30
            eventually(lambda: srv.open_connections == 0, "closed")
            eventually(lambda: sockets() <= baseline, "back to the sockets before")
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
        # nothing still watches a thread's loop or a kept client (each would hold it)
        assert len(weakref.finalize._registry) <= finalizers  # type: ignore[attr-defined]
        assert srv.connections == 1 + 30  # one per thread, not one per call
        assert len(srv.requests) == 2 + 90


@has_proc
@pytest.mark.usefixtures("young_heap")
def test_a_loop_collected_on_a_thread_running_a_loop_still_closes_its_client() -> None:
    # guarantee 335: the last reference to a dead thread's loop dropped on a thread whose own
    # loop is running (as the garbage collector may do), where the dead loop cannot run
    case = CASES[1]
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, provider = agent_for(case, srv)
        gc.collect()
        baseline = sockets()
        held: list[Any] = []

        def worker() -> None:
            assert answers(agent, 2) == ["pong", "pong"]
            held.append(_sync._local.bridge)  # outlives the thread, as a cycle would

        on_thread(worker)
        assert srv.open_connections == 1 and clients(provider) == 1
        loop = held[0].loop

        async def drop() -> None:
            held.clear()  # the bridge's finalizer runs here, inside a running loop

        asyncio.run(drop())
        eventually(lambda: srv.open_connections == 0, "closed")
        eventually(loop.is_closed, "closed")
        eventually(lambda: sockets() <= baseline, "back to the sockets before")
        assert clients(provider) == 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_close_and_aclose_close_the_kept_client(case: Case) -> None:
    # guarantee 337
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, provider = agent_for(case, srv)

        def calls() -> None:
            assert answers(agent, 2) == ["pong", "pong"]
            provider.close()  # from sync code
            assert clients(provider) == 0
            eventually(lambda: srv.open_connections == 0, "closed")
            assert answers(agent, 2) == ["pong", "pong"]  # a new client
            assert srv.connections == 2

            async def close_inside_a_call() -> None:
                await provider.aclose()

            _sync.run_sync(close_inside_a_call(), sync_name="s", async_name="a")
            assert clients(provider) == 0
            eventually(lambda: srv.open_connections == 0, "closed")

        on_thread(calls)
        assert srv.connections == 2


def test_close_from_a_running_loop_is_refused() -> None:
    # guarantee 337
    provider = CASES[1].provider("http://127.0.0.1:9")

    async def inside() -> None:
        provider.close()

    with pytest.raises(RuntimeError, match=r"await OpenAIProvider\.aclose\(\)"):
        asyncio.run(inside())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.usefixtures("young_heap")
def test_a_dropped_provider_is_closed_at_the_next_sync_call(case: Case) -> None:
    # guarantee 337: a long-lived thread that builds an agent per request keeps no pile of
    # clients
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:

        def requests() -> None:
            for n in range(1, 6):
                agent, provider = agent_for(case, srv)
                assert agent("ping").payload == "pong"
                del agent, provider
                gc.collect()  # dropped: the next call's end closes its client
                # at most the client of the call just made (and the one it dropped, while
                # the server has not seen that close yet) is open
                eventually(lambda: srv.open_connections <= 1, "closed")
                assert srv.connections == n

        on_thread(requests)
        eventually(lambda: srv.open_connections == 0, "closed")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_connection_the_server_closed_while_idle_is_not_reused(case: Case) -> None:
    # guarantee 338
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        agent, _ = agent_for(case, srv)

        def calls() -> None:
            for round_ in range(1, 4):
                assert answers(agent, 2) == ["pong", "pong"]
                assert srv.close_idle() == 1  # the server's keep-alive timeout
                eventually(lambda: srv.open_connections == 0, "closed")
                assert srv.connections == round_

        on_thread(calls)
        assert len(srv.requests) == 6  # no retries, no failed attempt


SCRIPT = """
import atexit, os, sys, threading, warnings
from stepstone import Agent, LLMEngine
from stepstone.providers import {cls}

provider = {cls}(base_url=sys.argv[1], api_key="k")
agent = Agent(engine=LLMEngine({model!r}, provider=provider, max_retries=0))

def ping(what):
    env = agent(what)
    assert env.payload == "pong", env.error
"""


def run_script(case: Case, server: LoopbackServer, code: str) -> subprocess.CompletedProcess[str]:
    cls = type(case.provider(server.base_url)).__name__
    script = SCRIPT.format(cls=cls, model=case.model) + textwrap.dedent(code)
    flags = ["-W", "error", "-W", "ignore::DeprecationWarning"]
    return subprocess.run(
        [sys.executable, *flags, "-c", script, server.base_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_main_threads_client_is_closed_at_interpreter_exit(case: Case) -> None:
    # guarantee 335
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        result = run_script(
            case,
            srv,
            """
            import weakref

            def report():
                print("clients left at exit:", len(provider._clients), flush=True)

            # exit-time finalizers run newest first: this one after the loop's
            weakref.finalize(report, report).atexit = True
            ping("one"); ping("two"); ping("three")
            """,
        )
        assert result.stderr == "" and result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["clients left at exit: 0"]
        assert srv.connections == 1 and len(srv.requests) == 3


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_replaced_loop_closes_its_client(case: Case) -> None:
    # guarantee 335, guarantee 326: a new event-loop policy replaces the thread's loop
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        result = run_script(
            case,
            srv,
            """
            import asyncio

            class Policy(asyncio.DefaultEventLoopPolicy):
                pass

            ping("one"); ping("two")
            asyncio.set_event_loop_policy(Policy())
            ping("three")  # closes the old loop, and the client it kept, first
            print("clients", len(provider._clients), flush=True)
            """,
        )
        assert result.stderr == "" and result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["clients 1"]
        assert srv.connections == 2 and len(srv.requests) == 3


FORK = """
ping("parent before fork")
for how in ("exit", "_exit"):
    pid = os.fork()
    if pid == 0:
        ping("child")  # a connection of its own
        print("child", how, "clients", len(provider._clients), flush=True)
        if how == "_exit":
            os._exit(0)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    ping("parent after child " + how)  # its kept connection still works
print("parent done", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_forked_child_never_uses_or_closes_its_parents_client(case: Case) -> None:
    # guarantee 336
    with LoopbackServer(case.dialect(), model=case.model, default="pong") as srv:
        result = run_script(case, srv, FORK)
        assert result.stderr == "" and result.returncode == 0, result.stderr
        # the child sees its own client and its copy of the parent's, which it never closed
        assert result.stdout.splitlines() == [
            "child exit clients 2",
            "child _exit clients 2",
            "parent done",
        ]
        # each child opened a connection of its own: none carried a parent's call (the
        # parent's calls share one, unless a slow machine let its keep-alive expire)
        assert len(srv.requests) == 5
        parent = [r.connection for r in srv.requests if b'"child"' not in r.body]
        children = [r.connection for r in srv.requests if b'"child"' in r.body]
        assert len(children) == 2 and len(set(children)) == 2
        assert not set(children) & set(parent)
