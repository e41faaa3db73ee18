import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import Example, SchemaError

FAST = settings(max_examples=60, deadline=None)

names = st.text(min_size=1, max_size=12).filter(lambda s: len(s.encode()) <= 255)
ids = st.lists(st.integers(0, 2**64 - 1), max_size=6)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
examples = st.builds(
    Example,
    sparse=st.dictionaries(names, ids, max_size=4),
    dense=st.lists(finite32, max_size=8).map(tuple),
    label=st.floats(allow_nan=False, allow_infinity=False),
    event_time_ms=st.integers(0, 2**63 - 1),
)


def small() -> Example:
    return Example({"user": (7, 2**64 - 1), "ad": (3,)}, (0.5, -2.0), 1.0, 1_700_000_000_000)


def raises_naming(field, fn, *args):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    err = info.value
    assert err.format == "Example"
    assert err.field == field
    assert f"'{field}'" in str(err) and "Example" in str(err)
    return err


@FAST
@given(examples)
def test_example_round_trips_through_json(example):
    assert Example.from_json(example.to_json()) == example
    assert Example.from_json(example.to_json().decode()) == example


@FAST
@given(examples)
def test_example_round_trips_through_binary(example):
    assert Example.from_bytes(example.to_bytes()) == example


@FAST
@given(st.lists(st.floats(-3e38, 3e38), max_size=8))
def test_dense_is_rounded_to_float32_so_round_trips_compare_equal(dense):
    example = Example({}, dense, 0.0, 0)
    assert example.dense == tuple(np.array(dense, dtype=np.float32).tolist())
    assert Example.from_bytes(example.to_bytes()) == example
    assert Example.from_json(example.to_json()) == example


def test_sparse_is_read_only_sorted_and_holds_tuples():
    example = Example({"b": [2], "a": np.array([1, 3], dtype=np.int64)}, (), 0.0, 0)
    assert list(example.sparse) == ["a", "b"]
    assert example.sparse["a"] == (1, 3)
    with pytest.raises(TypeError):
        example.sparse["c"] = (1,)


def test_json_form_has_the_documented_keys():
    doc = json.loads(small().to_json())
    assert doc == {"v": 1, "sparse": {"ad": [3], "user": [7, 2**64 - 1]}, "dense": [0.5, -2.0], "label": 1.0,
                   "ts": 1_700_000_000_000}


def test_binary_form_starts_with_magic_and_version():
    assert small().to_bytes()[:3] == b"SX\x01"


@pytest.mark.parametrize("cut", range(len(small().to_bytes())))
def test_truncated_example_raises_schema_error_naming_the_field(cut):
    with pytest.raises(SchemaError) as info:
        Example.from_bytes(small().to_bytes()[:cut])
    assert "truncated" in info.value.reason
    assert f"'{info.value.field}'" in str(info.value)


def test_truncation_inside_the_ids_names_the_sparse_field():
    data = small().to_bytes()
    raises_naming("sparse.user", Example.from_bytes, data[:-3])


def test_unknown_binary_version_raises_schema_error():
    data = bytearray(small().to_bytes())
    data[2] = 9
    err = raises_naming("version", Example.from_bytes, bytes(data))
    assert "9" in err.reason


def test_wrong_magic_raises_schema_error():
    raises_naming("magic", Example.from_bytes, b"XX" + small().to_bytes()[2:])


def test_nonzero_reserved_byte_raises_schema_error():
    data = bytearray(small().to_bytes())
    data[3] = 1
    raises_naming("header", Example.from_bytes, bytes(data))


def test_trailing_bytes_raise_schema_error():
    raises_naming("$", Example.from_bytes, small().to_bytes() + b"\0")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_dense_value_in_binary_raises_naming_the_element(bad):
    data = small().to_bytes().replace(struct.pack("<f", -2.0), struct.pack("<f", bad))
    err = raises_naming("dense[1]", Example.from_bytes, data)
    assert ("NaN" if math.isnan(bad) else "inf") in err.reason


def test_non_finite_label_in_binary_raises_schema_error():
    data = small().to_bytes().replace(struct.pack("<d", 1.0), struct.pack("<d", math.nan))
    raises_naming("label", Example.from_bytes, data)


def test_duplicate_sparse_field_in_binary_raises_schema_error():
    data = Example({"a": (1,), "b": (2,)}, (), 0.0, 0).to_bytes().replace(b"\x01b", b"\x01a")
    raises_naming("sparse[1].name", Example.from_bytes, data)


def test_invalid_utf8_field_name_raises_schema_error():
    data = Example({"a": (1,)}, (), 0.0, 0).to_bytes().replace(b"\x01a", b"\x01\xff")
    raises_naming("sparse[0].name", Example.from_bytes, data)


def test_non_bytes_input_raises_schema_error():
    raises_naming("$", Example.from_bytes, "SX")


