"""The lease keeper thread is woken by a claim only when it would otherwise sleep past the
new run's first renewal."""

from __future__ import annotations

import time

from stepstone import Store
from stepstone.durable import claim_run
from stepstone.durable._leases import keeper

KIND = "keeper-test"


def test_a_run_with_a_shorter_lease_wakes_the_sleeping_keeper() -> None:
    # guarantee 311: the keeper renews every third of a lease, whatever the other runs' leases
    slow, fast = Store(lease_seconds=30.0), Store(lease_seconds=0.9)
    long = claim_run(slow, "long", kind=KIND, resume=False, first_step="a")
    assert long.run is not None
    try:
        deadline = time.monotonic() + 30
        while keeper._sleeping is None or keeper._sleeping < 1.0:
            # other tests' runs with short leases may still be registered: wait until the
            # keeper sleeps long, as it does with only default leases around
            assert time.monotonic() < deadline, f"keeper never slept long: {keeper._sleeping}"
            time.sleep(0.05)
        short = claim_run(fast, "short", kind=KIND, resume=False, first_step="a")
        assert short.run is not None
        try:
            first = short.run.head.lease_until
            renewed = False
            until = time.monotonic() + 3.0  # far less than the keeper's ~5 s sleep
            while time.monotonic() < until and not renewed:
                head = fast.backend.run_get("short")
                assert head is not None
                renewed = head.lease_until > first
                time.sleep(0.02)
            assert renewed, "the keeper slept past the short lease's renewal"
        finally:
            short.run.release()
    finally:
        long.run.release()
