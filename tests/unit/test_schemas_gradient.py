import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamtrain.schemas import DenseSlice, GradientDelta, SchemaError, SparseRows
from streamtrain.schemas.gradient import UNKNOWN_BASE

FAST = settings(max_examples=60, deadline=None)

names = st.text(min_size=1, max_size=10).filter(lambda s: len(s.encode()) <= 255)
ids_text = st.text(min_size=1, max_size=40)


def values_of(dtype, shape):
    if dtype == "float32":
        return hnp.arrays(np.float32, shape, elements=st.floats(width=32, allow_nan=False, allow_infinity=False))
    # float16-wire values are drawn on the float16 grid, so the round trip is exact. Rounding
    # by map rather than st.floats(width=16), which rejects too many draws for the health check.
    on_grid = hnp.arrays(np.float32, shape, elements=st.floats(-65504, 65504, width=32))
    return on_grid.map(lambda a: a.astype(np.float16).astype(np.float32))


@st.composite
def deltas(draw, dtype=st.sampled_from(["float32", "float16"])):
    wire = draw(dtype)
    dense = draw(
        st.lists(
            st.builds(
                DenseSlice,
                param=names,
                block=st.integers(0, 2**32 - 1),
                offset=st.integers(0, 2**64 - 1),
                values=st.integers(0, 20).flatmap(lambda n: values_of(wire, n)),
            ),
            max_size=3,
        )
    )
    sparse = []
    for _ in range(draw(st.integers(0, 3))):
        n, dim = draw(st.integers(0, 12)), draw(st.integers(1, 8))
        ids = draw(hnp.arrays(np.uint64, n, elements=st.integers(0, 2**64 - 1)))
        sparse.append(SparseRows(draw(names), ids, draw(values_of(wire, (n, dim)))))
    return GradientDelta(
        task_id=draw(ids_text),
        seq=draw(st.integers(0, 2**64 - 1)),
        trainer_id=draw(ids_text),
        shard=draw(st.integers(0, 2**32 - 1)),
        step=draw(st.integers(0, 2**64 - 1)),
        examples=draw(st.integers(0, 2**64 - 1)),
        dtype=wire,
        dense=tuple(dense),
        sparse=tuple(sparse),
    )


def small(dtype="float32", marker=1234.0) -> GradientDelta:
    return GradientDelta(
        task_id="clicks:0:00000000000000000100",
        seq=2,
        trainer_id="t-1",
        shard=1,
        step=9,
        examples=64,
        dtype=dtype,
        dense=(DenseSlice("fc.weight", 3, 16, np.array([0.5, marker], dtype=np.float32), base=41),),
        sparse=(SparseRows("emb", np.array([5, 9], dtype=np.uint64),
                           np.array([[1.0, 2.0], [3.0, marker]], dtype=np.float32)),),
    )


def raises_naming(field, fn, *args, format="GradientDelta"):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    err = info.value
    assert (err.format, err.field) == (format, field)
    assert f"'{field}'" in str(err) and format in str(err)
    return err


def with_marker_replaced(dtype, new_value):
    np_dtype = np.float16 if dtype == "float16" else np.float32
    old = np.array([1234.0], np_dtype).tobytes()
    new = np.array([new_value], np_dtype).tobytes()
    data = small(dtype).to_bytes()
    assert data.count(old) == 2  # once in the dense slice, once in the sparse rows
    return data, old, new


@FAST
@given(deltas())
def test_gradient_delta_round_trips_through_binary(delta):
    decoded = GradientDelta.from_bytes(delta.to_bytes())
    assert decoded == delta
    for part in decoded.dense + decoded.sparse:
        assert part.values.dtype == np.float32
    for rows in decoded.sparse:
        assert rows.ids.dtype == np.uint64


@FAST
@given(deltas(dtype=st.just("float16")))
def test_float16_wire_round_trips_values_on_the_float16_grid(delta):
    assert GradientDelta.from_bytes(delta.to_bytes()) == delta


