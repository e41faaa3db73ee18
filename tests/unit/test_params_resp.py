"""The compiled MSET and MGET are byte for byte what redis-py would send for the same rows,
in the order of the ids given."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.connection import Connection

from streamtrain.params import resp
from streamtrain.schemas import encode_rows, encode_rows_matrix


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 2), min_size=1, max_size=50, unique=True), st.integers(1, 8))
@example([0, 9, 10, 99, 100, 2**64 - 2], 1)  # each number of digits' edge
def test_mset_equals_redis_py_packing(ids: list[int], dim: int) -> None:
    values = np.random.default_rng(len(ids)).normal(size=(len(ids), dim)).astype(np.float32)
    prefix = "st:job:row:emb:"
    args = []
    for i, row in zip(ids, encode_rows(values)):
        args += [f"{prefix}{i}", row]
    expected = b"".join(Connection().pack_command("MSET", *args))
    assert resp.mset(prefix.encode(), np.array(ids, dtype=np.uint64), encode_rows_matrix(values)) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.sampled_from(["", "p:", "x" * 120]))
@example([2**64 - 1, 0, 1234567], "st:job:row:emb:")
def test_mget_equals_redis_py_packing_in_the_order_given(ids: list[int], prefix: str) -> None:
    expected = b"".join(Connection().pack_command("MGET", *[f"{prefix}{i}" for i in ids]))
    assert resp.mget(prefix.encode(), np.array(ids, dtype=np.uint64)) == expected
