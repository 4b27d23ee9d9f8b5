"""Run records are reached only through the kernel, and ownership errors are caught by their
engine-neutral name.

Import-level layering is checked by import-linter in `make lint` (contracts in
pyproject.toml). What an import check cannot see is a module reaching a store's backend
through an attribute (``store.backend.run_get(...)``) or the facade's private
``_kernel_call``: only ``store/`` and ``durable/`` may do that (and ``stepstone.testing``,
whose conformance suite tests the backends themselves). See ARCHITECTURE.md, "Layers".
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "stepstone"
ALLOWED_DIRS = ("store", "durable", "testing")
BACKEND_ACCESS = re.compile(r"\.backend\.|\b_kernel_call\b")

# Today's exceptions, each to be replaced by a kernel call and then deleted from this list
# (a count may only go down; a file not listed may have none).
KNOWN_EXCEPTIONS: dict[str, int] = {
    "cli/_migrate.py": 3,  # migrate --dry-run lists and reads heads
    "cli/_ops.py": 2,  # vacuum and history
    "ui/_app.py": 1,  # the page names the store
    "runner.py": 2,  # Runner.checkpoints()/runs() read journals and list heads
    "cli/_runs.py": 3,  # `stepstone runs`/`inspect` list heads and tell values from runs
    "engines/graph/_checkpoint.py": 6,  # checkpointer load/list/delete and its _offload
    "engines/graph/_compiled.py": 2,  # the resumed record's head, and _offload
    "engines/plan/_plan.py": 7,  # claim, journal validation before the claim, prune_forks
    "engines/llm/_durable.py": 2,  # the agent run's journal read on resume
    "engines/replan/_engine.py": 4,  # claim and journal reads off the loop, as the Plan does
}


def _uses() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.split("/", 1)[0] in ALLOWED_DIRS:
            continue
        n = len(BACKEND_ACCESS.findall(path.read_text(encoding="utf-8")))
        if n:
            found[rel] = n
    return found


def test_the_pattern_sees_backend_access() -> None:
    assert BACKEND_ACCESS.search("head = cp.store.backend.run_get(key)")
    assert BACKEND_ACCESS.search("await store._kernel_call(fn)")
    # an engine's own off-loop rule is backend access too: stepstone.durable.blocking_call
    assert BACKEND_ACCESS.search("if cp.store.backend.blocking:")
    assert not BACKEND_ACCESS.search("backend = SQLiteBackend(path)")


def test_only_the_store_and_the_kernel_reach_backends() -> None:
    over = {
        rel: (n, KNOWN_EXCEPTIONS.get(rel, 0))
        for rel, n in _uses().items()
        if n > KNOWN_EXCEPTIONS.get(rel, 0)
    }
    assert not over, (
        "modules outside store/ and durable/ reaching store.backend or _kernel_call "
        f"(found, allowed): {over}; add the call you need to stepstone.durable instead"
    )


# The kernel raises ConcurrentPlanRunError only for runs of kind "plan" and the engine-neutral
# ConcurrentRunError for every other kind, so code outside the Plan engine that catches (or
# raises) the Plan-facing name would miss (or mislabel) other engines' ownership conflicts.
PLAN_FACING = re.compile(
    r"except\b[^:\n]*\bConcurrentPlanRunError\b|raise ConcurrentPlanRunError\("
)
PLAN_FACING_HOMES = ("engines/plan/", "exceptions.py")


def test_the_plan_facing_pattern() -> None:
    assert PLAN_FACING.search("        except ConcurrentPlanRunError:")
    assert PLAN_FACING.search("    except (ConcurrentPlanRunError, UserError) as exc:")
    assert PLAN_FACING.search("            raise ConcurrentPlanRunError(")
    assert not PLAN_FACING.search("        except ConcurrentRunError:")
    assert not PLAN_FACING.search("    ConcurrentPlanRunError: a live run owns the key.")


def test_other_engines_catch_the_engine_neutral_ownership_error() -> None:
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(PLAN_FACING_HOMES):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PLAN_FACING.search(line):
                wrong.append(f"{rel}:{number}: {line.strip()}")
    assert not wrong, (
        "catch or raise ConcurrentRunError (stepstone.durable.ownership_error(kind, message) "
        "picks the right class) instead of the Plan-facing ConcurrentPlanRunError:\n"
        + "\n".join(wrong)
    )
