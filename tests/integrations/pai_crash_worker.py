"""Runs (or resumes) :func:`tests.integrations.pai_shop.handle_ticket` under the key
``ticket-1`` and prints its outcome as JSON.

Usage: python -m tests.integrations.pai_crash_worker DB LOGS BASE_URL (DB: a SQLite file
or a ``postgresql://`` URL) (``SHOP_KILL_AT`` in
the environment makes it die at that point, see :mod:`tests.integrations.pai_shop`).
"""

from __future__ import annotations

import json
import sys

from stepstone import Store
from tests.integrations.pai_shop import handle_ticket

db, logs, base_url = sys.argv[1], sys.argv[2], sys.argv[3]
with Store(url=db) if db.startswith("postgresql://") else Store(db=db) as store:
    run = handle_ticket.using(store=store, key="ticket-1")
    print(json.dumps(run.run_sync(base_url, logs, "order 42 please")))
