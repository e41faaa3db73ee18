"""The compiled JSON pass (trainer/jsonscan.py): it takes a chunk whole or not at all, and what
it takes decodes as the one-record decoder decodes it."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder
from streamtrain.trainer.jsonscan import JsonScan
from tests.unit.test_trainer_parts import assert_chunk_decodes_as_one_by_one

FIELDS = ("user", "ad")


def section():
    return JobConfig.from_toml('[job]\nname = "j"\n[input]\ntopics = ["t"]').input


def canonical(i: int) -> bytes:
    return Example({"user": (i,), "ad": (i, 2**64 - 1)}, (0.1 * i, -1.5), float(i % 2), 1_700_000_000_000 + i).to_json()


def test_the_writers_records_are_scanned_whole_with_the_one_record_decoders_values(monkeypatch) -> None:
    decoder = ChunkDecoder(section(), FIELDS, 2)
    for slower in ("_arrow", "_fast"):
        monkeypatch.setattr(decoder, slower, None)
    monkeypatch.setattr(decoder, "_one", lambda value: pytest.fail(f"{value!r} went one by one"))
    values = [canonical(i) for i in range(300)]
    decoded = decoder.decode(values)
    assert len(decoded.columns) == 300 and not decoded.bad
    ids, counts = decoded.columns.sparse[1]
    assert ids[:4].tolist() == [0, 2**64 - 1, 1, 2**64 - 1] and counts[:2].tolist() == [2, 2]
    # 0.1 * 3 is 0.30000000000000004: its shortest text parses back to the same double.
    assert decoded.columns.dense[3].tolist() == [np.float32(0.1 * 3), -1.5]
    assert decoded.columns.event_time_ms[-1] == 1_700_000_000_299
    assert_chunk_decodes_as_one_by_one(section(), FIELDS, values)


@pytest.mark.parametrize("record", [
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5,"extra":0}',  # a key unknown
    b'{"v":1,"sparse":{"user":[1]},"dense":[1,2],"label":1,"ts":5}',  # a field left out
    b'{"v":1,"sparse":{"user":[1],"ad":[2],"os":[3]},"dense":[1,2],"label":1,"ts":5}',  # a field not declared
    b'{"v":1,"sparse":{"user":[1],"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',  # a field twice
    b'{"v":1,"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',  # a key twice
    b'{"v":1,"sparse":{"us\\u0065r":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',  # an escape in a key
    b'{"v":1.0,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[01],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',  # a leading zero
    b'{"v":1,"sparse":{"user":[1.0],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[1e2],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[-1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[18446744073709551616],"ad":[2]},"dense":[1,2],"label":1,"ts":5}',  # 2^64
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2,3],"label":1,"ts":5}',  # too wide
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,NaN],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,1e999],"label":1,"ts":5}',  # beyond a double
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,3.5e38],"label":1,"ts":5}',  # beyond a float32
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,.5],"label":1,"ts":5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1.5,"ts":5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":true,"ts":5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":-5}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":9223372036854775808}',  # 2^63
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5.0}',
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5}x',  # after the object
    b'{"v":1,"sparse":{"user":[1],"ad":[2]},"dense":[1,2],"label":1,"ts":5',  # never closed
    b'{"v":1,"sparse":{"user":[1],"ad":[2],},"dense":[1,2],"label":1,"ts":5}',  # a trailing comma
    b'[1]', b'null', b'', b'\xff',
])
def test_a_chunk_with_any_record_the_scan_does_not_take_is_left_whole_to_the_other_paths(record) -> None:
    values = [canonical(1), record, canonical(2)]
    assert JsonScan(FIELDS, 2).parse(values) is None
    assert JsonScan(FIELDS, 2).parse([canonical(1), canonical(2)]) is not None
    assert_chunk_decodes_as_one_by_one(section(), FIELDS, values)


def test_a_record_without_a_value_leaves_the_chunk_to_the_other_paths() -> None:
    assert JsonScan(FIELDS, 2).parse([canonical(1), None]) is None


_numbers = st.one_of(st.floats(-1e6, 1e6), st.integers(-10**6, 10**6), st.sampled_from([-0.0, 1e-320, 5e-324]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "user": st.lists(st.integers(0, 2**64 - 1), max_size=3),
    "ad": st.lists(st.integers(0, 2**64 - 1), max_size=3),
    "dense": st.lists(_numbers, min_size=2, max_size=2),
    "label": st.one_of(st.floats(0, 1), st.sampled_from([0, 1, 0.0, 1.0, 1e-300])),
    "ts": st.integers(0, 2**63 - 1),
}), min_size=1, max_size=6), st.randoms(), st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :\t")]),
    st.sampled_from([None, 1]))
def test_any_layout_of_the_documents_decodes_as_one_by_one(docs, rng: random.Random, separators, indent) -> None:
    """Key order, whitespace and number spellings a JSON writer may choose: the scan takes
    them all, with the one-record decoder's values."""
    values = []
    for d in docs:
        sparse = {"user": d["user"], "ad": d["ad"]}
        top = {"v": 1, "sparse": dict(rng.sample(sorted(sparse.items()), 2)), "dense": d["dense"],
               "label": d["label"], "ts": d["ts"]}
        top = dict(rng.sample(sorted(top.items()), len(top)))
        values.append(json.dumps(top, separators=separators, indent=indent).encode())
    assert JsonScan(FIELDS, 2).parse(values) is not None
    assert_chunk_decodes_as_one_by_one(section(), FIELDS, values)
