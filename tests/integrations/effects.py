"""Side effects the integration tests' tools make, counted in files.

A tool calls :func:`effect`: it appends ``<effect> <pid>`` to ``attempts.log`` every time
it runs, and ``<effect> <idempotency key> <pid>`` to ``effects.log`` unless that
idempotency key is already there (what an external API that deduplicates requests does),
so the effects log holds each effect once while the attempts log shows reruns.
``SHOP_KILL_AT`` in the environment names one point where :func:`die_at` SIGKILLs the
process, once (a ``killed`` file marks that it happened).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import stepstone


def die_at(logs: Path, where: str) -> None:
    marker = logs / "killed"
    if where == os.environ.get("SHOP_KILL_AT", "") and not marker.exists():
        marker.write_text(where)
        os.kill(os.getpid(), signal.SIGKILL)


def effect(logs: Path, name: str, kill_label: str) -> None:
    key = stepstone.step_context().idempotency_key
    with open(logs / "attempts.log", "a", encoding="ascii") as fh:
        fh.write(f"{name} {os.getpid()}\n")
    done = logs / "effects.log"
    seen = done.read_text().split() if done.exists() else []
    if key not in seen:
        with open(done, "a", encoding="ascii") as fh:
            fh.write(f"{name} {key} {os.getpid()}\n")
            fh.flush()
            os.fsync(fh.fileno())
    die_at(logs, f"inside:{kill_label}")


def effects(logs: Path) -> list[str]:
    path = logs / "effects.log"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def attempts(logs: Path) -> list[str]:
    path = logs / "attempts.log"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []
