"""Sync calls (``agent("task")`` and every other sync API) on the thread's reused event loop.

Each test runs its coroutine through a public sync call, ``agent("go")`` on an engine that
awaits the coroutine function it is given. Crossing a process boundary (Ctrl-C, fork,
interpreter exit) is tested in real subprocesses.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from stepstone import Agent, Envelope, Plan, RunContext, Step
from stepstone.core._sync import _policy, may_block_loop

ROOT = Path(__file__).resolve().parents[2]


class Body:
    """An engine whose run awaits one coroutine function: whatever a sync call's
    coroutine does."""

    def __init__(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self.fn = fn

    async def run(self, env: Envelope[Any], ctx: RunContext) -> Envelope[Any]:
        return Envelope(task=env.task, payload=await self.fn())


def call(fn: Callable[[], Awaitable[Any]]) -> Any:
    """``fn()`` awaited inside one sync call; its result."""
    return Agent(engine=Body(fn), name="body")("go").payload


async def here() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The call's loop and the thread its executor ran a job on."""
    return asyncio.get_running_loop(), await asyncio.to_thread(threading.current_thread)


def run_script(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (warnings are errors, as in the test suite)."""
    script = textwrap.dedent(BODY) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-W", "error", "-W", "ignore::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


BODY = """
    import asyncio, os, sys, threading
    from typing import Any
    from stepstone import Agent, Envelope

    class Body:
        def __init__(self, fn):
            self.fn = fn

        async def run(self, env, ctx):
            return Envelope(task=env.task, payload=await self.fn())

    def call(fn):
        return Agent(engine=Body(fn), name="body")("go").payload
"""


def test_calls_of_one_thread_share_one_loop_current_only_during_the_call() -> None:
    # guarantee 320
    async def current() -> bool:
        policy = _policy()
        return policy.get_event_loop() is asyncio.get_running_loop()

    loop, worker = call(here)
    again, worker_again = call(here)
    assert again is loop and not loop.is_closed()
    assert worker is not threading.current_thread() and worker.name.startswith("asyncio")
    assert worker_again.name.startswith("asyncio")
    assert call(current) is True
    # as after asyncio.run: the thread has no current loop between calls
    with pytest.raises(RuntimeError, match="no current event loop"):
        _policy().get_event_loop()

    seen: list[asyncio.AbstractEventLoop] = []
    thread = threading.Thread(target=lambda: seen.append(call(here)[0]))
    thread.start()
    thread.join()
    assert seen[0] is not loop  # every thread has its own


def test_a_loop_whose_executor_was_shut_down_is_replaced() -> None:
    # guarantee 323
    async def shut_down() -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        await loop.shutdown_default_executor()  # code that treats the loop as its own
        return loop

    loop = call(shut_down)
    assert call(here)[0] is not loop  # a working loop, with a working executor
    assert loop.is_closed()


def test_a_sync_call_inside_a_running_loop_is_refused() -> None:
    # guarantee 322
    ran: list[bool] = []

    async def body() -> None:
        ran.append(True)

    async def main() -> None:
        with pytest.raises(RuntimeError) as info:
            Agent(engine=Body(body), name="body")("go")
        assert str(info.value) == (
            "body(...) was called from inside a running event loop, where it would block the "
            "loop; use `await body.run(...)` instead"
        )

    asyncio.run(main())
    assert ran == []  # and the coroutine was closed: no "never awaited" warning (an error here)


def test_tasks_left_pending_are_cancelled_and_awaited_before_the_call_returns() -> None:
    # guarantee 320
    events: list[str] = []
    left: list[asyncio.Task[None]] = []

    async def forever(name: str) -> None:
        try:
            events.append(f"{name} started")
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append(f"{name} cancelled")
            await asyncio.sleep(0.01)  # clean-up that awaits is awaited too
            events.append(f"{name} cleaned up")
            raise

    async def body() -> str:
        left.append(asyncio.create_task(forever("a")))
        await asyncio.sleep(0)
        left.append(asyncio.create_task(forever("never started")))
        left[1].cancel()  # a task cancelled before it ever ran
        left.append(asyncio.create_task(forever("b")))
        await asyncio.sleep(0)
        return "done"

    assert call(body) == "done"
    assert all(task.cancelled() for task in left)
    assert sorted(events) == sorted(
        ["a started", "a cancelled", "a cleaned up", "b started", "b cancelled", "b cleaned up"]
    )
    assert call(here)[0] is left[0].get_loop()  # the same loop, and nothing resumed
    assert len(events) == 6


def test_async_generators_left_open_are_closed_before_the_call_returns() -> None:
    # guarantee 320
    closed: list[int] = []
    kept: list[Any] = []

    async def numbers() -> Any:
        try:
            for i in range(10):
                yield i
        finally:
            await asyncio.sleep(0)
            closed.append(len(kept))

    async def body() -> int:
        gen = numbers()
        kept.append(gen)  # still referenced: only the end of the call closes it
        first: int = await gen.__anext__()
        return first

    assert call(body) == 0
    assert closed == [1]
    assert call(body) == 0
    assert closed == [1, 2]


def test_executor_jobs_started_by_a_call_finish_before_it_returns() -> None:
    # guarantee 320
    started, finished = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    kept: list[asyncio.Task[None]] = []

    async def body() -> str:
        kept.append(asyncio.create_task(asyncio.to_thread(slow)))
        while not started.is_set():  # a busy machine may start the job late
            await asyncio.sleep(0.001)
        return "returned"  # the job is running; its awaiting task is then cancelled

    assert call(body) == "returned"
    assert finished.is_set()


def test_timers_and_signal_handlers_a_call_left_never_fire_later() -> None:
    # guarantee 320
    fired: list[str] = []

    async def body() -> str:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, fired.append, "timer")
        loop.add_signal_handler(signal.SIGUSR1, fired.append, "signal")
        return "ok"

    async def later() -> list[str]:
        await asyncio.sleep(0.2)
        return fired

    assert call(body) == "ok"
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # removed with the call
    assert call(later) == []


def test_an_exception_in_a_left_task_is_reported_on_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # guarantee 320
    async def sulky() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ValueError("refused to stop") from None

    kept: list[asyncio.Task[None]] = []

    async def body() -> str:
        kept.append(asyncio.create_task(sulky()))
        await asyncio.sleep(0)
        return "ok"

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert call(body) == "ok"
    assert "unhandled exception in a task left running by body(...)" in caplog.text
    assert "refused to stop" in caplog.text


def test_each_call_runs_in_a_copy_of_the_callers_context() -> None:
    # guarantee 321
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def read() -> str:
        return var.get()

    async def body() -> str:
        seen = var.get()
        var.set("set inside")
        return seen + " / " + await asyncio.create_task(read())  # tasks copy the call's

    token = var.set("caller")
    try:
        assert call(body) == "caller / set inside"
        assert var.get() == "caller"
        var.set("caller again")
        assert call(body) == "caller again / set inside"  # not the first call's value
    finally:
        var.reset(token)
    assert call(body) == "unset / set inside"


def test_an_exception_leaves_the_loop_usable() -> None:
    # guarantee 323
    left: list[asyncio.Task[None]] = []

    async def boom() -> None:
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        await asyncio.sleep(0)
        raise ValueError("boom")

    loop = call(here)[0]
    with pytest.raises(ValueError, match="boom"):
        call(boom)
    assert left[0].cancelled()
    assert call(here)[0] is loop


def test_a_keyboard_interrupt_leaves_the_loop_usable() -> None:
    # guarantee 323
    left: list[asyncio.Task[None]] = []

    async def interrupted() -> None:
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        await asyncio.to_thread(time.sleep, 0.01)
        raise KeyboardInterrupt

    loop = call(here)[0]
    with pytest.raises(KeyboardInterrupt):
        call(interrupted)
    assert left[0].cancelled()
    assert call(here)[0] is loop


def test_a_clean_up_cut_short_is_finished_by_the_next_call() -> None:
    # guarantee 323
    events: list[str] = []
    left: list[asyncio.Task[None]] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None  # Ctrl-C during the clean-up

    async def patient() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            events.append("patient stopped")

    async def body() -> str:
        left.append(asyncio.create_task(stubborn()))
        left.append(asyncio.create_task(asyncio.sleep(0.05)))
        left.append(asyncio.create_task(patient()))
        await asyncio.sleep(0)
        return "first"

    loop = call(here)[0]
    with pytest.raises(KeyboardInterrupt):
        call(body)

    async def second() -> list[bool]:
        return [task.done() for task in left]

    assert call(second) == [True, True, True]  # finished before the second call's coroutine
    assert left[2].cancelled() and events == ["patient stopped"]
    assert call(here)[0] is loop


def test_a_keyboard_interrupt_in_run_many_leaves_the_next_call_working() -> None:
    # guarantee 323: the clean-up the interrupt cut short stays pending, and used to cancel
    # the next call's clean-up as one more task of the call it was cleaning (the next sync
    # call on the thread raised a bare CancelledError)
    script = textwrap.dedent(
        """
        from stepstone import Agent, Plan, Step

        def interrupted(_):
            raise KeyboardInterrupt

        try:
            Plan(Step(interrupted)).run_many(["a", "b"])
        except KeyboardInterrupt:
            print("interrupted")
        print(Agent(engine=Plan(Step(lambda p: p, name="echo")))("next").payload)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "interrupted\nnext\n"), done.stderr