@FAST
@given(hnp.arrays(np.float32, st.integers(0, 30), elements=st.floats(-60000, 60000, width=32)))
def test_float16_wire_delivers_the_float16_rounding_of_the_values(values):
    delta = GradientDelta("t", 0, "tr", 0, 0, 1, "float16", (DenseSlice("w", 0, 0, values),))
    decoded = GradientDelta.from_bytes(delta.to_bytes())
    assert np.array_equal(decoded.dense[0].values, values.astype(np.float16).astype(np.float32))


def test_float16_wire_halves_the_value_bytes():
    values = np.zeros(1000, dtype=np.float32)
    size = {
        dtype: len(GradientDelta("t", 0, "tr", 0, 0, 1, dtype, (DenseSlice("w", 0, 0, values),)).to_bytes())
        for dtype in ("float32", "float16")
    }
    assert size["float32"] - size["float16"] == 2000


def test_float32_values_decode_as_aligned_views_of_the_buffer():
    data = small().to_bytes()
    decoded = GradientDelta.from_bytes(data)
    buffer = np.frombuffer(data, np.uint8)
    for array in (decoded.dense[0].values, decoded.sparse[0].ids, decoded.sparse[0].values):
        assert np.shares_memory(array, buffer)
        assert array.flags.aligned


def test_dedup_key_is_task_id_and_seq():
    assert small().dedup_key == ("clicks:0:00000000000000000100", 2)


def test_inputs_are_normalised_to_uint64_ids_and_float32_values():
    rows = SparseRows("emb", np.array([1, 2], dtype=np.int64), np.ones((2, 3), dtype=np.float64))
    assert rows.ids.dtype == np.uint64 and rows.values.dtype == np.float32 and rows.dim == 3
    assert DenseSlice("w", 0, 0, np.ones(3, dtype=np.float16)).values.dtype == np.float32


def test_deltas_compare_arrays_by_value_and_are_picklable():
    assert small() == pickle.loads(pickle.dumps(small()))
    assert small() != small(marker=1.0)
    assert small() != small("float16")


def test_binary_form_starts_with_magic_version_and_dtype():
    assert small().to_bytes()[:4] == b"SG\x02\x01"
    assert small("float16").to_bytes()[:4] == b"SG\x02\x02"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_truncated_gradient_raises_schema_error_naming_the_field(dtype):
    data = small(dtype).to_bytes()
    fields = set()
    for cut in range(len(data)):
        with pytest.raises(SchemaError) as info:
            GradientDelta.from_bytes(data[:cut])
        assert "truncated" in info.value.reason
        assert f"'{info.value.field}'" in str(info.value)
        fields.add(info.value.field)
    assert fields == {
        "magic", "version", "header", "task_id", "trainer_id",
        "dense[0]", "dense[0].param", "dense[0].padding", "dense[0].values",
        "sparse[0]", "sparse[0].table", "sparse[0].padding", "sparse[0].ids", "sparse[0].values",
    }  # fmt: skip


def test_truncation_inside_the_sparse_values_names_them():
    raises_naming("sparse[0].values", GradientDelta.from_bytes, small().to_bytes()[:-1])


def test_unknown_version_raises_schema_error():
    data = bytearray(small().to_bytes())
    data[2] = 3
    err = raises_naming("version", GradientDelta.from_bytes, bytes(data))
    assert "unknown version 3; this reader understands 1, 2" in str(err)


def test_a_version_1_delta_still_decodes_with_slices_no_shard_damps() -> None:
    """A shard replaying a log written before dense slices carried their base loses nothing:
    the docs' example of version 1, read with the largest base."""
    v1 = bytes.fromhex(
        "53470101 01000000 0200000000000000 0900000000000000 4000000000000000 01000000 01000000 1800 0200"
        + b"c:0:00000000000000000000t1".hex()
        + "01 03000000 1000000000000000 01000000" + b"w".hex() + "0000003f"
        + "03 01000000 0200" + b"emb".hex() + "0000 0500000000000000 0000803f 00000040")
    delta = GradientDelta.from_bytes(v1)
    assert (delta.task_id, delta.seq, delta.trainer_id, delta.shard, delta.step, delta.examples) == (
        "c:0:00000000000000000000", 2, "t1", 1, 9, 64)
    (piece,) = delta.dense
    assert (piece.param, piece.block, piece.offset, piece.values.tolist()) == ("w", 3, 16, [0.5])
    assert piece.base == UNKNOWN_BASE
    assert delta.sparse[0].ids.tolist() == [5] and delta.sparse[0].values.tolist() == [[1.0, 2.0]]


