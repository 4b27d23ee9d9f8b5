"""The durable kernel every engine runs on: ownership, leases, atomic step commits.

Also what operators use on runs from outside their owner: read models (``list_runs``,
``run_detail``, ``diff_runs``, ``stranded_runs``), ``cancel_run``, ``fork_run`` and
``prune`` with a :class:`~stepstone.store.Retention` policy.
"""

from stepstone.durable._inspect import (
    diff_runs,
    list_runs,
    owner_state,
    run_detail,
    run_summary,
    stranded_runs,
    timeline,
)
from stepstone.durable._kernel import (
    ClaimResult,
    OwnedRun,
    claim_run,
    describe_owner,
    ownership_error,
)
from stepstone.durable._leases import owner_alive
from stepstone.durable._operate import cancel_run, fork_run, retry_run
from stepstone.durable._retention import (
    PrunedRun,
    Pruner,
    PruneReport,
    delete_run,
    plan_prune,
    prune,
)

__all__ = [
    "ClaimResult",
    "OwnedRun",
    "PruneReport",
    "PrunedRun",
    "Pruner",
    "cancel_run",
    "claim_run",
    "delete_run",
    "describe_owner",
    "diff_runs",
    "fork_run",
    "list_runs",
    "owner_alive",
    "owner_state",
    "ownership_error",
    "plan_prune",
    "prune",
    "retry_run",
    "run_detail",
    "run_summary",
    "stranded_runs",
    "timeline",
]
