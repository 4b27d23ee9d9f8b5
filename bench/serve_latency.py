"""Latency of `stepstone serve`: GET /runs/{key}, and one SSE item from its write to the
client (median and p99), against a real server process on SQLite, on loopback.

    .venv/bin/python bench/serve_latency.py [--reads 500] [--items 300]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2

from stepstone import Store

APP = """
from stepstone import step, workflow

@step
def noop(x: int) -> int:
    return x

@workflow
async def idle(x: int) -> int:
    return await noop(x)
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--items", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "benchapp.py").write_text(APP)
        db = root / "app.sqlite"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepstone.cli",
                "serve",
                "--db",
                str(db),
                "--port",
                "0",
                "--import-path",
                str(root),
                "--workers",
                "1",
            ],
            stderr=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        try:
            assert proc.stderr is not None
            url = proc.stderr.readline().split(" on ", 1)[1].split(" ", 1)[0]
            with httpx2.Client(base_url=url, timeout=60) as c:
                key = c.post("/runs", json={"target": "benchapp:idle", "args": [1]}).json()["key"]
                while c.get(f"/runs/{key}").json()["status"] != "done":
                    time.sleep(0.05)
                reads = []
                for _ in range(args.reads):
                    t0 = time.perf_counter()
                    assert c.get(f"/runs/{key}").status_code == 200
                    reads.append(time.perf_counter() - t0)
            # SSE: a run whose stream this process writes (another process, as a worker
            # would), read by one client through the server
            store = Store(db=db)
            skey = "bench-stream"
            store.backend.stream_append(skey, "s", json.dumps(-1), None)
            sent: dict[int, float] = {}
            got: dict[int, float] = {}
            ready = threading.Event()

            def read() -> None:
                with (
                    httpx2.Client(base_url=url, timeout=120) as c,
                    c.stream(
                        "GET", f"/runs/{skey}/streams/s", headers={"Last-Event-ID": "0"}
                    ) as resp,
                ):
                    ready.set()
                    for line in resp.iter_lines():
                        if line.startswith("data:"):
                            n = json.loads(line[5:])
                            got[n] = time.perf_counter()
                            if n == args.items - 1:
                                return

            with Store(db=db) as s2:
                from stepstone.durable import claim_run

                claim_run(s2, skey, kind="bench", resume=False, first_step="a")
            reader = threading.Thread(target=read)
            reader.start()
            ready.wait(60)
            time.sleep(0.5)
            for i in range(args.items):
                sent[i] = time.perf_counter()
                store.backend.stream_append(skey, "s", json.dumps(i), None)
                while i not in got and reader.is_alive():
                    time.sleep(0.0005)
            reader.join(60)
            store.close()
            items = [got[i] - sent[i] for i in range(args.items) if i in got]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            if proc.stderr is not None:
                proc.stderr.close()
    ms = 1000
    print(
        f"GET /runs/{{key}}: n={len(reads)} median {statistics.median(reads) * ms:.2f} ms, "
        f"p99 {_pct(reads, 0.99) * ms:.2f} ms"
    )
    print(
        f"SSE item (write -> client, writer in another process, SQLite): n={len(items)} "
        f"median {statistics.median(items) * ms:.2f} ms, p99 {_pct(items, 0.99) * ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
