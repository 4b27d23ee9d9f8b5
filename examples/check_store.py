"""A damaged store file: what fails, what still reads, and `stepstone check`.

Five nightly ETL runs and a setting go into a SQLite store (in a temporary directory).
A copy of the file is then damaged the way a failing disk damages one: the first page of
the table holding the runs' journals is overwritten. On the damaged copy:

* resuming a run raises StoreDamagedError, naming the file and how to recover it, and
  runs no step;
* the plain value, whose table is sound, still reads;
* ``check_store`` (and ``stepstone check``, run as a command) lists every run it cannot
  read, while the sound original checks clean.

A second copy has one byte changed inside one run's stored step output (its "loaded 3
rows" becomes "loaded 8 rows"): SQLite's pages are sound and the output still decodes, but
the row no longer matches its checksum, so resuming that run raises CheckpointCorruptError
and runs no step, and the check names that run alone. The run is not lost: its journal
shows the damaged row in its place, ``retry_run`` (``stepstone retry``) rewinds the run to
the step before it, and the next resume runs that step and the damaged one again.

Usage: python examples/check_store.py
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from stepstone import Agent, CheckpointCorruptError, Plan, Step, Store, StoreDamagedError
from stepstone.durable import retry_run, run_detail
from stepstone.store import check_store

steps_run: list[str] = []


def extract(day: str) -> dict[str, object]:
    steps_run.append("extract")
    return {"day": day, "rows": 3}


def load(batch: dict[str, object]) -> str:
    steps_run.append("load")
    return f"loaded {batch['rows']} rows of {batch['day']}"


def nightly(store: Store, day: str) -> Agent:
    plan = Plan(
        Step(extract), Step(load), store=store, checkpoint_key=f"nightly-{day}", resume=True
    )
    return Agent(engine=plan)


def damage(db: Path, table: str) -> None:
    """Overwrite the first bytes of ``table``'s root page, as a failing disk would."""
    con = sqlite3.connect(db)
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(db, "r+b") as fh:
        fh.seek((root[0] - 1) * page_size)
        fh.write(b"\xff" * 16)


def flip(db: Path, stored: bytes, old: bytes, new: bytes) -> None:
    """Change ``old`` to ``new`` inside the one place ``stored`` is in ``db``, as a flipped
    bit would (a closed store: its WAL is folded into the file)."""
    data = db.read_bytes()
    assert data.count(stored) == 1, stored
    at = data.index(stored)
    db.write_bytes(data[:at] + stored.replace(old, new) + data[at + len(stored) :])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="stepstone-example-") as tmp:
        original, copy = Path(tmp) / "runs.sqlite", Path(tmp) / "copy.sqlite"
        with Store(db=original) as store:
            for day in ("11-19", "11-20", "11-21", "11-22", "11-23"):
                nightly(store, day)(day)
            store.write("setting", {"retries": 3})
        shutil.copy(original, copy)
        damage(copy, "stepstone_journal")

        with Store(db=original, read_only=True) as store:
            report = check_store(store)
        print(f"original: ok={report.ok}, {report.runs} runs, {report.values} value")

        steps_run.clear()
        with Store(db=copy) as store:
            try:
                nightly(store, "11-23")("11-23")
            except StoreDamagedError as exc:
                first = str(exc).split(";")[0].replace(str(copy), copy.name)
                print(f"resume on the copy: StoreDamagedError: {first}")
            print(f"steps run by that resume: {len(steps_run)}")
            print(f"the setting still reads: {store.read('setting')}")

        with Store(db=copy, read_only=True) as store:
            report = check_store(store)
        print(f"copy: ok={report.ok}, {len(report.problems)} problems")
        for problem in report.problems:
            where = problem.where if problem.key is None else f"{problem.where} {problem.key}"
            print(f"  {where}: {problem.detail}")

        cli = subprocess.run(
            [sys.executable, "-m", "stepstone.cli", "check", "--db", str(copy)],
            capture_output=True,
            text=True,
        )
        print(f"stepstone check --db copy.sqlite: exit status {cli.returncode}")

        flipped = Path(tmp) / "flipped.sqlite"
        shutil.copy(original, flipped)
        flip(flipped, b'"loaded 3 rows of 11-21"', b"3", b"8")
        steps_run.clear()
        with Store(db=flipped) as store:
            try:
                nightly(store, "11-21")("11-21")
            except CheckpointCorruptError as exc:
                print(f"resume of a flipped byte: CheckpointCorruptError: {str(exc).split('.')[0]}")
            print(f"steps run by that resume: {len(steps_run)}")
            report = check_store(store)
            print(f"flipped: ok={report.ok}, problems in {[p.key for p in report.problems]}")

            # What is left, and the way on: rewind the run to the step before the damage.
            detail = run_detail(store, "nightly-11-21")
            assert detail is not None
            print(f"its journal: {[e['name'] or e['kind'] for e in detail['timeline']]}")
            print(f"what to do: {detail['corrupt'].split('; ')[1]}")
            retry_run(store, "nightly-11-21", from_step="extract")
            env = nightly(store, "11-21")("11-21")
            print(f"after the rewind, the resume ran {steps_run}: {env.payload}")
            print(f"flipped, rewound: ok={check_store(store).ok}")


if __name__ == "__main__":
    main()
