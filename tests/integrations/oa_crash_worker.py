"""Runs (or resumes) the OpenAI Agents desk of :mod:`tests.integrations.oa_shop` under the
key ``ticket-1`` and prints its outcome as JSON.

Usage: python -m tests.integrations.oa_crash_worker DB LOGS BASE_URL [keyed]: ``keyed``
runs it with ``DurableRunner.run_sync(..., store=, key=)`` instead of in a workflow.
"""

from __future__ import annotations

import json
import sys

from stepstone import Store
from tests.integrations.oa_shop import handle_ticket, keyed_run

db, logs, base_url = sys.argv[1], sys.argv[2], sys.argv[3]
with Store(url=db) if db.startswith("postgresql://") else Store(db=db) as store:
    if sys.argv[4:] == ["keyed"]:
        print(keyed_run(base_url, logs, store, "ticket-1"))
    else:
        run = handle_ticket.using(store=store, key="ticket-1")
        print(json.dumps(run.run_sync(base_url, logs, "order 42 please")))
