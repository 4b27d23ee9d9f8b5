"""The durable kernel every engine runs on: ownership, leases (one :class:`LeasePolicy`),
atomic step commits, and the only way engines and the CLI read, list and delete run
records (``read_run``, ``run_head``, ``list_runs``, ``delete_run`` and their async forms).

Also what operators use on runs from outside their owner: read models (``query_runs``,
``run_detail``, ``diff_runs``, ``stranded_runs``), ``cancel_run``, ``fork_run``,
``retry_run`` (and ``requeue_run`` for a run that came from a queue), ``approve_call``,
``settle_effect`` (a call left in doubt, with ``in_doubt_effects``), ``settle_operation``
(a workflow step left in doubt) and ``prune`` with a
:class:`~stepstone.store.Retention` policy.
"""

from stepstone.durable._approvals import (
    agent_view,
    approve_call,
    pending_approvals,
    recorded_approvals,
)
from stepstone.durable._inspect import (
    diff_runs,
    owner_state,
    query_runs,
    run_detail,
    run_summary,
    run_timeline,
    stranded_runs,
    timeline,
)
from stepstone.durable._kernel import (
    ClaimResult,
    OwnedRun,
    aclaim_empty,
    aclaim_run,
    claim_empty,
    claim_run,
    describe_owner,
    ownership_error,
)
from stepstone.durable._leases import LeasePolicy, database_now, owner_alive
from stepstone.durable._operate import cancel_run, fork_run, retry_run
from stepstone.durable._operations import settle_operation
from stepstone.durable._queue import requeue_run
from stepstone.durable._records import (
    adelete_run,
    alist_runs,
    aread_run,
    blocking_call,
    delete_run,
    journal_since,
    list_runs,
    read_run,
    run_head,
)
from stepstone.durable._retention import (
    PrunedRun,
    PruneInterrupted,
    Pruner,
    PruneReport,
    plan_prune,
    prune,
    prune_run,
)
from stepstone.durable._settle import in_doubt_effects, settle_effect

__all__ = [
    "ClaimResult",
    "LeasePolicy",
    "OwnedRun",
    "PruneInterrupted",
    "PruneReport",
    "PrunedRun",
    "Pruner",
    "aclaim_empty",
    "aclaim_run",
    "agent_view",
    "approve_call",
    "adelete_run",
    "alist_runs",
    "aread_run",
    "blocking_call",
    "cancel_run",
    "claim_empty",
    "claim_run",
    "database_now",
    "delete_run",
    "describe_owner",
    "diff_runs",
    "fork_run",
    "in_doubt_effects",
    "journal_since",
    "list_runs",
    "owner_alive",
    "owner_state",
    "ownership_error",
    "pending_approvals",
    "plan_prune",
    "prune",
    "prune_run",
    "query_runs",
    "read_run",
    "recorded_approvals",
    "requeue_run",
    "retry_run",
    "run_detail",
    "run_head",
    "run_summary",
    "settle_effect",
    "settle_operation",
    "run_timeline",
    "stranded_runs",
    "timeline",
]
