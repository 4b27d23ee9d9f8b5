"""Several OS processes on one store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from stepstone.testing.store_conformance._spec import StoreSpec

_CAS_WORKER = textwrap.dedent(
    """
    import json, sys
    from stepstone.store import Store
    args, n = json.loads(sys.argv[1]), int(sys.argv[2])
    store = Store(**args)
    done = 0
    while done < n:
        current = store.read("counter")
        if store.compare_and_swap("counter", current, current + 1):
            done += 1
    store.close()
    """
)


def test_cas_race_across_processes(store_spec: StoreSpec) -> None:
    """Several OS processes increment one counter by CAS: no update is lost."""
    if not store_spec.multiprocess:
        pytest.skip(f"{store_spec.name} store is process-local")
    store = store_spec.open()
    store.write("counter", 0)
    procs, per = 4, 25
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _CAS_WORKER, json.dumps(store_spec.args), str(per)],
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        for _ in range(procs)
    ]
    for w in workers:
        assert w.wait(timeout=120) == 0
    assert store.read("counter") == procs * per
