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

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from stepstone.core._lazy import lazy_attributes as _lazy_attributes

if _TYPE_CHECKING:
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

# Each name loads its module on first use (PEP 562): importing one module of the package
# does not import the others.
_LAZY: dict[str, str] = {
    "agent_view": "stepstone.durable._approvals",
    "approve_call": "stepstone.durable._approvals",
    "pending_approvals": "stepstone.durable._approvals",
    "recorded_approvals": "stepstone.durable._approvals",
    "diff_runs": "stepstone.durable._inspect",
    "owner_state": "stepstone.durable._inspect",
    "query_runs": "stepstone.durable._inspect",
    "run_detail": "stepstone.durable._inspect",
    "run_summary": "stepstone.durable._inspect",
    "run_timeline": "stepstone.durable._inspect",
    "stranded_runs": "stepstone.durable._inspect",
    "timeline": "stepstone.durable._inspect",
    "ClaimResult": "stepstone.durable._kernel",
    "OwnedRun": "stepstone.durable._kernel",
    "aclaim_empty": "stepstone.durable._kernel",
    "aclaim_run": "stepstone.durable._kernel",
    "claim_empty": "stepstone.durable._kernel",
    "claim_run": "stepstone.durable._kernel",
    "describe_owner": "stepstone.durable._kernel",
    "ownership_error": "stepstone.durable._kernel",
    "LeasePolicy": "stepstone.durable._leases",
    "database_now": "stepstone.durable._leases",
    "owner_alive": "stepstone.durable._leases",
    "cancel_run": "stepstone.durable._operate",
    "fork_run": "stepstone.durable._operate",
    "retry_run": "stepstone.durable._operate",
    "settle_operation": "stepstone.durable._operations",
    "requeue_run": "stepstone.durable._queue",
    "adelete_run": "stepstone.durable._records",
    "alist_runs": "stepstone.durable._records",
    "aread_run": "stepstone.durable._records",
    "blocking_call": "stepstone.durable._records",
    "delete_run": "stepstone.durable._records",
    "journal_since": "stepstone.durable._records",
    "list_runs": "stepstone.durable._records",
    "read_run": "stepstone.durable._records",
    "run_head": "stepstone.durable._records",
    "PrunedRun": "stepstone.durable._retention",
    "PruneInterrupted": "stepstone.durable._retention",
    "Pruner": "stepstone.durable._retention",
    "PruneReport": "stepstone.durable._retention",
    "plan_prune": "stepstone.durable._retention",
    "prune": "stepstone.durable._retention",
    "prune_run": "stepstone.durable._retention",
    "in_doubt_effects": "stepstone.durable._settle",
    "settle_effect": "stepstone.durable._settle",
}


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())


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
