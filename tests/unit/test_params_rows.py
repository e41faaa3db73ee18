"""The shard's row store: id index, deterministic initialisation, growth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.jobstate.sharding import mix64, name_salt
from streamtrain.params.optimizers import make_rule
from streamtrain.params.rows import DIRECT_IDS, IdIndex, RowTable, distinct, initial_rows


@settings(max_examples=50, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 2**64 - 2), max_size=300), max_size=8))
def test_index_finds_every_inserted_id_and_nothing_else(batches) -> None:
    index, reference = IdIndex(16), {}
    for batch in batches:
        ids = np.unique(np.array(batch, dtype=np.uint64))
        new = ids[index.lookup(ids) < 0]
        rows = np.arange(len(reference), len(reference) + len(new))
        index.insert(new, rows)
        reference.update(zip(new.tolist(), rows.tolist()))
    probe = np.array(list(reference) + [12345678901234567], dtype=np.uint64)
    found = index.lookup(probe)
    assert found[:-1].tolist() == list(reference.values())
    assert found[-1] == (reference.get(12345678901234567, -1))


def test_index_grows_and_keeps_every_mapping() -> None:
    index = IdIndex(16)
    ids = np.arange(0, 200_000, 3, dtype=np.uint64) + np.uint64(DIRECT_IDS)  # the probing part
    index.insert(ids, np.arange(len(ids)))
    assert index.capacity >= 2 * len(ids)
    assert np.array_equal(index.lookup(ids), np.arange(len(ids)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=40), st.integers(1, 12),
       st.sampled_from([0.01, 0.1, 1e-4, 0.3333]), st.sampled_from(["user", "deep+wide", "x"]))
def test_initial_rows_are_the_splitmix_formula_to_the_bit(ids: list[int], dim: int, scale: float, table: str) -> None:
    """The compiled pass must give the bits of the formula it stands for: every process
    creates an untrained row from it, and a shard's and a trainer's must agree."""
    ids_a = np.array(ids, dtype=np.uint64)
    counters = (ids_a ^ name_salt(table))[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)
    unit = (mix64(counters) >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    expected = unit * np.float32(2 * scale) - np.float32(scale)
    got = initial_rows(table, ids_a, dim, scale)
    assert got.dtype == np.float32 and got.shape == (len(ids), dim)
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def test_initial_rows_depend_only_on_table_and_id() -> None:
    a = initial_rows("user", np.array([5, 9], dtype=np.uint64), 16, 0.1)
    b = initial_rows("user", np.array([9, 5], dtype=np.uint64), 16, 0.1)
    assert np.array_equal(a[::-1], b)
    assert not np.array_equal(a, initial_rows("ad", np.array([5, 9], dtype=np.uint64), 16, 0.1))
    assert np.all(np.abs(a) <= 0.1) and a.std() > 0.02


def test_table_creates_rows_on_first_touch_and_reuses_them() -> None:
    table = RowTable("user", 4, ("sum",), capacity=2)
    first = table.rows_for(np.array([7, 3, 11], dtype=np.uint64))
    again = table.rows_for(np.array([11, 7, 42], dtype=np.uint64))
    assert again[:2].tolist() == [first[2], first[0]] and again[2] == 3
    assert table.size == 4
    assert np.array_equal(table.values[again[2]], initial_rows("user", np.array([42], dtype=np.uint64), 4, 0.01)[0])
    assert np.all(table.state["sum"][: table.size] == 0)


def test_ids_below_and_above_the_direct_range_map_alike() -> None:
    rng = np.random.default_rng(1)
    small = np.unique(rng.integers(0, DIRECT_IDS, 400)).astype(np.uint64)
    large = np.unique(rng.integers(DIRECT_IDS, 2**63, 400)).astype(np.uint64)
    ids = np.concatenate([small, large, np.array([DIRECT_IDS - 1, DIRECT_IDS], dtype=np.uint64)])
    rng.shuffle(ids)
    index = IdIndex(capacity=16)  # the probing part grows as well
    index.insert(ids[:500], np.arange(500))
    found = index.lookup(ids)
    assert found[:500].tolist() == list(range(500)) and (found[500:] == -1).all()
    assert index.size == 500


class _GatheredOnly:
    """A built-in rule seen as a user's rule would be: `apply` on gathered copies only."""

    def __init__(self, rule) -> None:
        self.rule, self.name, self.state_names = rule, rule.name, rule.state_names
        self.clock = getattr(rule, "clock", "row")

    def apply(self, rows, grads, state, steps) -> None:
        self.rule.apply(rows, grads, state, steps)


@pytest.mark.parametrize("spec", ["sgd", "adagrad", "adam", "ftrl"])
def test_rows_updated_in_place_equal_the_gathered_copies_path(spec: str) -> None:
    rule = make_rule(spec, lr=0.05)
    rng = np.random.default_rng(3)
    in_place = RowTable("t", 8, rule.state_names, capacity=4)
    gathered = RowTable("t", 8, rule.state_names, capacity=4)
    for _ in range(5):
        ids = np.unique(rng.integers(0, 50, 20)).astype(np.uint64)
        grads = rng.standard_normal((len(ids), 8)).astype(np.float32)
        a = in_place.update(in_place.rows_for(ids), grads, rule)
        b = gathered.update(gathered.rows_for(ids), grads, _GatheredOnly(rule))
        assert np.array_equal(a, b)
    assert np.array_equal(in_place.values, gathered.values)
    for name in rule.state_names:
        assert np.array_equal(in_place.state[name], gathered.state[name])


def test_a_subclass_of_a_built_in_that_overrides_apply_is_applied_by_its_apply() -> None:
    from streamtrain.params.optimizers import SGD

    class Doubled(SGD):
        def apply(self, rows, grads, state, steps) -> None:
            super().apply(rows, grads * 2, state, steps)

    table = RowTable("t", 2, (), capacity=4, init_scale=0.0)
    rows = table.rows_for(np.array([1], dtype=np.uint64))
    table.update(rows, np.ones((1, 2), dtype=np.float32), Doubled(lr=0.5))
    assert table.values[rows[0]].tolist() == [-1.0, -1.0]


def test_gradients_of_the_wrong_shape_are_refused_naming_the_table() -> None:
    table = RowTable("user", 4, (), capacity=4)
    rows = table.rows_for(np.array([1, 2], dtype=np.uint64))
    with pytest.raises(ValueError, match="table 'user'.*float32 \\(2, 4\\)"):
        table.update(rows, np.zeros((2, 3), dtype=np.float32), make_rule("sgd", lr=0.1))


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300))
def test_distinct_is_np_unique(values) -> None:
    ids = np.array(values, dtype=np.uint64)
    out = distinct(ids)
    assert out.dtype == np.uint64 and np.array_equal(out, np.unique(ids))