def test_wrong_magic_raises_schema_error():
    raises_naming("magic", GradientDelta.from_bytes, b"SX" + small().to_bytes()[2:])


@pytest.mark.parametrize("code", [0, 3, 255])
def test_unknown_dtype_code_raises_schema_error(code):
    data = bytearray(small().to_bytes())
    data[3] = code
    raises_naming("dtype", GradientDelta.from_bytes, bytes(data))


def test_nonzero_padding_raises_schema_error():
    data = bytearray(small().to_bytes())
    data[data.index(b"fc.weight") + len(b"fc.weight")] = 1
    raises_naming("dense[0].padding", GradientDelta.from_bytes, bytes(data))


def test_trailing_bytes_raise_schema_error():
    raises_naming("$", GradientDelta.from_bytes, small().to_bytes() + b"\0" * 8)


def test_invalid_utf8_task_id_raises_schema_error():
    data = small().to_bytes().replace(b"clicks", b"click\xff")
    raises_naming("task_id", GradientDelta.from_bytes, data)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_sparse_value_on_the_wire_raises_naming_the_rows(dtype, bad):
    data, old, new = with_marker_replaced(dtype, bad)
    head, tail = data.rsplit(old, 1)
    err = raises_naming("sparse[0].values", GradientDelta.from_bytes, head + new + tail)
    assert ("NaN" if math.isnan(bad) else "inf") in err.reason
    assert "[1][1]" in err.reason


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_non_finite_dense_value_on_the_wire_raises_naming_the_slice(dtype):
    data, old, new = with_marker_replaced(dtype, math.nan)
    raises_naming("dense[0].values", GradientDelta.from_bytes, data.replace(old, new, 1))


def test_empty_table_name_on_the_wire_raises_schema_error():
    data = bytearray(small().to_bytes())
    data[data.index(b"emb") - 7] = 0  # the table name's length byte
    with pytest.raises(SchemaError) as info:
        GradientDelta.from_bytes(bytes(data))
    assert info.value.field.startswith("sparse[0]")


def encoded_unchecked(**changes) -> bytes:
    """A delta's bytes with fields no constructor accepts: what a buggy or foreign writer sends."""
    delta = small()
    fields = {**delta.__dict__, **changes}
    out = object.__new__(GradientDelta)
    out.__dict__.update(fields)
    return out.to_bytes()


@pytest.mark.parametrize("change, field", [
    ({"trainer_id": ""}, "trainer_id"),
    ({"task_id": ""}, "task_id"),
    ({"dense": (object.__new__(DenseSlice),)}, "dense[0].param"),
    ({"sparse": (object.__new__(SparseRows),)}, "sparse[0].values"),
])
def test_fields_the_wire_format_does_not_bound_are_checked_when_decoding(change, field):
    for part in change.get("dense", ()):
        part.__dict__.update(param="", block=0, offset=0, values=np.ones(2, np.float32))
    for part in change.get("sparse", ()):
        part.__dict__.update(table="emb", ids=np.array([1], np.uint64), values=np.ones((1, 0), np.float32))
    raises_naming(field, GradientDelta.from_bytes, encoded_unchecked(**change))


