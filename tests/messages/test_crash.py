"""Runs that wait, receive and write, in real subprocesses SIGKILLed and resumed in a new
process, on SQLite and PostgreSQL: a sleep resumes with what is left, a receive's timeout
too, a received message is the same and delivered once, a stream loses and repeats
nothing (guarantees 515, 516, 518)."""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import RunHandle, Store, send
from stepstone.durable import read_run
from stepstone.durable._operations import operation_rows
from tests import _spawn

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.crash


@dataclasses.dataclass(frozen=True, kw_only=True)
class Where:
    """The store the subprocesses use (a SQLite file or a PostgreSQL URL) and the path
    prefix of their kill markers."""

    store: str
    marker: str

    def open(self) -> Store:
        return Store(url=self.store) if "://" in self.store else Store(db=self.store)

    def start(self, mode: str, *args: str, fresh: bool = False) -> _spawn.Process:
        """The worker in a process of its own, forked from the tests' warm server unless
        ``fresh``, once it printed ``ready``."""
        proc = _spawn.Popen(
            [sys.executable, str(WORKER), mode, self.store, self.marker, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            fresh=fresh,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    if request.param == "sqlite":
        yield Where(store=str(tmp_path / "crash.sqlite"), marker=str(tmp_path / "m"))
        return
    url = request.getfixturevalue("pg_url")
    with Store(url=url) as store:
        store.setup()
        for key in store.keys():
            store.delete(key)
    yield Where(store=url, marker=str(tmp_path / "m"))


def _finish(proc: _spawn.Process, timeout: float = 120) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def _kill(proc: _spawn.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def _wait(check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def _ops(store: Store, key: str, op: str) -> list[dict[str, object]]:
    found = read_run(store, key)
    assert found is not None
    return [o for o in operation_rows(*found) if o["op"] == op]


def test_killed_while_sleeping_it_sleeps_only_what_is_left_and_not_again(where: Where) -> None:
    # guarantee 515
    proc = where.start("sleep", "6", fresh=True)  # this family's kill of a fresh interpreter
    with where.open() as store:
        _wait(lambda: bool(store.backend.timers("dozer")))
        (timer,) = store.backend.timers("dozer")
        assert timer.wake_at is not None
        time.sleep(4.0)  # two thirds of the way: 2 s left, a new sleep takes 6
        _kill(proc)
        resumed = where.start("sleep", "6")  # sleeps on, then dies once slept
        resumed_at = time.time()
        code, _ = _finish(resumed)
        assert code == -signal.SIGKILL
        assert time.time() >= timer.wake_at  # not before its wake time
        assert time.time() - resumed_at < 5.0  # the rest of the sleep, not a new one
        (slept,) = _ops(store, "dozer", "sleep")
        assert slept["value"]["wake_at"] == timer.wake_at  # type: ignore[index]
        last = where.start("sleep", "6")  # past its wake time: no sleep
        again = time.monotonic()
        code, out = _finish(last)
        assert code == 0, out
        assert time.monotonic() - again < 5.0
        result = json.loads(out.splitlines()[-1])
        assert result["end"] - result["start"] >= 6.0
        assert store.backend.timers("dozer") == []


def test_killed_while_a_receive_waits_its_timeout_goes_on_from_where_it_was(
    where: Where,
) -> None:
    # guarantee 516: the timeout of a receive is a durable timer
    with where.open() as store:
        proc = where.start("patient", "p-timeout", "6")
        _wait(lambda: bool(store.backend.timers("p-timeout")))
        (timer,) = store.backend.timers("p-timeout")
        assert timer.topic == "in" and timer.wake_at is not None
        time.sleep(4.0)  # 2 s left; a new timeout would take 6
        _kill(proc)
        resumed = where.start("patient", "p-timeout", "6")
        resumed_at = time.time()
        code, out = _finish(resumed)
        assert code == 0, out
        result = json.loads(out.splitlines()[-1])
        assert result["got"] is None  # timed out...
        assert result["returned"] >= timer.wake_at  # ...at the first attempt's deadline,
        assert result["returned"] - resumed_at < 5.0  # not a new one of 6 s
        assert store.backend.timers("p-timeout") == []
        # a message sent while the process was dead is there for the resumed receive
        proc = where.start("patient", "p-mail", "60")
        _wait(lambda: bool(store.backend.timers("p-mail")))
        _kill(proc)
        send(store, "p-mail", "in", {"ok": True})
        resumed = where.start("patient", "p-mail", "60")
        start = time.monotonic()
        code, out = _finish(resumed)
        assert code == 0, out
        assert json.loads(out.splitlines()[-1])["got"] == {"ok": True}
        assert time.monotonic() - start < 30
        (msg,) = store.backend.messages("p-mail")
        assert msg.consumed_at is not None


def test_killed_after_recv_consumed_a_message_it_gets_the_same_one_once(where: Where) -> None:
    # guarantee 516
    proc = where.start("recv")
    with where.open() as store:
        _wait(lambda: bool(store.backend.timers("receiver")))
        send(store, "receiver", "in", {"n": 1})
        code, _ = _finish(proc)  # received, then SIGKILLed before the next receive
        assert code == -signal.SIGKILL
        (first,) = store.backend.messages("receiver")
        assert first.consumed_at is not None  # consumed with the receive's outcome
        send(store, "receiver", "in", {"n": 2})
        code, out = _finish(where.start("recv"))
        assert code == 0, out
        assert json.loads(out.splitlines()[-1]) == [{"n": 1}, {"n": 2}]
        msgs = store.backend.messages("receiver")
        assert [m.consumed_at is not None for m in msgs] == [True, True]
        assert msgs[0].consumed_at == first.consumed_at  # not consumed a second time
        received = _ops(store, "receiver", "recv")
        assert [o["status"] for o in received] == ["done", "done"]


def test_killed_while_writing_a_stream_no_value_is_lost_or_repeated(where: Where) -> None:
    # guarantee 518
    rng = random.Random(7)
    n, cut = 150, []
    with where.open() as store:

        def written() -> int:
            return dict(store.backend.streams("streamer")).get("numbers", 0)

        # killed in the middle of the writes, at random points (as far as the stream has
        # got, whatever the machine's speed), then let finish
        for past in sorted(rng.sample(range(1, n - 20), 3)):
            proc = where.start("stream", str(n))
            _wait(lambda p=past, q=proc: written() >= p or q.poll() is not None)
            if proc.poll() is not None:
                break
            _kill(proc)
            cut.append(written())
    code, out = _finish(where.start("stream", str(n)))
    assert code == 0, out
    assert any(0 < c < n for c in cut), cut
    with where.open() as store:
        values = list(RunHandle(store, key="streamer").read_stream("numbers"))
    assert [(o, v) for o, v in values] == [(i, i) for i in range(n)]
    assert all(item.attempt is None for item in values)  # the body's: journaled


def test_a_receive_in_another_process_wakes_when_the_message_is_sent(where: Where) -> None:
    # guarantee 505: across processes (PostgreSQL's NOTIFY, SQLite's polls), not a timeout
    with where.open() as store:
        proc = where.start("patient", "p-live", "60")
        _wait(lambda: bool(store.backend.timers("p-live")))
        sent = time.time()
        send(store, "p-live", "in", "now")
        code, out = _finish(proc)
        assert code == 0, out
        result = json.loads(out.splitlines()[-1])
        assert result["got"] == "now"
        assert result["returned"] - sent < 5  # (about 0.1 s unloaded: see the benchmark)
