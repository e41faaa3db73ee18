"""Ownership of rows and blocks: deterministic, balanced, the same for every process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.jobstate.sharding import SlotMap, row_hash


def test_uniform_map_spreads_slots_evenly() -> None:
    m = SlotMap.uniform(256, 3)
    counts = np.bincount(np.array(m.owners))
    assert counts.max() - counts.min() <= 1 and m.shards == 3 and m.slots == 256


def test_rows_spread_across_shards_within_a_few_percent() -> None:
    m = SlotMap.uniform(256, 4)
    shards = m.shard_of_rows("user", np.arange(200_000, dtype=np.uint64))
    share = np.bincount(shards, minlength=4) / 200_000
    assert np.all(np.abs(share - 0.25) < 0.02)


def test_same_id_in_different_tables_may_land_on_different_shards() -> None:
    m = SlotMap.uniform(256, 8)
    ids = np.arange(1000, dtype=np.uint64)
    assert (m.shard_of_rows("user", ids) != m.shard_of_rows("ad", ids)).mean() > 0.5


def test_hash_is_stable_across_processes() -> None:
    here = row_hash("user", np.array([0, 1, 2**63], dtype=np.uint64)).tolist()
    code = ("import numpy as np; from jobstate.sharding import row_hash; "
            "print(row_hash('user', np.array([0, 1, 2**63], dtype=np.uint64)).tolist())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == str(here)


@pytest.mark.parametrize("shards", [1, 3, 16])  # a pass per shard up to 8, a sort beyond
def test_split_rows_groups_by_owner_and_keeps_every_row_in_order(shards: int) -> None:
    m = SlotMap.uniform(128, shards)
    ids = np.arange(1000, dtype=np.uint64)
    values = np.arange(1000 * 2, dtype=np.float32).reshape(1000, 2)
    parts = m.split_rows("t", ids, values)
    assert sum(len(i) for i, _ in parts.values()) == 1000
    for shard, (part_ids, part_values) in parts.items():
        assert np.all(m.shard_of_rows("t", part_ids) == shard)
        assert np.all(np.diff(part_ids.astype(np.int64)) > 0)
        assert np.array_equal(part_values[:, 0], part_ids.astype(np.float32) * 2)
        assert part_values.flags.c_contiguous


def test_block_owner_is_deterministic_and_json_round_trips() -> None:
    m = SlotMap.uniform(128, 2)
    again = SlotMap.from_json(m.to_json())
    assert again == m
    assert ([m.shard_of_block("fc1.weight", b) for b in range(5)]
            == [again.shard_of_block("fc1.weight", b) for b in range(5)])


@pytest.mark.parametrize("raw", [b"{}", b'{"v": 2, "owners": [0]}', b'{"v": 1, "owners": "x"}', b"nope"])
def test_bad_slot_map_json_is_rejected(raw: bytes) -> None:
    with pytest.raises(ValueError, match="SlotOwners"):
        SlotMap.from_json(raw)


def test_more_shards_than_slots_is_rejected() -> None:
    with pytest.raises(ValueError):
        SlotMap.uniform(2, 3)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9).flatmap(lambda start: st.tuples(
    st.lists(st.integers(0, start - 1), min_size=10, max_size=50).map(lambda rest: tuple(range(start)) + tuple(rest)),
    st.lists(st.integers(1, 9), min_size=1, max_size=4))))
def test_a_resize_moves_the_fewest_slots_and_leaves_every_shard_its_share(case) -> None:
    """From any map, grown or shrunk in any order: the shares differ by at most one slot, and
    no balanced map keeps more slots where they were."""
    owners, steps = case
    slots = len(owners)
    current = SlotMap(owners)
    for shards in steps:
        resized = current.resized(shards)
        counts = [len(resized.slots_of(s)) for s in range(shards)]
        assert resized.shards == shards and max(counts) - min(counts) <= 1 and min(counts) >= 1
        moved = sum(a != b for a, b in zip(current.owners, resized.owners))
        # The most slots any balanced map keeps in place: every staying shard up to the
        # smaller share, and one more on each of the (slots % shards) largest that have it.
        had = sorted((len(current.slots_of(s)) for s in range(min(shards, current.shards))), reverse=True)
        base = slots // shards
        kept = sum(min(n, base) for n in had) + sum(n > base for n in had[:slots % shards])
        assert moved == slots - kept, (current.owners, resized.owners)
        current = resized


def test_a_shard_that_joins_takes_a_share_from_each_and_the_others_keep_theirs() -> None:
    two = SlotMap.uniform(12, 2)
    three = two.resized(3)
    assert [len(three.slots_of(s)) for s in range(3)] == [4, 4, 4]
    assert set(three.slots_of(0)) <= set(two.slots_of(0)) and set(three.slots_of(1)) <= set(two.slots_of(1))
    assert three.resized(2).resized(2) == three.resized(2) and SlotMap.uniform(12, 2).resized(2) == two
    with pytest.raises(ValueError, match="12 slots cannot be spread over 13"):
        two.resized(13)


def test_every_resize_is_a_new_epoch() -> None:
    two = SlotMap.uniform(12, 2)
    three = two.resized(3)
    back = three.resized(2)
    assert (two.epoch, three.epoch, back.epoch) == (0, 1, 2)
    assert SlotMap.from_json(back.to_json()) == back


def test_a_resize_to_the_same_balanced_map_moves_nothing_and_keeps_the_epoch() -> None:
    three = SlotMap.uniform(12, 2).resized(3)
    assert three.resized(3) is three


def test_a_slot_map_written_before_epochs_reads_as_epoch_0() -> None:
    old = SlotMap.from_json(b'{"v": 1, "owners": [0, 1, 2, 0]}')
    assert (old.epoch, old.shards) == (0, 3)


@pytest.mark.parametrize("raw", [b'{"v": 1, "owners": [0], "epoch": -1}', b'{"v": 1, "owners": [0], "epoch": "1"}'])
def test_a_bad_epoch_is_named(raw: bytes) -> None:
    with pytest.raises(ValueError, match="SlotOwners.*epoch"):
        SlotMap.from_json(raw)