def test_ctrl_c_cancels_the_call_and_the_next_call_works() -> None:
    # guarantee 323
    with subprocess.Popen(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(BODY) + textwrap.dedent(CTRL_C)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # Ctrl-C as a terminal delivers it, also when the suite runs as a background job
        # (whose children inherit SIGINT ignored, and Python then installs no handler)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "waiting\n"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert err == ""
    assert out.splitlines() == [
        "cancelled inside: True",
        "KeyboardInterrupt",
        "default handler back: True",
        "again",
    ]


CTRL_C = """
    import signal

    async def wait() -> None:
        print("waiting", flush=True)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            print("cancelled inside: True", flush=True)
            raise

    try:
        call(wait)
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    print("default handler back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)

    async def again() -> str:
        return await asyncio.to_thread(lambda: "again")

    print(call(again), flush=True)
"""


def test_may_block_loop_counts_the_tasks_of_the_current_call_only() -> None:
    # guarantee 328
    kept: list[asyncio.Task[None]] = []

    async def body() -> tuple[bool, bool]:
        alone = may_block_loop()
        kept.append(asyncio.create_task(asyncio.sleep(3600)))  # cancelled at the end
        await asyncio.sleep(0)
        return alone, may_block_loop()

    assert call(body) == (True, False)
    assert call(body) == (True, False)  # the first call's cancelled task is not counted

    async def on_own_loop() -> bool:
        return may_block_loop()

    assert asyncio.run(on_own_loop()) is False  # a loop of the user's own


def test_a_sync_step_runs_on_the_calling_thread_after_a_call_that_left_tasks() -> None:
    # guarantee 328
    kept: list[asyncio.Task[None]] = []

    async def messy() -> None:
        for _ in range(3):
            kept.append(asyncio.create_task(asyncio.sleep(3600)))
        await asyncio.sleep(0)

    def step(_: Any) -> int:
        return threading.get_ident()

    plan = Agent(engine=Plan(Step(step, name="where")))
    call(messy)
    assert plan("go").payload == threading.get_ident()  # inline: the call's only task
    assert asyncio.run(plan.run("go")).payload != threading.get_ident()  # a worker thread


def test_loop_bound_objects_work_in_later_calls_of_the_same_thread() -> None:
    # guarantee 327
    made: dict[str, Any] = {}

    async def contend() -> int:
        lock: asyncio.Lock = made["lock"]
        queue: asyncio.Queue[int] = made["queue"]

        async def hold() -> None:
            async with lock:
                await asyncio.sleep(0.01)

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        async with lock:  # waits: binds the lock to this loop
            pass
        await holder
        getter = asyncio.create_task(queue.get())  # waits: binds the queue
        await asyncio.sleep(0)
        queue.put_nowait(len(made))
        got: int = await getter
        return got

    async def first() -> int:
        made.update(lock=asyncio.Lock(), queue=asyncio.Queue())
        return await contend()

    assert call(first) == 2
    assert call(contend) == 2  # under asyncio.run: "bound to a different event loop"

    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            call(contend)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "bound to a different event loop" in str(errors[0])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_a_thread_that_ends_closes_its_loop_and_executor() -> None:
    # guarantee 324
    loops: list[asyncio.AbstractEventLoop] = []
    workers: list[threading.Thread] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(2):
            loop, job_thread = call(here)
            with lock:
                loops.append(loop)
                workers.append(job_thread)

    def run_threads(n: int) -> None:
        for start in range(0, n, 10):  # ten at a time: a loaded 2-core machine
            threads = [threading.Thread(target=worker) for _ in range(min(10, n - start))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    run_threads(1)  # the process's one-time costs (the loop policy...)
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_threads(50)
        gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert len(loops) == 102 and len({id(loop) for loop in loops}) == 51
    assert all(loop.is_closed() for loop in loops)
    assert not any(t.is_alive() for t in workers)  # the executors' threads were joined


def test_a_thread_that_ends_leaves_no_thread_in_threading_enumerate() -> None:
    # guarantee 324: its loop is closed on the ending thread after threading forgot it;
    # joining the executor's threads there registered a dummy thread in its place, which
    # stayed in threading.enumerate() (and on 3.13 failed to go at interpreter exit)
    call(here)  # this thread's own loop and executor, started before the count
    before = set(threading.enumerate())
    for _ in range(3):  # one at a time: a new thread could take an ended one's ident
        thread = threading.Thread(target=call, args=(here,))
        thread.start()
        thread.join()
    assert [t.name for t in threading.enumerate() if t not in before] == []


def test_the_loop_comes_from_the_policy_and_the_main_loop_closes_at_exit() -> None:
    # guarantee 326, guarantee 324
    result = run_script(
        """
        class LoopA(asyncio.SelectorEventLoop):
            def close(self) -> None:
                if not self.is_closed():
                    print("closed", type(self).__name__, flush=True)
                super().close()

        class LoopB(LoopA):
            pass

        class PolicyA(asyncio.DefaultEventLoopPolicy):
            def new_event_loop(self) -> asyncio.AbstractEventLoop:
                return LoopA()

        class PolicyB(asyncio.DefaultEventLoopPolicy):
            def new_event_loop(self) -> asyncio.AbstractEventLoop:
                return LoopB()

        async def kind() -> str:
            job = await asyncio.to_thread(lambda: threading.current_thread().name)
            return type(asyncio.get_running_loop()).__name__ + " " + job.split("_")[0]

        asyncio.set_event_loop_policy(PolicyA())
        print(call(kind), flush=True)
        print(call(kind), flush=True)
        asyncio.set_event_loop_policy(PolicyB())
        print(call(kind), flush=True)
        print("end of script", flush=True)
        """
    )
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "LoopA asyncio",
        "LoopA asyncio",
        "closed LoopA",  # replaced at the first call under the new policy
        "LoopB asyncio",
        "end of script",
        "closed LoopB",  # at interpreter exit
    ]


def test_a_forked_child_never_uses_its_parents_loop() -> None:
    # guarantee 325
    result = run_script(FORK)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "fork child: fresh loop True, inherited loop closed here True, parent pid False",
        "child forked inside a call: fresh loop True, exit 0",
        "os.fork child: fresh loop True, exit 0",
        "parent: loop unchanged True, 40 calls after the children",
    ]


