"""``stepstone serve``: the HTTP API, streams, webhooks and the inspector over a store."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from stepstone.cli._options import DbOption, DebugOption, UrlOption, fail, seconds, whole
from stepstone.exceptions import StepstoneError

__all__ = ["listen_error", "serve_cmd"]


def listen_error(host: str, port: int, exc: OSError) -> str:
    """What to say when the server cannot bind, and what to change."""
    import errno
    import socket

    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        fix = "pass a --host that is an address of this machine (127.0.0.1 by default)"
    else:
        fix = "pass another --port (0 takes any free one)"
    return f"cannot listen on {host}:{port} ({exc.strerror}); {fix}"


def _secret_text(path: Path, what: str, option: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        fail(f"cannot read the {what} file {str(path)!r} ({exc.strerror}); check {option}")
    if not text:
        fail(f"the {what} file {str(path)!r} is empty; put the {what} in it")
    return text


def _registry(spec: str | None) -> dict[str, Any]:
    if spec is None:
        return {}
    from stepstone.server._targets import Targets

    found = Targets([Path.cwd()], {}).resolve(spec)
    if not isinstance(found, dict):
        fail(f"--registry {spec!r} names a {type(found).__name__}, not a dict of targets")
    return dict(found)


HostOption = Annotated[
    str, typer.Option(help="Interface to bind; off loopback, --token-file is required.")
]
PortOption = Annotated[
    int,
    typer.Option(parser=whole(0, 65535), metavar="PORT", help="TCP port (0: any free port)."),
]
ImportPathOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--import-path",
        help="A folder run targets may be imported from (repeat; default: the current one).",
    ),
]
RegistryOption = Annotated[
    str | None,
    typer.Option(metavar="MODULE:NAME", help="A dict of targets by name, under --import-path."),
]
WorkersOption = Annotated[
    int,
    typer.Option(
        parser=whole(0), metavar="N", help="Run queued runs in this process, N at a time."
    ),
]
QueueOption = Annotated[
    list[str] | None, typer.Option("--queue", "-q", help="A queue the --workers serve.")
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(help="A file holding the bearer token every request must carry."),
]
WebhookSecretFileOption = Annotated[
    Path | None,
    typer.Option(
        help="A file holding the webhook signing secret (or set STEPSTONE_WEBHOOK_SECRET)."
    ),
]
WebhookAttemptsOption = Annotated[
    int, typer.Option(parser=whole(1), metavar="N", help="Attempts per webhook.")
]
WebhookBackoffOption = Annotated[
    float,
    typer.Option(parser=seconds(), metavar="SECONDS", help="Wait before a second attempt."),
]
WebhookTimeoutOption = Annotated[
    float, typer.Option(parser=seconds(), metavar="SECONDS", help="Time per attempt.")
]
ReadOnlyOption = Annotated[
    bool, typer.Option("--read-only", help="Refuse every write (start, cancel, ...).")
]
MaxBodyOption = Annotated[
    int,
    typer.Option(parser=whole(1), metavar="BYTES", help="The largest request body taken."),
]
LeaseSecondsOption = Annotated[
    float,
    typer.Option(parser=seconds(), metavar="SECONDS", help="The --workers' run leases."),
]


def serve_cmd(
    db: DbOption = None,
    url: UrlOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    import_path: ImportPathOption = None,
    registry: RegistryOption = None,
    workers: WorkersOption = 0,
    queue: QueueOption = None,
    token_file: TokenFileOption = None,
    webhook_secret_file: WebhookSecretFileOption = None,
    webhook_attempts: WebhookAttemptsOption = 8,
    webhook_backoff: WebhookBackoffOption = 1.0,
    webhook_timeout: WebhookTimeoutOption = 10.0,
    read_only: ReadOnlyOption = False,
    max_body: MaxBodyOption = 1 << 20,
    lease_seconds: LeaseSecondsOption = 30.0,
    debug: DebugOption = False,
) -> None:
    """Serve the HTTP API, run streams, webhooks and the inspector over a store."""
    try:
        from stepstone.server import Server, ServerConfig, WebhookPolicy
    except ImportError as exc:
        fail(str(exc))
    from stepstone.store import Store

    if (db is None) == (url is None):
        fail("pass exactly one of --db FILE or --url URL (see --help)", 2)
    token = _secret_text(token_file, "token", "--token-file") if token_file else None
    secret = _webhook_secret(webhook_secret_file)
    paths = _import_paths(import_path)
    try:
        store = Store(db=db, url=url, lease_seconds=lease_seconds)
    except StepstoneError as exc:
        fail(str(exc))
    try:
        sys.path[:0] = [str(p) for p in paths if str(p) not in sys.path]
        config = ServerConfig(
            store=store,
            host=host,
            import_paths=tuple(paths),
            registry=_registry(registry),
            actions=not read_only,
            token=token,
            max_body=max_body,
            webhook_secret=secret,
        )
        if not config.loopback and token is None:
            fail(f"serving on {host}, off loopback, needs a token: pass --token-file FILE")
        policy = None
        if secret is not None:
            policy = WebhookPolicy(
                secret=secret,
                attempts=webhook_attempts,
                backoff=webhook_backoff,
                timeout=webhook_timeout,
            )
        try:
            server = Server(
                config,
                port=port,
                webhooks=policy,
                workers=workers,
                queues=queue or ["default"],
                worker_options={"lease_seconds": lease_seconds},
            )
        except OSError as exc:
            fail(listen_error(host, port, exc))
        _say_serving(server.url, store.describe(), read_only, workers)
        _serve_until_stopped(server)
    except StepstoneError as exc:
        if debug:
            raise
        fail(str(exc))
    finally:
        store.close()


def _webhook_secret(webhook_secret_file: Path | None) -> str | None:
    """The webhook signing secret: from --webhook-secret-file, else the environment."""
    if webhook_secret_file is not None:
        return _secret_text(webhook_secret_file, "webhook secret", "--webhook-secret-file")
    return os.environ.get("STEPSTONE_WEBHOOK_SECRET") or None


def _import_paths(import_path: list[Path] | None) -> list[Path]:
    """The folders run targets may be imported from (default: the current one)."""
    paths = [p.resolve() for p in (import_path or [Path.cwd()])]
    for p in paths:
        if not p.is_dir():
            fail(f"--import-path {str(p)!r} is not a folder")
    return paths


def _say_serving(url: str, store: str, read_only: bool, workers: int) -> None:
    mode = "read-only" if read_only else "actions on"
    more = f", {workers} worker slots" if workers else ""
    typer.echo(f"stepstone serve on {url} ({store}, {mode}{more}); Ctrl-C stops it", err=True)


def _serve_until_stopped(server: Any) -> None:
    """Serve until Ctrl-C or SIGTERM (after uvicorn's graceful shutdown: exit 0)."""

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt  # after uvicorn's graceful shutdown: exit 0

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
