"""Runs that wait, receive and write, in real subprocesses SIGKILLed and resumed in a new
process: a sleep resumes with what is left, a received message is the same and delivered
once, a stream loses and repeats nothing (guarantees 515, 516, 518)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepstone import RunHandle, Store, send

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.crash


def _start(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def _wait(check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_killed_while_sleeping_it_sleeps_only_what_is_left_and_not_again(
    tmp_path: Path,
) -> None:
    # guarantee 515
    db = tmp_path / "sleep.sqlite"
    proc = _start("sleep", str(db), "3")
    with Store(db=db) as store:
        _wait(lambda: bool(store.backend.timers("dozer")))
        (timer,) = store.backend.timers("dozer")
        assert timer.wake_at is not None
        time.sleep(1.0)  # a third of the way
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        resumed = _start("sleep", str(db), "3")  # sleeps on, then dies once slept
        resumed_at = time.time()
        code, _ = _finish(resumed)
        assert code == -signal.SIGKILL
        assert time.time() >= timer.wake_at  # not before its wake time
        assert time.time() - resumed_at < 2.9  # the rest of the sleep, not a new one
        from stepstone.durable import read_run
        from stepstone.durable._operations import operation_rows

        found = read_run(store, "dozer")
        assert found is not None
        (slept,) = [o for o in operation_rows(*found) if o["op"] == "sleep"]
        assert slept["value"]["wake_at"] == timer.wake_at  # the first attempt's wake time
        again = time.monotonic()
        code, out = _finish(_start("sleep", str(db), "3"))  # past its wake time: no sleep
        assert code == 0, out
        assert time.monotonic() - again < 2.9  # (the process's start included)
        result = json.loads(out.splitlines()[-1])
        assert result["end"] - result["start"] >= 3.0
        assert store.backend.timers("dozer") == []


def test_killed_after_recv_consumed_a_message_it_gets_the_same_one_once(tmp_path: Path) -> None:
    # guarantee 516
    db = tmp_path / "recv.sqlite"
    proc = _start("recv", str(db))
    with Store(db=db) as store:
        _wait(lambda: bool(store.backend.timers("receiver")))
        send(store, "receiver", "in", {"n": 1})
        code, _ = _finish(proc)  # received, then SIGKILLed before the next receive
        assert code == -signal.SIGKILL
        (first,) = store.backend.messages("receiver")
        assert first.consumed_at is not None  # consumed with the receive's outcome
        send(store, "receiver", "in", {"n": 2})
        code, out = _finish(_start("recv", str(db)))
        assert code == 0, out
        assert json.loads(out.splitlines()[-1]) == [{"n": 1}, {"n": 2}]
        msgs = store.backend.messages("receiver")
        assert [m.consumed_at is not None for m in msgs] == [True, True]
        assert msgs[0].consumed_at == first.consumed_at  # not consumed a second time


def test_killed_while_writing_a_stream_no_value_is_lost_or_repeated(tmp_path: Path) -> None:
    # guarantee 518
    db = tmp_path / "stream.sqlite"
    rng = random.Random(7)
    n, cut = 150, []
    for _kill in range(4):  # killed at random points, then let finish
        proc = _start("stream", str(db), str(n))
        try:
            proc.communicate(timeout=rng.uniform(0.1, 0.6))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            with Store(db=db) as store:
                cut.append(dict(store.backend.streams("streamer")).get("numbers", 0))
        else:
            break
    code, out = _finish(_start("stream", str(db), str(n)))
    assert code == 0, out
    assert any(0 < c < n for c in cut), cut  # killed in the middle of the writes
    with Store(db=db) as store:
        values = list(RunHandle(store, key="streamer").read_stream("numbers"))
    assert [(o, v) for o, v in values] == [(i, i) for i in range(n)]
    assert all(item.attempt is None for item in values)  # the body's: journaled
