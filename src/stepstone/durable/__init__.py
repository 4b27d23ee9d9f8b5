"""The durable kernel every engine runs on: ownership, leases, atomic step commits, and
the only way engines and the CLI read, list and delete run records."""

from stepstone.durable._kernel import (
    ClaimResult,
    OwnedRun,
    aclaim_run,
    claim_run,
    describe_owner,
    ownership_error,
)
from stepstone.durable._leases import owner_alive
from stepstone.durable._records import (
    adelete_run,
    alist_runs,
    aread_run,
    blocking_call,
    delete_run,
    list_runs,
    read_run,
    run_head,
)

__all__ = [
    "ClaimResult",
    "OwnedRun",
    "aclaim_run",
    "adelete_run",
    "alist_runs",
    "aread_run",
    "blocking_call",
    "claim_run",
    "delete_run",
    "describe_owner",
    "list_runs",
    "owner_alive",
    "ownership_error",
    "read_run",
    "run_head",
]