@pytest.mark.parametrize(
    "text, field",
    [
        ('{"v":1,"sparse":{},"dense":[NaN],"label":0,"ts":0}', "dense[0]"),
        ('{"v":1,"sparse":{},"dense":[1,Infinity],"label":0,"ts":0}', "dense[1]"),
        ('{"v":1,"sparse":{},"dense":[1e39],"label":0,"ts":0}', "dense[0]"),
        ('{"v":1,"sparse":{},"dense":[],"label":NaN,"ts":0}', "label"),
        ('{"v":1,"sparse":{},"dense":[],"label":1e999,"ts":0}', "label"),
        ('{"v":1,"sparse":{},"dense":[],"label":0,"ts":-1}', "ts"),
        ('{"v":1,"sparse":{},"dense":[],"label":0,"ts":1.5}', "ts"),
        ('{"v":1,"sparse":{"u":[-1]},"dense":[],"label":0,"ts":0}', "sparse.u[0]"),
        ('{"v":1,"sparse":{"u":[1,18446744073709551616]},"dense":[],"label":0,"ts":0}', "sparse.u[1]"),
        ('{"v":1,"sparse":{"u":[1.0]},"dense":[],"label":0,"ts":0}', "sparse.u[0]"),
        ('{"v":1,"sparse":{"u":[true]},"dense":[],"label":0,"ts":0}', "sparse.u[0]"),
        ('{"v":1,"sparse":{"u":7},"dense":[],"label":0,"ts":0}', "sparse.u"),
        ('{"v":1,"sparse":{"":[1]},"dense":[],"label":0,"ts":0}', "sparse"),
        ('{"v":1,"sparse":[],"dense":[],"label":0,"ts":0}', "sparse"),
        ('{"v":1,"sparse":{},"dense":"1,2","label":0,"ts":0}', "dense"),
        ('{"v":1,"sparse":{},"dense":[null],"label":0,"ts":0}', "dense[0]"),
        ('{"v":1,"sparse":{},"dense":[false],"label":0,"ts":0}', "dense[0]"),
        ('{"v":1,"sparse":{},"dense":[],"label":"1","ts":0}', "label"),
        ('{"v":2,"sparse":{},"dense":[],"label":0,"ts":0}', "v"),
        ('{"v":"1","sparse":{},"dense":[],"label":0,"ts":0}', "v"),
        ('{"sparse":{},"dense":[],"label":0,"ts":0}', "v"),
        ('{"v":1,"dense":[],"label":0,"ts":0}', "sparse"),
        ('{"v":1,"sparse":{},"label":0,"ts":0}', "dense"),
        ('{"v":1,"sparse":{},"dense":[],"ts":0}', "label"),
        ('{"v":1,"sparse":{},"dense":[],"label":0}', "ts"),
        ('[1]', "$"),
        ('{"v":1,', "$"),
        ("", "$"),
    ],
)
def test_malformed_json_raises_schema_error_naming_the_field(text, field):
    raises_naming(field, Example.from_json, text)


def test_invalid_utf8_json_raises_schema_error():
    raises_naming("$", Example.from_json, b'{"v":1,"sparse":{"\xff":[]}}')


def test_json_ignores_unknown_keys():
    doc = json.loads(small().to_json())
    doc["source"] = "web"
    assert Example.from_json(json.dumps(doc)) == small()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"dense": (1.0, math.nan)}, "dense[1]"),
        ({"dense": (1e39,)}, "dense[0]"),
        ({"dense": np.array([[1.0]])}, "dense"),
        ({"label": math.inf}, "label"),
        ({"label": True}, "label"),
        ({"event_time_ms": -5}, "event_time_ms"),
        ({"event_time_ms": 1.0}, "event_time_ms"),
        ({"sparse": {"u": (-1,)}}, "sparse.u[0]"),
        ({"sparse": {"u": np.array([1.0])}}, "sparse.u"),
        ({"sparse": {"u": "123"}}, "sparse.u"),
        ({"sparse": {"x" * 256: (1,)}}, "sparse"),
        ({"sparse": {3: (1,)}}, "sparse"),
        ({"sparse": [("u", (1,))]}, "sparse"),
    ],
)
def test_constructing_an_invalid_example_raises_schema_error(kwargs, field):
    values = {"sparse": {}, "dense": (), "label": 0.0, "event_time_ms": 0} | kwargs
    raises_naming(field, Example, *values.values())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_decode_or_raise_only_schema_error(data):
    for decode in (Example.from_bytes, Example.from_json):
        try:
            decode(data)
        except SchemaError:
            pass


@settings(max_examples=200, deadline=None)
@given(examples, st.data())
def test_corrupted_encodings_decode_or_raise_only_schema_error(example, data):
    raw = bytearray(example.to_bytes())
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] = data.draw(st.integers(0, 255))
    try:
        Example.from_bytes(bytes(raw))
    except SchemaError:
        pass
