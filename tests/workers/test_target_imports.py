"""Where a worker imports the modules its queued runs name: on the thread that called
``run()`` (the main thread for ``stepstone worker``), not on the thread its runs execute
on, so a module that installs signal handlers at import works under a worker."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepstone import QueuedRunError, Store, Worker, submit

MODULE = """
import signal, threading

from stepstone import Plan, Step

IMPORTED_ON = threading.current_thread().name
signal.signal(signal.SIGUSR1, lambda *_: None)  # allowed only on the main thread


def where(payload):
    return {"imported_on": IMPORTED_ON, "ran_on": threading.current_thread().name}


plan = Plan(Step(where))
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module no one imported yet, importable by name."""
    name = f"signal_target_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.getsignal(signal.SIGUSR1)
    yield name
    signal.signal(signal.SIGUSR1, previous)
    sys.modules.pop(name, None)


def test_a_target_module_that_sets_signal_handlers_at_import_runs(
    module: str, tmp_path: Path
) -> None:
    # guarantee 224
    assert module not in sys.modules
    with Store(db=tmp_path / "q.sqlite") as store:
        handle = submit(store, f"{module}:plan", "go")
        assert Worker(store, poll_interval=0.05).run(until_idle=True) == 1
        env = handle.result(timeout=5)
    assert env.ok, env.error
    assert env.payload["imported_on"] == threading.main_thread().name
    assert env.payload["ran_on"] != threading.main_thread().name  # the runs' own thread


def test_an_import_that_fails_on_the_calling_thread_fails_its_run_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guarantee 224: the error comes back to the run, and the worker runs the next one
    (tmp_path / "broken_target_mod.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with Store(db=tmp_path / "q.sqlite") as store:
        bad = submit(store, "broken_target_mod:plan", "go")
        (tmp_path / "needy_target_mod.py").write_text("import no_such_package_for_stepstone\n")
        needy = submit(store, "needy_target_mod:plan", "go")
        (tmp_path / "fine_target_mod.py").write_text(
            "from stepstone import Plan, Step\nplan = Plan(Step(lambda p: 'ok', name='s'))\n"
        )
        good = submit(store, "fine_target_mod:plan", "go")
        assert Worker(store, poll_interval=0.05).run(until_idle=True) == 1
        assert bad.status() == "failed"
        with pytest.raises(QueuedRunError, match=r"no config.*code failed: fix it"):
            bad.result(timeout=1)
        with pytest.raises(QueuedRunError, match=r"no_such_package_for_stepstone.*fix it"):
            needy.result(timeout=1)  # a package its code imports is missing, not the module
        assert good.result(timeout=5).payload == "ok"
    for name in ("broken_target_mod", "needy_target_mod", "fine_target_mod"):
        sys.modules.pop(name, None)
