"""``stepstone serve``: an HTTP API for durable runs, their streams as Server-Sent Events,
signed webhooks from a durable outbox, and the web inspector's pages, in one ASGI app.

It needs the ``server`` extra (``pip install stepstone[server]``: Starlette, uvicorn,
sse-starlette, standardwebhooks, httpx2). Every handler goes through the same kernel
calls as the ``stepstone`` command; the server never touches a store's backend itself.

Example::

    from stepstone import Store
    from stepstone.server import ServerConfig, create_app

    app = create_app(ServerConfig(store=Store(db="app.sqlite")))
    # uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

from stepstone.exceptions import MissingExtraError

try:
    import sse_starlette  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is part of the dev install
    raise MissingExtraError(exc.name or "starlette", "server") from exc

from stepstone.server._app import create_app
from stepstone.server._config import ServerConfig
from stepstone.server._serve import Server
from stepstone.server._webhooks import WebhookPolicy, sign

__all__ = ["Server", "ServerConfig", "WebhookPolicy", "create_app", "sign"]
