"""``stepstone ui``: serve the local web inspector."""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Annotated

import typer

from stepstone.cli._options import DbOption, DebugOption, UrlOption, open_store, seconds, whole

__all__ = ["ui_cmd"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fix(exc: OSError) -> str:
    """What to change when the server cannot bind: the address or the port."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return "pass a --host that is an address of this machine (127.0.0.1 by default)"
    return "pass another --port (0 takes any free one)"


def ui_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    host: Annotated[str, typer.Option(help="Interface to bind (no authentication!).")] = (
        "127.0.0.1"
    ),
    port: Annotated[
        int,
        typer.Option(parser=whole(0, 65535), metavar="PORT", help="TCP port (0: any free port)."),
    ] = 8765,
    allow_actions: Annotated[
        bool, typer.Option("--allow-actions", help="Let the page cancel runs.")
    ] = False,
    poll: Annotated[
        float,
        typer.Option(parser=seconds(), metavar="SECONDS", help="Seconds between page refreshes."),
    ] = 1.0,
    debug: DebugOption = False,
) -> None:
    """Serve a local web page listing runs and their timelines, updated live."""
    from stepstone.ui import InspectorServer

    with open_store(db, url, debug=debug, read_only=not allow_actions) as store:
        if not _loopback(host):
            typer.echo(
                f"warning: serving on {host}, not loopback: anyone who can reach it sees "
                "your runs (the page has no authentication)",
                err=True,
            )
        try:
            server = InspectorServer(
                store, host=host, port=port, allow_actions=allow_actions, poll_seconds=poll
            )
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port} ({exc.strerror}); {_fix(exc)}") from exc
        mode = "actions enabled" if allow_actions else "read-only"
        typer.echo(f"stepstone inspector on {server.url} ({mode}); Ctrl-C stops it", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
