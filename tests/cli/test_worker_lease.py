"""``stepstone worker --lease-seconds N``: the runs it takes hold their checkpoints with a
lease of N too, so a run whose worker stopped renewing for N seconds is taken over then."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepstone import Store, submit
from stepstone.cli import app
from stepstone.durable import run_head
from tests.workers.targets import task


@pytest.mark.parametrize("lease", ["7", "45"])
def test_the_checkpoint_lease_is_the_workers(tmp_path: Path, lease: str) -> None:
    # guarantee 239, 242: the queue entry's lease and the checkpoint's run out together
    db = tmp_path / "q.sqlite"
    with Store(db=db) as store:
        h = submit(store, "tests.workers.targets:make_plan", task(str(tmp_path / "log"), "c"))
    result = CliRunner().invoke(
        app, ["worker", "--db", str(db), "--until-idle", "--lease-seconds", lease]
    )
    assert result.exit_code == 0, result.output
    with Store(db=db, read_only=True) as store:
        head = run_head(store, h.key)
    assert head is not None and head.status == "done"
    # the run's last commit set its lease on the database's clock: now + the lease
    assert head.lease_until - head.updated_at == pytest.approx(float(lease))
