"""The durable kernel every engine runs on: ownership, leases, atomic step commits."""

from stepstone.durable._kernel import (
    ClaimResult,
    OwnedRun,
    claim_run,
    describe_owner,
    ownership_error,
)
from stepstone.durable._leases import owner_alive

__all__ = [
    "ClaimResult",
    "OwnedRun",
    "claim_run",
    "describe_owner",
    "owner_alive",
    "ownership_error",
]
