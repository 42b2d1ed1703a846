"""Names that belong to credentials, as the store keeps them: claimed once by the first credential, the same row
for every later claim, reassigned only by an explicit call, kept across a reopen, paged in claim order, and let
go by kind inside another module's transaction (an Atropos reset)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farmd import names
from farmd.errors import BadRequest, NameHeld
from farmd.store import Store
from farmd.store.names import forget_in


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "farm.db")
    yield s
    await s.close()


async def test_a_name_is_its_first_claimants_and_survives_a_reopen(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        assert await store.names.holder("consumer", "grpo") is None
        first = await store.names.claim("consumer", "grpo", "alice")
        assert (first.credential, first.assigned_by) == ("alice", "")
        again = await store.names.claim("consumer", "grpo", "bob")
        assert again == first, "a second claim reads the first's row, changes nothing"
        # The same name of another kind is another name.
        assert (await store.names.claim("node", "grpo", "bob")).credential == "bob"
        # Claims racing for one name: exactly one wins, every one reads the winner.
        rows = await asyncio.gather(*(store.names.claim("consumer", "race", f"c{i}") for i in range(8)))
        assert len({r.credential for r in rows}) == 1
    finally:
        await store.close()
    store = await Store.open(tmp_path / "farm.db")
    try:
        held = await store.names.holder("consumer", "grpo")
        assert held is not None and held.credential == "alice", "a restart hands no name to whoever speaks first"
    finally:
        await store.close()


async def test_bind_claims_once_and_refuses_everyone_else_by_name(store: Store) -> None:
    await names.bind(store.names, names.CONSUMER, "grpo", "alice")
    await names.bind(store.names, names.CONSUMER, "grpo", "alice")
    with pytest.raises(NameHeld) as refused:
        await names.bind(store.names, names.CONSUMER, "grpo", "bob")
    assert (refused.value.kind, refused.value.name, refused.value.holder) == ("consumer", "grpo", "alice")
    assert refused.value.reason == "NAME_HELD"
    assert "consumer 'grpo' belongs to credential 'alice', not to credential 'bob'" in str(refused.value)
    assert "farmctl names reassign" in str(refused.value)


async def test_only_a_reassignment_moves_a_name_and_it_says_who_gave_it(store: Store) -> None:
    await store.names.claim("atropos-env", "0", "env-a")
    row, before = await store.names.reassign("atropos-env", "0", "env-b", "ops")
    assert (row.credential, row.assigned_by, before) == ("env-b", "ops", "env-a")
    with pytest.raises(NameHeld):
        await names.bind(store.names, names.ATROPOS_ENV, "0", "env-a")
    await names.bind(store.names, names.ATROPOS_ENV, "0", "env-b")
    fresh, nobody = await store.names.reassign("node", "gpu-7", "nodes-2", "ops")
    assert (fresh.credential, nobody) == ("nodes-2", ""), "a name nobody used yet can be given ahead"


async def test_names_page_in_claim_order_and_by_kind(store: Store) -> None:
    for i in range(5):
        await store.names.claim("consumer", f"c{i}", "t")
        await store.names.claim("node", f"n{i}", "n")
    first = await store.names.listing(None, 0, 3)
    assert [r.name for _, r in first] == ["c0", "n0", "c1"]
    rest = await store.names.listing(None, first[-1][0], 100)
    assert [r.name for _, r in rest] == ["n1", "c2", "n2", "c3", "n3", "c4", "n4"]
    assert [r.name for _, r in await store.names.listing("node", 0, 100)] == [f"n{i}" for i in range(5)]


async def test_a_kind_is_forgotten_inside_anothers_transaction_and_rolls_back_with_it(store: Store) -> None:
    await store.names.claim("atropos-env", "0", "a")
    await store.names.claim("atropos-trainer", "trainer", "t")
    await store.names.claim("consumer", "keep", "t")
    with pytest.raises(RuntimeError):
        async with store.db.write() as db:
            await forget_in(db, ("atropos-env", "atropos-trainer"))
            raise RuntimeError("the transaction fails after")
    assert await store.names.holder("atropos-env", "0") is not None, "rolled back with the rest"
    async with store.db.write() as db:
        assert await forget_in(db, ("atropos-env", "atropos-trainer")) == 2
    assert await store.names.holder("atropos-env", "0") is None
    assert await store.names.holder("atropos-trainer", "trainer") is None
    assert await store.names.holder("consumer", "keep") is not None


def test_each_kind_says_what_its_names_look_like() -> None:
    assert names.check("node", "gpu-07") == "gpu-07"
    assert names.check("atropos-env", "12") == "12"
    assert names.check("atropos-trainer", "trainer") == "trainer"
    assert names.check("atropos-name", "atropos:gsm8k_v2") == "atropos:gsm8k_v2"
    for kind, name in (("node", "-x"), ("node", "a:b"), ("atropos-env", "-1"), ("atropos-env", "01"),
                       ("atropos-trainer", "other"), ("atropos-name", "atropos"), ("atropos-name", "math"), ("consumer", ""), ("consumer", " x"), ("consumer", "x" * 201),
                       ("cursor", "x")):
        with pytest.raises(BadRequest):
            names.check(kind, name)
