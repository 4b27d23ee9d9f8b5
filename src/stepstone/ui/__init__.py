"""A local web inspector for durable runs (``stepstone ui``): the pages of
``stepstone serve`` (:mod:`stepstone.server`), served read-only unless actions are allowed.

It needs the ``server`` extra. The page lists runs with filters, shows each run's
timeline (payloads, errors, step times), follows its streams live, and compares two runs.

Example::

    from stepstone import Store
    from stepstone.ui import InspectorServer

    with InspectorServer(Store(db="runs.sqlite"), port=0).start() as server:
        print("open", server.url)
"""

from __future__ import annotations

from stepstone.ui._server import InspectorServer

__all__ = ["InspectorServer"]