FORK = """
    import multiprocessing

    async def hop():
        # a thread job: its result wakes the loop through the self-pipe
        return asyncio.get_running_loop(), await asyncio.to_thread(os.getpid)

    main_loop, _ = call(hop)
    side = {}

    def side_thread(stop):  # another thread with a loop of its own, alive across the forks
        side["loop"] = call(hop)[0]
        while not stop.is_set():
            assert call(hop)[0] is side["loop"]

    stop = threading.Event()
    other = threading.Thread(target=side_thread, args=(stop,))
    other.start()

    def child(conn):
        loops = {id(call(hop)[0]) for _ in range(20)}
        loop, pid = call(hop)
        conn.send((loop is not main_loop and len(loops) == 1, main_loop.is_closed(), pid))
        conn.close()

    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    process = ctx.Process(target=child, args=(writer,))
    process.start()
    for _ in range(50):  # the parent's calls while the child makes its own
        call(hop)
    fresh, inherited_closed, pid = reader.recv()
    process.join(60)
    assert process.exitcode == 0
    print(
        f"fork child: fresh loop {fresh}, inherited loop closed here {inherited_closed}, "
        f"parent pid {pid == os.getpid()}",
        flush=True,
    )

    # a child forked from inside a sync call (a step starting a process)
    async def start_child():
        reader, writer = ctx.Pipe(duplex=False)
        process = ctx.Process(target=child, args=(writer,))
        process.start()
        got = await asyncio.to_thread(reader.recv)
        await asyncio.to_thread(process.join, 60)
        return got, process.exitcode

    (fresh, _, pid), exitcode = call(start_child)
    print(f"child forked inside a call: fresh loop {fresh}, exit {exitcode}", flush=True)

    # a child that exits normally: atexit handlers and the collection of every object run
    pid = os.fork()
    if pid == 0:
        code = 0 if call(hop)[0] is not main_loop else 3
        sys.stdout.flush()
        sys.exit(code)
    _, status = os.waitpid(pid, 0)
    print(
        f"os.fork child: fresh loop True, exit {os.waitstatus_to_exitcode(status)}", flush=True
    )

    for _ in range(40):  # would hang if a child had unregistered the self-pipe
        loop, got = call(hop)
        assert got == os.getpid()
    stop.set()
    other.join(60)
    assert not other.is_alive()
    print(f"parent: loop unchanged {loop is main_loop}, 40 calls after the children", flush=True)
"""