@pytest.mark.parametrize(
    "make, format, field",
    [
        (lambda: DenseSlice("w", 0, 0, np.array([1.0, math.nan])), "DenseSlice", "values"),
        (lambda: DenseSlice("w", 0, 0, np.array([1e39])), "DenseSlice", "values"),
        (lambda: DenseSlice("w", 0, 0, np.array([1, 2])), "DenseSlice", "values"),
        (lambda: DenseSlice("w", 0, 0, [1.0, 2.0]), "DenseSlice", "values"),
        (lambda: DenseSlice("w", 0, 0, np.ones((2, 2))), "DenseSlice", "values"),
        (lambda: DenseSlice("w", -1, 0, np.ones(2)), "DenseSlice", "block"),
        (lambda: DenseSlice("w", 0, -1, np.ones(2)), "DenseSlice", "offset"),
        (lambda: DenseSlice("w", 0, 0, np.ones(2), base=-1), "DenseSlice", "base"),
        (lambda: DenseSlice("", 0, 0, np.ones(2)), "DenseSlice", "param"),
        (lambda: DenseSlice("w" * 256, 0, 0, np.ones(2)), "DenseSlice", "param"),
        (lambda: SparseRows("e", np.array([1.0]), np.ones((1, 2))), "SparseRows", "ids"),
        (lambda: SparseRows("e", np.array([-1]), np.ones((1, 2))), "SparseRows", "ids"),
        (lambda: SparseRows("e", np.array([[1]]), np.ones((1, 2))), "SparseRows", "ids"),
        (lambda: SparseRows("e", np.array([1, 2]), np.ones((1, 2))), "SparseRows", "values"),
        (lambda: SparseRows("e", np.array([1]), np.ones(2)), "SparseRows", "values"),
        (lambda: SparseRows("e", np.array([1]), np.ones((1, 0))), "SparseRows", "values"),
        (lambda: SparseRows("e", np.array([1]), np.array([[np.inf]])), "SparseRows", "values"),
        (lambda: SparseRows(3, np.array([1]), np.ones((1, 1))), "SparseRows", "table"),
    ],
)
def test_constructing_an_invalid_part_raises_schema_error(make, format, field):
    raises_naming(field, make, format=format)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"seq": -1}, "seq"),
        ({"seq": 2**64}, "seq"),
        ({"shard": -1}, "shard"),
        ({"step": 1.0}, "step"),
        ({"examples": True}, "examples"),
        ({"task_id": ""}, "task_id"),
        ({"trainer_id": None}, "trainer_id"),
        ({"dtype": "float64"}, "dtype"),
        ({"dense": [SparseRows("e", np.array([1]), np.ones((1, 1)))]}, "dense[0]"),
        ({"sparse": "rows"}, "sparse"),
        ({"dtype": "float16", "sparse": (SparseRows("e", np.array([1]), np.array([[70000.0]])),)}, "sparse[0].values"),
        ({"dtype": "float16", "dense": (DenseSlice("w", 0, 0, np.array([1.0, -65520.0])),)}, "dense[0].values"),
    ],
)
def test_constructing_an_invalid_delta_raises_schema_error(change, field):
    kwargs = {"task_id": "t", "seq": 0, "trainer_id": "tr", "shard": 0, "step": 0, "examples": 0} | change
    raises_naming(field, lambda: GradientDelta(**kwargs))


def test_largest_float16_values_are_accepted_for_the_float16_wire():
    edge = np.array([65504.0, -65504.0, 65519.0], dtype=np.float32)
    delta = GradientDelta("t", 0, "tr", 0, 0, 1, "float16", (DenseSlice("w", 0, 0, edge),))
    assert GradientDelta.from_bytes(delta.to_bytes()).dense[0].values.tolist() == [65504.0, -65504.0, 65504.0]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_arbitrary_bytes_decode_or_raise_only_schema_error(data):
    try:
        GradientDelta.from_bytes(b"SG\x01" + data)
    except SchemaError:
        pass


@settings(max_examples=200, deadline=None)
@given(deltas(), st.data())
def test_corrupted_encodings_decode_or_raise_only_schema_error(delta, data):
    raw = bytearray(delta.to_bytes())
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] = data.draw(st.integers(0, 255))
    try:
        GradientDelta.from_bytes(bytes(raw))
    except SchemaError:
        pass
