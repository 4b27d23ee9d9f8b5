"""A local web inspector for durable runs (``stepstone ui``).

It needs nothing beyond the standard library: a threaded WSGI server bound to 127.0.0.1
serves static files shipped in this package and a small JSON API over a
:class:`~stepstone.Store`. The page lists runs with filters, shows each run's timeline
(payloads, errors) and refreshes while runs progress. It is read-only unless started with
``allow_actions=True``.

Example::

    from stepstone import Store
    from stepstone.ui import InspectorServer

    with InspectorServer(Store(db="runs.sqlite")) as server:
        print("open", server.url)
        server.serve_forever()
"""

from __future__ import annotations

from stepstone.ui._app import InspectorApp
from stepstone.ui._server import InspectorServer

__all__ = ["InspectorApp", "InspectorServer"]
