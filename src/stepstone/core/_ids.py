"""Identifiers: run stamps and this process's identity for leases."""

from __future__ import annotations

import functools
import os
import socket
import uuid

__all__ = ["host_id", "new_uid", "process_alive", "process_start_time"]


def new_uid() -> str:
    """A fresh 32-hex-digit identifier (a run's ``run_uid``)."""
    return uuid.uuid4().hex


@functools.cache
def host_id() -> str:
    """This machine's identity: hostname plus boot id, so a reboot is a new host.

    Pids are only comparable on one host during one boot; the boot id keeps a reused pid
    after a reboot from looking like a live owner. ``STEPSTONE_HOST_ID`` overrides it (for
    containers that share a hostname, and for tests that play several hosts).
    """
    override = os.environ.get("STEPSTONE_HOST_ID")
    if override:
        return override
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks, or None when unknown.

    Together with the pid it names a process uniquely within one boot, so a recycled pid is
    not mistaken for the original owner.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses; fields after the last ')' are fixed.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: int | None) -> bool:
    """Whether process ``pid`` (started at ``start_time``, when known) still runs here."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start_time is not None:
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False  # the pid was recycled
        if now is None and os.path.isdir("/proc"):
            return False  # gone between the two checks (or a zombie reaped)
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[-1].split()
    except OSError:
        return True  # no /proc: trust kill(0)
    return not fields or fields[0] != "Z"
