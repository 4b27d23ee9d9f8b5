"""Shared fixtures: a real PostgreSQL server for the tests marked ``postgres``.

``pg_server`` starts one throwaway server per test session (see ``tests/pgserver.py``);
``pg_url`` gives each test module its own database on it. Without the server binaries the
tests skip locally, but fail when ``CI=true``: CI must never silently skip them.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._missing import in_ci, missing
from tests.pgserver import CutProxy, PgServer, unavailable_reason


def pg_server_or_skip() -> PgServer:
    """A started server, or skip (fail under CI) when none can run here."""
    reason = unavailable_reason()
    if reason is not None:
        missing("PostgreSQL tests", reason)
    server = PgServer()
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


def _served() -> Iterator[PgServer]:
    server = pg_server_or_skip()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole session."""
    yield from _served()


@pytest.fixture
def cut_proxy(pg_server: PgServer) -> Iterator[CutProxy]:
    """A proxy in front of the session's server that cuts a connection on cue."""
    proxy = CutProxy(pg_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def own_pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server of this test module's own, for tests that stop, crash or restart
    it (doing that to the session's server would disturb other modules)."""
    yield from _served()


@pytest.fixture
def own_pg_url(own_pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A ``postgresql://`` URL of a fresh database for this test on the module's own server."""
    name = "o_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    url = own_pg_server.create_database(name)
    yield url
    own_pg_server.drop_database(name)


@pytest.fixture(scope="module")
def pg_url(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A ``postgresql://`` URL of a fresh database for this test module."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.module.__name__.lower())[-50:]
    url = pg_server.create_database(name)
    try:
        yield url
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's, driven by Playwright): a test opens a fresh context of
    it (``new_context()``). Skips without Chromium, fails under CI=true. One per test, not
    per session: while Playwright's sync API is started it marks its event loop as running
    on the thread, and a later test's sync call (``run_sync()``) would refuse to run."""
    from tests.operate._browser import launch

    yield from launch()


class SmallDisk:
    """A tmpfs of its own: a disk that really fills (``ENOSPC``), and grows on request."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    """A 2 MB tmpfs, removed afterwards; skipped where mounting one is not allowed (it
    needs root and mount(8)), failed there under CI=true."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        missing("a test on a full disk", "a tmpfs needs root and mount(8)")
    where = Path(tempfile.mkdtemp(prefix="stepstone-small-", dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        where.rmdir()
        missing("a test on a full disk", f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=False)
        where.rmdir()


#: The fixtures that need something CI installs: a test using one must not skip there.
NEEDS_CI_INSTALLS = frozenset(
    {"pg_server", "pg_url", "own_pg_server", "own_pg_url", "cut_proxy", "chromium", "small_disk"}
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under CI=true a PostgreSQL test (marked ``postgres``), a browser test or a full-disk
    test that skips, for whatever reason, fails instead: CI installs what they need."""
    report: pytest.TestReport = yield
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        needs = item.get_closest_marker("postgres") is not None or bool(
            NEEDS_CI_INSTALLS.intersection(getattr(item, "fixturenames", ()))
        )
        if needs:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            reason = str(reason).removeprefix("Skipped: ")
            report.outcome = "failed"
            report.longrepr = f"CI=true but this test skipped: {reason}"
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Run the finalizers of the session's garbage (stores, pools) before the terminal
    summary. The hypothesis plugin imports its modules only then, when no test imported
    them, and pytest rewrites them with ``ast``; on Python 3.11 before 3.11.8 a garbage
    collection that runs finalizers in the middle of that fails the whole run with
    "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905)."""
    gc.collect()
