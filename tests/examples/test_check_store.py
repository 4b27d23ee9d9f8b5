"""examples/check_store.py: a damaged copy of a store fails by name and checks unclean; a
byte changed inside a stored output is caught by its row's checksum."""

from __future__ import annotations

from pathlib import Path

from tests.examples._run import example_lines

DAMAGED = "damaged: database disk image is malformed (SQLITE_CORRUPT)"


def test_check_store_example(tmp_path: Path) -> None:
    # guarantees 154, 157, 353, 354
    lines = example_lines("check_store.py", tmp_path=tmp_path)
    assert lines == [
        "original: ok=True, 5 runs, 1 value",
        "resume on the copy: StoreDamagedError: 'copy.sqlite' is damaged: SQLite says "
        "database disk image is malformed (SQLITE_CORRUPT)",
        "steps run by that resume: 0",
        "the setting still reads: {'retries': 3}",
        "copy: ok=False, 6 problems",
        "  file: database disk image is malformed (SQLITE_CORRUPT)",
        *[f"  record nightly-11-{day}: {DAMAGED}" for day in range(19, 24)],
        "stepstone check --db copy.sqlite: exit status 1",
        "resume of a flipped byte: CheckpointCorruptError: record 'nightly-11-21' is corrupt: "
        "journal row 2 does not match its checksum (its bytes changed after it was written: "
        "a damaged disk, or the file edited outside SQLite)",
        "steps run by that resume: 0",
        "flipped: ok=False, problems in ['nightly-11-21']",
        "its journal: ['extract', 'damaged']",
        "what to do: rewind it to before the damage with `stepstone retry nightly-11-21 "
        "--from extract` (that step and the ones after it run again on resume)",
        "after the rewind, the resume ran ['extract', 'load']: loaded 3 rows of 11-21",
        "flipped, rewound: ok=True",
    ]
