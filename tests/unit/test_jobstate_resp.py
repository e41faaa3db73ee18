"""The numpy-built MSET and MGET are byte for byte what redis-py would send for the same rows
(the keys grouped by the number of digits of their id)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Connection

from streamtrain.jobstate import resp
from streamtrain.schemas import encode_rows, encode_rows_matrix


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 2), min_size=1, max_size=50, unique=True), st.integers(1, 8))
def test_mset_equals_redis_py_packing(ids: list[int], dim: int) -> None:
    values = np.random.default_rng(len(ids)).normal(size=(len(ids), dim)).astype(np.float32)
    prefix = "st:job:row:emb:"
    args = []
    # Grouped by the number of digits of the id, in their order within a group.
    for i, row in sorted(zip(ids, encode_rows(values)), key=lambda pair: len(str(pair[0]))):
        args += [f"{prefix}{i}", row]
    expected = b"".join(Connection().pack_command("MSET", *args))
    got = resp.mset(prefix.encode(), np.array(ids, dtype=np.uint64), encode_rows_matrix(values))
    assert got == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50))
def test_mget_equals_redis_py_packing_in_the_order_it_names(ids: list[int]) -> None:
    prefix = "st:job:row:emb:"
    got, order = resp.mget(prefix.encode(), np.array(ids, dtype=np.uint64))
    # Grouped by the number of digits of the id, in their order within a group.
    expected_order = sorted(range(len(ids)), key=lambda i: len(str(ids[i])))
    assert (list(range(len(ids))) if order is None else order.tolist()) == expected_order
    expected = b"".join(Connection().pack_command("MGET", *[f"{prefix}{ids[i]}" for i in expected_order]))
    assert got == expected
