"""``stepstone settle``: list the calls in doubt of a stopped run, or record what one did.

A tool declared ``in_doubt="fail"`` that was running when its process died stops its run
(``EffectInDoubtError``): only a person can find out whether the call took effect. This
command records the answer (:func:`stepstone.durable.settle_effect`); the run's next resume
continues from there.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from stepstone.cli._options import DbOption, DebugOption, JsonOption, UrlOption, fail, open_store
from stepstone.cli._render import key_table, keyed_console, named_key, visible_console
from stepstone.durable._settle import in_doubt_effects, settle_effect
from stepstone.store import Store

__all__ = ["settle_cmd"]


def _run_key(store: Store, key: str) -> str:
    """``key`` as typed (unescaped as the tables print it); an agent run's id when the store
    holds no run under ``key`` itself."""
    # the runner (agents, the LLM engine) loads only when a command settles an effect, not
    # on every start of the CLI
    from stepstone.runner import checkpoint_latest_key

    key = named_key(store, key)
    if key not in store and checkpoint_latest_key(key) in store:
        return checkpoint_latest_key(key)
    return key


def settle_cmd(
    key: Annotated[
        str,
        typer.Argument(help="The run: its key, an agent run's id, or the Plan a step of it ran."),
    ],
    effect: Annotated[
        str | None,
        typer.Argument(
            help="The call in doubt: its call id or position (tool:TURN:INDEX); leave it out "
            "to list them."
        ),
    ] = None,
    happened: Annotated[
        bool, typer.Option("--happened", help="It took effect; --result is what it returned.")
    ] = False,
    not_happened: Annotated[
        bool, typer.Option("--not-happened", help="It did not: the next resume runs it again.")
    ] = False,
    result: Annotated[
        str | None, typer.Option("--result", help="With --happened: the call's result (text).")
    ] = None,
    note: Annotated[
        str | None, typer.Option("--note", help="How you know, kept with the call's outcome.")
    ] = None,
    db: DbOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List a stopped run's calls in doubt, or settle one: --happened or --not-happened."""
    if effect is not None and happened == not_happened:
        fail(f"settle {effect}: pass --happened or --not-happened (what the call did)", 2)
    if effect is None and (happened or not_happened or result is not None):
        fail("name the call to settle (a call id or position), or leave the options out", 2)
    if result is not None and not happened:
        fail("--result goes with --happened: a call that did not happen has no result", 2)
    with open_store(db, url, debug=debug) as store:
        key = _run_key(store, key)
        if effect is None:
            doubts = in_doubt_effects(store, key)
            if as_json:
                sys.stdout.write(json.dumps(doubts, indent=2, ensure_ascii=False) + "\n")
                return
            keys = [d["run_key"] for d in doubts]
            table = key_table(keys, "run key", "position", "tool", "call id", "owner")
            for d in doubts:
                owner = "live" if d["live"] else "-"
                table.add_row(d["run_key"], d["position"], d["name"], d["call_id"] or "-", owner)
            keyed_console(keys, 100).print(table if doubts else f"{key}: no call in doubt")
            return
        done = settle_effect(
            store, key, effect, happened=happened, result=result if happened else None, note=note
        )
        if as_json:
            sys.stdout.write(json.dumps(done, indent=2, ensure_ascii=False) + "\n")
            return
        what = "happened" if happened else "did not happen"
        visible_console().print(
            f"{done['run_key']}: {done['name']} call {done['position']} settled as {what}; "
            f"the run is {done['status']}, and its next resume continues from there"
        )
