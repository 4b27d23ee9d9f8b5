"""What a thread's private sync-call loop keeps open across calls (``keep_open``): closed
when the loop closes, even when closing one of them fails or hangs."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from stepstone.core import _sync


class Owner:
    """What a kept resource belongs to (a provider, in the adapters)."""


def keep_on_a_thread(owner: Owner, aclose: Callable[[], Awaitable[object]]) -> list[Any]:
    """On a new thread that then ends: one sync call that keeps ``aclose``; what
    ``keep_open`` returned and the thread's loop."""
    out: list[Any] = []

    async def body() -> None:
        out.append(_sync.keep_open(owner, aclose))
        out.append(asyncio.get_running_loop())

    def target() -> None:
        _sync.run_sync(body(), sync_name="call()", async_name="acall()")

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return out


def test_only_a_private_loop_keeps_anything() -> None:
    # guarantee 334
    async def inside_a_loop_of_your_own() -> object:
        return _sync.keep_open(Owner(), asyncio.sleep)

    assert asyncio.run(inside_a_loop_of_your_own()) is None
    closed: list[str] = []

    async def aclose() -> None:
        closed.append("closed")

    owner = Owner()
    resource, loop = keep_on_a_thread(owner, aclose)
    assert isinstance(resource, _sync.LoopResource)
    assert closed == ["closed"] and loop.is_closed()  # when the thread ended


def test_a_failing_or_hanging_close_never_stops_the_loop_closing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guarantee 339
    monkeypatch.setattr(_sync, "_CLOSE_TIMEOUT", 0.5)

    async def fails() -> None:
        raise OSError("the connection was already gone")

    async def hangs() -> None:
        await asyncio.Event().wait()

    for aclose, error in ((fails, "already gone"), (hangs, "not closed within 0.5 s")):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            owner = Owner()
            _, loop = keep_on_a_thread(owner, aclose)
        assert loop.is_closed()
        messages = [r.getMessage() for r in caplog.records]
        assert any("kept open across sync calls" in m for m in messages), messages
        assert any(error in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
    # logged from a thread threading knows: the ended thread left no dummy thread behind
    # (one stays in threading.enumerate() for good, and fails to clean up at exit on 3.13)
    assert not any(isinstance(t, threading._DummyThread) for t in threading.enumerate())
