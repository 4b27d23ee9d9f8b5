"""The stories ``stepstone demo`` tells, offline: a Plan ETL pipeline that crashes and
resumes, and a typed-state graph resumed under a migrated schema.

Run them with ``stepstone demo`` (or ``make demo``); :func:`run_demo` is what it calls.
"""

from stepstone.demos._run import command_name, run_demo

__all__ = ["command_name", "run_demo"]
