"""Identifiers: run stamps and this process's identity for leases."""

from __future__ import annotations

import functools
import os
import socket
import uuid

__all__ = ["host_id", "new_origin", "new_uid", "process_alive", "process_start_time"]


def new_uid() -> str:
    """A fresh 32-hex-digit identifier (a run's ``run_uid``)."""
    return uuid.uuid4().hex


def new_origin() -> str:
    """A fresh 12-hex-digit stamp of one run of a key (``meta["origin"]`` of its head): set
    when the run starts from scratch, is rewound by a retry or forked, and kept by resumes.
    It is part of the keys derived from the run (a Plan step's idempotency key, the keys of
    the LLM loops inside its steps), so another run of the same key never reuses them."""
    return uuid.uuid4().hex[:12]


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
    """The start time of ``pid`` in clock ticks since boot, or None when unknown.

    Together with the pid it names a process uniquely within one boot, so a recycled pid is
    not mistaken for the original owner. The value must never change while the process
    lives. On Linux it is the kernel's own tick count, read from ``/proc/<pid>/stat``: it
    does not move when the wall clock is stepped. (Deriving it from a wall-clock creation
    time minus the boot time does: the kernel's boot time follows every clock step, so a
    live owner would look dead and its run be taken over.) Elsewhere psutil's creation
    time stands in for it.
    """
    if _PROC_STAT:
        return _linux_start_ticks(pid)
    import psutil  # loaded by the processes that own or judge runs, not by every import

    try:
        created = psutil.Process(pid).create_time()
    except (psutil.Error, OSError, ValueError):
        return None
    ticks: int = round((float(created) - _boot_time()) * _CLOCK_TICKS)
    return ticks


def _linux_start_ticks(pid: int) -> int | None:
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) sits in parentheses and may hold spaces or ")": the
    # fields after its last ")" start at field 3, so the start time (field 22) is the 20th.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: int | None) -> bool:
    """Whether process ``pid`` (started at ``start_time``, when known) still runs here."""
    if pid <= 0:
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # exited, not yet reaped: it will never renew its lease
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # exists, owned by someone else
    if start_time is not None:
        now = process_start_time(pid)
        if now is None:
            return False  # gone between the two checks
        if now != start_time:
            return False  # the pid was recycled
    return True


@functools.cache
def _boot_time() -> float:
    import psutil

    return float(psutil.boot_time())


_CLOCK_TICKS: int = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC_STAT: bool = os.path.exists(f"/proc/{os.getpid()}/stat")
