"""Graph checkpoints over PostgreSQL through StoreCheckpointer (same kernel, same records)."""

from __future__ import annotations

import pytest

from stepstone import Store
from stepstone.graph import CheckpointFilter, NodeException, StoreCheckpointer
from tests.engines.graph._graphs import Calls, Mission, mission_v1, mission_v2

pytestmark = pytest.mark.postgres


def test_crash_resume_and_migration_on_postgres(pg_url: str) -> None:
    # guarantee 106, 109, 110, 117, 120 on the PostgreSQL backend
    store = Store(url=pg_url)
    try:
        cp = StoreCheckpointer(store, prefix="pg-graph:")
        calls = Calls(fail_once={"size_crew"})
        with pytest.raises(NodeException) as info:
            mission_v1(cp, calls).invoke(Mission(destination="Moon"), correlation_id="pg")
        rec = cp.load(info.value.invocation_id or "")
        assert [p.node_name for p in rec.completed_positions] == ["define_objective"]
        mission_v1(cp, calls).invoke(resume_invocation=rec.invocation_id)
        done = cp.list(CheckpointFilter(correlation_id="pg"))[-1]
        final = mission_v2(cp, calls).invoke(resume_invocation=done.invocation_id)
        assert final.trace == ["define_objective", "size_crew", "draft_timeline", "assess_risks"]
        assert calls.calls.count("define_objective") == 1
        assert store.read(cp.key(done.invocation_id))["status"] == "done"
        for r in cp.list(CheckpointFilter(correlation_id="pg")):
            cp.delete(r.invocation_id)
    finally:
        store.close()
