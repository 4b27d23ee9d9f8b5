"""How long a key can be: the same limit in every store (guarantee 391).

PostgreSQL cannot index a key much over 2,700 bytes; SQLite could keep any. A key is
refused over 2,048 bytes of UTF-8 in every store, before anything is written, so what works
on the embedded store works on PostgreSQL as it is; a key at the limit works in all of
them, and what an older version stored under a longer key stays readable."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stepstone import Agent, ConfigurationError, Plan, PlanCompileError, Step, Store, submit
from stepstone.durable import claim_run, fork_run
from stepstone.store import MAX_KEY_BYTES


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        s = Store()
    elif request.param == "sqlite":
        s = Store(db=tmp_path / "k.sqlite")
    else:
        url = request.getfixturevalue("pg_url")
        s = Store(url=url)
        s.setup()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE stepstone_kv, stepstone_runs, stepstone_journal")
            conn.execute("TRUNCATE stepstone_queue")
    yield s
    s.close()


def random_key(n_bytes: int, seed: int) -> str:
    """A key of exactly ``n_bytes`` UTF-8 bytes that does not compress: random letters of
    1, 2, 3 and 4 bytes, padded with ASCII (PostgreSQL compresses a long index entry, so a
    repetitive key would prove nothing)."""
    rng = random.Random(seed)
    alphabet = [chr(c) for c in [*range(0x21, 0x7F), *range(0xC0, 0x250), *range(0x4E00, 0x4F00)]]
    alphabet += [chr(c) for c in range(0x1F600, 0x1F640)]
    parts: list[str] = []
    size = 0
    while True:
        ch = rng.choice(alphabet)
        if size + len(ch.encode()) > n_bytes:
            break
        parts.append(ch)
        size += len(ch.encode())
    parts.append("x" * (n_bytes - size))
    key = "".join(parts)
    assert len(key.encode()) == n_bytes
    return key


def _plan(store: Store, key: str, writes: str) -> Plan:
    return Plan(
        Step(lambda p: "one", name="a", writes=writes),
        Step(lambda p: "two", name="b"),
        store=store,
        checkpoint_key=key,
    )


def test_a_key_at_the_limit_works_in_every_store(store: Store) -> None:
    # guarantee 391
    key, other = random_key(MAX_KEY_BYTES, 1), random_key(MAX_KEY_BYTES, 2)
    store.write(key, {"v": 1})
    assert store.read(key) == {"v": 1}
    assert store.compare_and_swap(key, {"v": 1}, {"v": 2})
    assert store.delete(key)
    env = Agent(engine=_plan(store, key, other))("go")
    assert env.ok, env.error
    assert store.read(other) == "one"
    assert store.read(key)["status"] == "done"
    fork_run(store, key, at="a", to=random_key(MAX_KEY_BYTES, 3))
    assert sorted(store.keys()) == sorted([key, other, random_key(MAX_KEY_BYTES, 3)])
    if store.backend.describe() != "memory":  # (the queue needs a database)
        handle = submit(
            store,
            "tests.workers.targets:plan",
            "t",
            key=random_key(MAX_KEY_BYTES, 5),
            dedupe_key=random_key(MAX_KEY_BYTES, 6),
            queue=random_key(MAX_KEY_BYTES, 7),
        )
        assert handle.status() == "queued"


def test_a_longer_key_is_refused_before_anything_is_written(store: Store) -> None:
    # guarantee 391
    long = random_key(MAX_KEY_BYTES + 1, 4)
    said = rf"{MAX_KEY_BYTES + 1} bytes long in UTF-8, over the {MAX_KEY_BYTES}"
    for write in (
        lambda: store.write(long, 1),
        lambda: store.compare_and_swap(long, None, 1),
        lambda: asyncio.run(store.awrite(long, 1)),
        lambda: claim_run(store, long, kind="plan", resume=False, first_step="a"),
    ):
        with pytest.raises(ValueError, match=said) as caught:
            write()
        assert len(str(caught.value)) < 600  # the key is cut in the message, not echoed
    with pytest.raises(PlanCompileError, match=rf"checkpoint_key .*{said}"):
        _plan(store, long, "w")
    with pytest.raises(PlanCompileError, match=rf"step 'a': writes=.*{said}"):
        _plan(store, "k", long)
    assert Agent(engine=_plan(store, "k", "w"))("go").ok
    with pytest.raises(ValueError, match=said):
        fork_run(store, "k", at="a", to=long)
    for option in ("key", "dedupe_key", "queue"):
        with pytest.raises(ConfigurationError, match=rf"{option} .*{said}"):
            submit(store, "tests.workers.targets:plan", "t", **{option: long})
    assert sorted(store.keys()) == ["k", "w"]


def test_a_key_the_limit_counts_in_bytes_not_characters(store: Store) -> None:
    # guarantee 391: 700 characters of 3 bytes each are 2,100 bytes
    with pytest.raises(ValueError, match="2100 bytes long"):
        store.write("\u4e00" * 700, 1)
    store.write("\u4e00" * 682, 1)  # 2,046 bytes
    assert store.read("\u4e00" * 682) == 1


def test_a_longer_key_an_older_version_stored_stays_readable(tmp_path: Path) -> None:
    # guarantee 391: SQLite kept any length before the limit; such a value is read and
    # deleted as before (the backend call below is what an older version's write made)
    long = "legacy:" + "k" * 5000
    with Store(db=tmp_path / "old.sqlite") as store:
        store.backend.kv_put(long, '{"kept": true}')
    with Store(db=tmp_path / "old.sqlite") as store:
        assert store.read(long) == {"kept": True}
        assert store.keys() == [long]
        assert store.delete(long)
