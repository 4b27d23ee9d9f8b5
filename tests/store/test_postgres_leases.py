"""Two "hosts" (processes with different ``STEPSTONE_HOST_ID``) share runs on PostgreSQL.

Another host cannot see whether the owner's process is alive, so only the lease decides:
a run whose owner stopped renewing is taken over once the lease expires, never before,
and the old owner, should it wake up, can no longer commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stepstone.store import Store

pytestmark = pytest.mark.postgres

LEASE = 1.5

_OWNER = textwrap.dedent(
    """
    import sys
    from stepstone.durable import claim_run
    from stepstone.exceptions import ConcurrentRunError
    from stepstone.store import Store
    store = Store(url=sys.argv[1], lease_seconds=float(sys.argv[2]))
    run = claim_run(store, "job", kind="test", resume=False, first_step="s0").run
    run.commit_sync(status="running", next_step="s1", rows=[("step", "s0", "a")],
                    writes=[("out-s0", "a")])
    print("ready", flush=True)
    sys.stdin.readline()  # a long step; the lease keeper thread renews meanwhile
    try:
        run.commit_sync(status="running", next_step="s2", rows=[("step", "s1", "a")],
                        writes=[("out-s1", "a")])
        print("committed", flush=True)
    except ConcurrentRunError as exc:
        print("lost:", exc, flush=True)
    """
)

_TAKER = textwrap.dedent(
    """
    import json, sys, time
    from stepstone.durable import claim_run
    from stepstone.exceptions import ConcurrentRunError
    from stepstone.store import Store
    store = Store(url=sys.argv[1], lease_seconds=float(sys.argv[2]))
    attempts = []
    deadline = time.time() + 30
    while time.time() < deadline:
        t0 = time.time()
        try:
            claimed = claim_run(store, "job", kind="test", resume=True, first_step="s0")
        except ConcurrentRunError:
            attempts.append([t0, time.time(), False])
            if len(attempts) == 1:
                print("refused", flush=True)
            time.sleep(0.05)
            continue
        attempts.append([t0, time.time(), True])
        break
    run = claimed.run
    assert claimed.outcome == "resumed" and run.head.next_step == "s1", claimed
    run.commit_sync(status="running", next_step="s2", rows=[("step", "s1", "b")],
                    writes=[("out-s1", "b")])
    run.commit_sync(status="done", next_step=None, rows=[("step", "s2", "b")])
    run.release()
    print(json.dumps(attempts), flush=True)
    """
)


def _spawn(code: str, host: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STEPSTONE_HOST_ID": host, "PYTHONWARNINGS": "error"},
    )


def test_other_host_takes_over_after_lease_expiry_never_before(pg_url: str) -> None:
    """guarantee 27/30 (ownership with leases), across hosts."""
    with Store(url=pg_url) as store:
        for key in store.keys():
            store.delete(key)
    owner = _spawn(_OWNER, "host-a", pg_url, str(LEASE))
    taker = None
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        taker = _spawn(_TAKER, "host-b", pg_url, str(LEASE))
        # The owner is alive and renewing: from the taker's first try (its start-up takes
        # seconds on a loaded machine) and for two whole leases, the taker must fail.
        assert taker.stdout is not None and taker.stdout.readline().strip() == "refused"
        time.sleep(2 * LEASE + 0.5)
        owner.send_signal(signal.SIGSTOP)  # the owner freezes: no more renewals
        stopped_at = time.time()
        time.sleep(0.2)  # a renewal in flight at the stop has landed by now
        with Store(url=pg_url) as store:
            head = store.backend.run_get("job")
        assert head is not None and head.host == "host-a"
        lease_until = head.lease_until
        assert lease_until > stopped_at - LEASE / 3 - 0.5  # it was being renewed
        out, err = taker.communicate(timeout=60)
        assert taker.returncode == 0, err
        attempts = json.loads(out)
        failed = [a for a in attempts if not a[2]]
        won = [a for a in attempts if a[2]]
        assert len(won) == 1 and attempts[-1] is won[0]
        # Never before: every attempt made while the owner renewed failed, and the one
        # that won ended after the lease the frozen owner had left.
        assert any(end < stopped_at - LEASE for _, end, _ in failed)
        assert won[0][1] >= lease_until
        # The owner wakes up: its commit is refused, nothing of it is written.
        owner.send_signal(signal.SIGCONT)
        out, err = owner.communicate("go\n", timeout=30)
        assert owner.returncode == 0, err
        assert out.startswith("lost:") and "'job'" in out, out
    finally:
        for proc in (owner, taker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()
    with Store(url=pg_url) as store:
        head = store.backend.run_get("job")
        assert head is not None and head.status == "done" and head.host == "host-b"
        rows = store.backend.run_journal("job")
        assert [(r.name, json.loads(r.data)) for r in rows] == [
            ("s0", "a"),
            ("s1", "b"),
            ("s2", "b"),
        ]
        assert store.read("out-s1") == "b"


_PLAN_WORKER = textwrap.dedent(
    """
    import os, sys, time
    from stepstone import Agent, Plan, Step, Store
    from stepstone.exceptions import ConcurrentPlanRunError
    url, log, lease, block_at = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    host = os.environ["STEPSTONE_HOST_ID"]

    def make(name):
        def fn(payload):
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"{name} {host}\\n")
            if name == block_at:
                print("blocked", flush=True)
                time.sleep(600)
            return f"{name}<{payload}>"
        fn.__name__ = name
        return fn

    store = Store(url=url, lease_seconds=lease)
    plan = Plan(*[Step(make(f"s{i}"), writes=f"w{i}") for i in range(6)],
                store=store, checkpoint_key="etl", resume=True)
    refused = 0
    while True:
        try:
            env = Agent(engine=plan)("in")
            break
        except ConcurrentPlanRunError:
            refused += 1
            if refused == 1:
                print("refused", flush=True)
            time.sleep(0.05)
    print(f"done refused={refused} ok={env.ok}", flush=True)
    """
)


def test_plan_resumes_on_another_host_after_its_worker_dies(pg_url: str, tmp_path: Path) -> None:
    """A Plan's worker on host A is SIGKILLed inside step s3; the same Plan with
    ``resume=True`` on host B is refused until A's lease expires, then finishes the run.
    Committed steps never run again; only the step in flight (s3) runs twice (guarantee 43)."""
    with Store(url=pg_url) as store:
        for key in store.keys():
            store.delete(key)
    log = tmp_path / "steps.log"
    a = _spawn(_PLAN_WORKER, "host-a", pg_url, str(log), str(LEASE), "s3")
    b = None
    try:
        assert a.stdout is not None and a.stdout.readline().strip() == "blocked"
        # B starts while A still renews its lease (B's start-up takes seconds on a loaded
        # machine, longer than the lease): it is refused, then A dies
        b = _spawn(_PLAN_WORKER, "host-b", pg_url, str(log), str(LEASE), "")
        assert b.stdout is not None and b.stdout.readline().strip() == "refused"
        a.kill()
        a.communicate()
        with Store(url=pg_url) as store:
            head = store.backend.run_get("etl")
        assert head is not None and head.host == "host-a" and head.status == "running"
        out, err = b.communicate(timeout=60)
        finished_at = time.time()
        assert b.returncode == 0, err
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    refused = int(out.split("refused=")[1].split()[0])
    assert refused > 0 and "ok=True" in out, out  # refused while A lived, and after
    assert finished_at >= head.lease_until  # it waited for the dead owner's lease
    assert log.read_text(encoding="utf-8").split("\n") == [
        "s0 host-a",
        "s1 host-a",
        "s2 host-a",
        "s3 host-a",
        "s3 host-b",
        "s4 host-b",
        "s5 host-b",
        "",
    ]
    with Store(url=pg_url) as store:
        state = store.read("etl")
        assert state["status"] == "done"
        assert state["completed_steps"] == [f"s{i}" for i in range(6)]
        assert store.read("w5") == "s5<s4<s3<s2<s1<s0<in>>>>>>"
