"""The durable kernel every engine runs on: ownership, leases, atomic step commits."""

from stepstone.durable._kernel import ClaimResult, OwnedRun, claim_run, describe_owner
from stepstone.durable._leases import owner_alive
from stepstone.durable._retention import PrunedRun, PruneReport, delete_run, plan_prune, prune

__all__ = [
    "ClaimResult",
    "OwnedRun",
    "PruneReport",
    "PrunedRun",
    "claim_run",
    "delete_run",
    "describe_owner",
    "owner_alive",
    "plan_prune",
    "prune",
]
