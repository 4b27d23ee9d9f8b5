"""The ``stepstone`` command and its table of subcommands (each loaded when it runs).

Every failure is one line on stderr, ``error: <what> ...`` naming the problem and the fix,
with exit status 1 (2 for a wrong command line, whatever the command); ``--debug`` shows the
traceback instead. Ctrl-C stops any command with ``interrupted`` on stderr and exit status
130. ``inspect`` and ``runs`` (in ``_basic``) open the store read-only: they never create,
migrate or write.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any, cast

import typer
import typer.main
from typer.core import TyperGroup

from stepstone.cli import _debug as _debug_state

__all__ = ["app", "main"]

#: click's error for a wrong command line (typer's own copy of click, in recent typers)
_ClickUsageError: type[Exception] = typer.BadParameter.__mro__[1]

#: Every command, in the order ``--help`` lists them: where its function is (module,
#: attribute; ``schedules`` is a Typer app of its own). A command's module is imported,
#: and its options read, only when the command runs or a help page lists it: ``stepstone
#: runs`` does not load what ``serve`` or ``migrate`` need.
_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("stepstone.cli._basic", "demo"),
    "worker": ("stepstone.cli._worker", "worker"),
    "inspect": ("stepstone.cli._basic", "inspect"),
    "runs": ("stepstone.cli._basic", "runs"),
    "prune": ("stepstone.cli._ops", "prune_cmd"),
    "vacuum": ("stepstone.cli._ops", "vacuum_cmd"),
    "show": ("stepstone.cli._ops", "show_cmd"),
    "history": ("stepstone.cli._ops", "history_cmd"),
    "stranded": ("stepstone.cli._ops", "stranded_cmd"),
    "diff": ("stepstone.cli._ops", "diff_cmd"),
    "cancel": ("stepstone.cli._ops", "cancel_cmd"),
    "fork": ("stepstone.cli._ops", "fork_cmd"),
    "retry": ("stepstone.cli._ops", "retry_cmd"),
    "approve": ("stepstone.cli._ops", "approve_cmd"),
    "queue": ("stepstone.cli._ops", "queue_cmd"),
    "ui": ("stepstone.cli._ui", "ui_cmd"),
    "serve": ("stepstone.cli._serve", "serve_cmd"),
    "migrate": ("stepstone.cli._migrate", "migrate_cmd"),
    "resume": ("stepstone.cli._migrate", "resume_cmd"),
    "check": ("stepstone.cli._check", "check_cmd"),
    "send": ("stepstone.cli._messages", "send_cmd"),
    "events": ("stepstone.cli._messages", "events_cmd"),
    "stream": ("stepstone.cli._messages", "stream_cmd"),
    "requeue": ("stepstone.cli._requeue", "requeue_cmd"),
    "settle": ("stepstone.cli._settle", "settle_cmd"),
    "schedules": ("stepstone.cli._messages", "schedules_app"),
}


#: The commands built so far in this process. typer builds the whole click group again on
#: every call of ``app`` (a test calls it hundreds of times); a built command holds no
#: state of one invocation, so each is built once.
_BUILT: dict[str, Any] = {}


def _build(name: str) -> Any:
    """The click command ``name``, built from its function as typer builds it in a group."""
    if name in _BUILT:
        return _BUILT[name]
    module, attr = _COMMANDS[name]
    target = getattr(importlib.import_module(module), attr)
    one = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        one.add_typer(target, name=name)
    else:
        one.command(name)(target)
        one.callback()(_no_options)  # a group, as the whole app is, whatever the command
    _BUILT[name] = cast(TyperGroup, typer.main.get_command(one)).commands[name]
    return _BUILT[name]


def _no_options() -> None:
    """(The group one command is built in; never shown.)"""


class _LazyCommands(MutableMapping[str, Any]):
    """The root group's commands: every name known, each command built on first use."""

    def __init__(self, built: MutableMapping[str, Any]) -> None:
        self._built: dict[str, Any] = dict(built)
        self._names = [*_COMMANDS, *(n for n in built if n not in _COMMANDS)]

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in _COMMANDS:
                raise KeyError(name)
            self._built[name] = _build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(name)
        self._names.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class _Commands(TyperGroup):
    """The commands, run so that every one of them answers alike: a wrong command line
    (an unknown option, a value an option does not take) is one ``error:`` line and exit
    status 2, and Ctrl-C prints ``interrupted`` on stderr and exits with status 130
    (``--debug`` shows the traceback instead)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _LazyCommands(self.commands)

    def invoke(self, ctx: Any) -> Any:
        # the command line as given (click empties ctx's copy before the command runs)
        given = vars(ctx).get("_protected_args") or vars(ctx).get("protected_args") or []
        debug = "--debug" in [*given, *ctx.args]
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            if _debug_state.asked(debug):
                raise
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except _ClickUsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError" or _debug_state.asked(debug):
                raise
            command = getattr(getattr(exc, "ctx", None), "command_path", "stepstone")
            text = exc.format_message()  # type: ignore[attr-defined]
            _fail(f"{text.rstrip('.')}; see `{command} --help`", 2)


app = typer.Typer(
    cls=_Commands,
    help="stepstone: durable LLM-agent pipelines. Every step is committed before the next.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error.")]


def _version(value: bool) -> None:
    if value:
        from stepstone import __version__

        typer.echo(f"stepstone {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: DebugOption = False,
) -> None:
    """stepstone: durable LLM-agent pipelines. Every step is committed before the next."""
    _debug_state.state["on"] = debug


def _fail(message: str, code: int) -> None:
    from stepstone.cli._render import visible

    hint = "" if code == 2 else " (--debug shows the traceback)"
    # visible: a message may quote stored text (a newline, an escape sequence, invalid UTF-8)
    typer.echo(f"error: {visible(message)}{hint}", err=True)
    raise typer.Exit(code)


def main() -> None:
    """Entry point of the ``stepstone`` console script."""
    app(prog_name="stepstone")
