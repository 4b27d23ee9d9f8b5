"""The SQLite store's connections: one per thread, closed when the thread ends (guarantee
392). Kept until the store closed, a process that used one store from many short-lived
threads (a thread per request; an event loop with its executor per sync call) held two
file descriptors per thread that had ever touched it, until it ran out of them."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from stepstone import Agent, Plan, RunHandle, Step, Store, submit


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_short_lived_threads_leave_no_connection_open(tmp_path: Path) -> None:
    # guarantee 392
    store = Store(db=tmp_path / "s.sqlite")
    store.write("k", 0)
    handle = submit(store, "tests.workers.targets:plan", "{}")
    assert RunHandle(store, handle.id).status() == "queued"
    plan = Plan(Step(lambda p: "done", name="s"), store=store, checkpoint_key="run")
    assert Agent(engine=plan)("go").ok  # (this thread keeps its sync calls' loop open)
    before = open_files()

    def use(i: int) -> None:
        store.write(f"t{i}", i)
        assert store.read("k") == 0
        assert RunHandle(store, handle.id).status() == "queued"  # the queue's connection
        plan = Plan(Step(lambda p: "done", name="s"), store=store, checkpoint_key=f"run{i}")
        assert Agent(engine=plan)("go").ok

    for i in range(150):
        thread = threading.Thread(target=use, args=(i,))
        thread.start()
        thread.join()
    for i in range(150):  # a sync call's own loop, whose executor threads end with it
        assert asyncio.run(store.aread(f"t{i}")) == i
    assert open_files() <= before + 2  # not 2 per thread and store: 600 more before
    assert len(store.keys(prefix="t")) == 150
    assert len(store.keys(prefix="run")) == 151
    store.close()


def test_closing_the_store_closes_every_threads_connection(tmp_path: Path) -> None:
    # guarantee 392: threads still alive too
    before = open_files()
    store = Store(db=tmp_path / "s.sqlite")
    started, release = threading.Barrier(5), threading.Event()

    def hold() -> None:
        store.write(threading.current_thread().name, 1)
        started.wait()
        release.wait()

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    assert open_files() >= before + 8  # each thread's database and WAL files
    store.close()
    assert open_files() <= before + 1  # (the WAL tender may keep its file until collected)
    release.set()
    for thread in threads:
        thread.join()
    with Store(db=tmp_path / "s.sqlite") as again:
        assert len(again.keys()) == 4


def test_a_forked_child_uses_the_store_and_the_parent_goes_on(tmp_path: Path) -> None:
    # guarantee 392: the child opens its own connection and never closes its parent's
    store = Store(db=tmp_path / "s.sqlite")
    store.write("parent", 1)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            store.write("child", 2)
            code = 0 if store.read("parent") == 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.write("parent-again", 3)
    assert store.read("child") == 2
    assert sorted(store.keys()) == ["child", "parent", "parent-again"]
    store.close()