NESTED: contextvars.ContextVar[str] = contextvars.ContextVar("nested", default="unset")


def test_a_sync_step_may_call_an_agent_synchronously(tmp_path: Path) -> None:
    # guarantee 329: inline (agent("go"), nothing else on the loop) and in worker threads
    # (run_many), with the step's context seen by the nested call
    from stepstone import Store

    inner = Agent(engine=Plan(Step(lambda x: x + 1, name="inc")))
    seen: list[tuple[str, bool]] = []

    def uses_inner(x: int) -> int:
        def probe(y: int) -> int:
            seen.append((NESTED.get(), threading.current_thread() is threading.main_thread()))
            return y

        env = Agent(engine=Plan(Step(probe, name="probe")))(Envelope(task="t", payload=x))
        return int(inner(Envelope(task="t", payload=env.payload)).payload) * 10

    with Store(db=tmp_path / "s.sqlite") as store:
        outer = Agent(engine=Plan(Step(uses_inner, name="outer"), store=store, checkpoint_key="o"))
        NESTED.set("from the caller")
        env = outer(Envelope(task="t", payload=1))
        assert env.ok, env.error
        assert env.payload == 20
        assert seen == [("from the caller", False)]  # ran on a thread of its own
        plan = Plan(
            Step(uses_inner, name="outer"), store=store, checkpoint_key="m", on_concurrent="fork"
        )
        envs = plan.run_many([Envelope(task="t", payload=i) for i in range(4)], concurrency=2)
        assert [e.payload for e in envs] == [10, 20, 30, 40]


def test_a_nested_sync_call_hands_its_exception_to_the_step() -> None:
    # guarantee 329
    def boom(_x: Any) -> Any:
        raise ValueError("inner failure")

    inner = Agent(engine=Plan(Step(boom, name="boom")))
    caught: list[str] = []

    def calls_inner(x: Any) -> str:
        env = inner(Envelope(task="t", payload=x))
        assert env.error is not None
        caught.append(env.error.message)
        raise KeyError("outer failure")

    env = Agent(engine=Plan(Step(calls_inner, name="outer")))(Envelope(task="t", payload=0))
    assert caught == ["inner failure"]
    assert env.error is not None and "outer failure" in env.error.message


def test_async_code_calling_a_sync_agent_is_still_refused() -> None:
    # guarantee 329 (and 322): only sync code running inline may nest a sync call
    inner = Agent(engine=Plan(Step(lambda x: x, name="same")))

    async def async_step(x: Any) -> Any:
        return inner(Envelope(task="t", payload=x)).payload

    env = Agent(engine=Plan(Step(async_step, name="a")))(Envelope(task="t", payload=1))
    assert env.error is not None and env.error.type == "RuntimeError"
    assert "await agent.run(...)" in env.error.message
