"""Under CI=true nothing CI installs is allowed to be missing: a PostgreSQL, browser or
full-disk test that would skip on a developer's machine fails there instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._missing import missing
from tests.operate._browser import chromium_or_skip

ROOT = Path(__file__).resolve().parent.parent


def test_a_missing_requirement_skips_locally_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no server here"):
        missing("the server tests", "no server here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but the server tests cannot run"):
        missing("the server tests", "no server here")


def test_a_missing_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    nowhere = str(tmp_path / "chromium")
    with pytest.raises(pytest.fail.Exception, match=f"no Chromium at {nowhere}"):
        chromium_or_skip(nowhere)


PROBE = """
import pytest

@pytest.mark.postgres
def test_marked():
    pytest.skip("the server went missing")

def test_with_a_server(pg_server):
    pass

def test_other():
    pytest.skip("nothing CI installs")

@pytest.mark.postgres
@pytest.mark.xfail(reason="expected", strict=True)
def test_expected_failure():
    raise AssertionError
"""

CONFTEST = """
import pytest
from tests.conftest import pytest_runtest_makereport  # the hook under test

@pytest.fixture
def pg_server():
    pytest.skip("no PostgreSQL binaries")
"""


@pytest.mark.parametrize("ci", [False, True])
def test_a_skipped_postgres_test_fails_under_ci(tmp_path: Path, ci: bool) -> None:
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST), encoding="utf-8")
    options = ["-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "markers=postgres"]
    options += ["-o", "asyncio_default_fixture_loop_scope=function"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CI": "true" if ci else "false"},
        timeout=120,
    )
    if ci:  # the marked test and the one using the server fail (the latter in its set-up)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1 failed, 1 skipped, 1 xfailed, 1 error" in done.stdout, done.stdout
        assert "CI=true but this test skipped: the server went missing" in done.stdout
        assert "CI=true but this test skipped: no PostgreSQL binaries" in done.stdout
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "3 skipped, 1 xfailed" in done.stdout, done.stdout
