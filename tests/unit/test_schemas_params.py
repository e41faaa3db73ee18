import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamtrain.schemas import ParamBlock, SchemaError, decode_rows, encode_rows

FAST = settings(max_examples=60, deadline=None)

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
blocks = st.builds(
    ParamBlock,
    param=st.text(min_size=1, max_size=12).filter(lambda s: len(s.encode()) <= 255),
    block=st.integers(0, 2**32 - 1),
    version=st.integers(0, 2**64 - 1),
    values=hnp.arrays(np.float32, st.integers(0, 40), elements=finite32),
)


@st.composite
def row_batches(draw):
    dim = draw(st.integers(1, 16))
    values = draw(hnp.arrays(np.float32, (draw(st.integers(0, 20)), dim), elements=finite32))
    present = draw(hnp.arrays(np.bool_, len(values)))
    return values, present


def small_block() -> ParamBlock:
    return ParamBlock("fc.weight", 7, 42, np.array([0.25, -1.0, 1234.0], dtype=np.float32))


def raises_naming(field, fn, *args, format="ParamBlock"):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    err = info.value
    assert (err.format, err.field) == (format, field)
    assert f"'{field}'" in str(err)
    return err


def rows_raise_naming(field, raw, dim):
    return raises_naming(field, decode_rows, raw, dim, format="EmbeddingRows")


# --- ParamBlock ---------------------------------------------------------------


@FAST
@given(blocks)
def test_param_block_round_trips_through_binary(block):
    decoded = ParamBlock.from_bytes(block.to_bytes())
    assert decoded == block
    assert decoded.values.dtype == np.float32


def test_param_block_values_decode_as_an_aligned_read_only_view():
    data = small_block().to_bytes()
    values = ParamBlock.from_bytes(data).values
    assert np.shares_memory(values, np.frombuffer(data, np.uint8))
    assert values.flags.aligned and not values.flags.writeable


def test_param_block_starts_with_magic_and_version():
    assert small_block().to_bytes()[:3] == b"SB\x01"


def test_truncated_param_block_raises_schema_error_naming_the_field():
    data = small_block().to_bytes()
    fields = set()
    for cut in range(len(data)):
        with pytest.raises(SchemaError) as info:
            ParamBlock.from_bytes(data[:cut])
        assert "truncated" in info.value.reason
        fields.add(info.value.field)
    assert fields == {"magic", "version", "header", "param", "padding", "values"}


def test_unknown_param_block_version_raises_schema_error():
    data = bytearray(small_block().to_bytes())
    data[2] = 0
    raises_naming("version", ParamBlock.from_bytes, bytes(data))


def test_wrong_param_block_magic_raises_schema_error():
    raises_naming("magic", ParamBlock.from_bytes, b"SG" + small_block().to_bytes()[2:])


def test_trailing_bytes_after_a_param_block_raise_schema_error():
    raises_naming("$", ParamBlock.from_bytes, small_block().to_bytes() + b"\0\0\0\0")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_param_value_on_the_wire_raises_schema_error(bad):
    data = small_block().to_bytes().replace(np.float32(1234.0).tobytes(), np.float32(bad).tobytes())
    raises_naming("values", ParamBlock.from_bytes, data)


@pytest.mark.parametrize(
    "args, field",
    [
        (("w", 0, 0, np.array([np.nan], dtype=np.float32)), "values"),
        (("w", 0, 0, np.ones((2, 2), dtype=np.float32)), "values"),
        (("w", 0, 0, np.arange(3)), "values"),
        (("w", 0, 0, [1.0]), "values"),
        (("w", -1, 0, np.ones(1)), "block"),
        (("w", 0, -1, np.ones(1)), "version"),
        (("", 0, 0, np.ones(1)), "param"),
    ],
)
def test_constructing_an_invalid_param_block_raises_schema_error(args, field):
    raises_naming(field, ParamBlock, *args)


def test_param_block_bytes_are_header_name_padding_then_float32s():
    data = small_block().to_bytes()
    head = b"SB\x01" + struct.pack("<BIQI", 9, 7, 42, 3) + b"fc.weight"
    assert data == head + bytes(-len(head) % 8) + np.array([0.25, -1.0, 1234.0], dtype="<f4").tobytes()


@FAST
@given(blocks)
def test_a_block_of_wire_types_is_the_checked_block(block):
    fast = ParamBlock.of_wire_types(block.param, block.block, block.version, block.values)
    assert fast == block
    assert fast.to_bytes() == block.to_bytes()


@pytest.mark.parametrize("args, field", [
    (("w", 0, 0, np.array([1.0, np.inf], dtype=np.float32)), "values"),
    (("", 0, 0, np.ones(1, dtype=np.float32)), "param"),
])
def test_a_block_of_wire_types_still_refuses_non_finite_values_and_no_name(args, field):
    raises_naming(field, ParamBlock.of_wire_types, *args)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_arbitrary_bytes_decode_as_a_block_or_raise_only_schema_error(data):
    try:
        ParamBlock.from_bytes(b"SB\x01" + data)
    except SchemaError:
        pass


# --- embedding rows -------------------------------------------------------------


@FAST
@given(row_batches())
def test_rows_round_trip_with_missing_rows_as_zeros(batch):
    values, present = batch
    encoded = encode_rows(values)
    raw = [row if keep else None for row, keep in zip(encoded, present)]
    decoded, got_present = decode_rows(raw, values.shape[1])
    assert np.array_equal(got_present, present)
    assert np.array_equal(decoded[present], values[present])
    assert not decoded[~present].any()
    assert decoded.dtype == np.float32 and decoded.flags.c_contiguous and decoded.flags.writeable


def test_each_row_is_a_four_byte_header_then_float32s():
    (row,) = encode_rows(np.array([[1.0, -2.0]], dtype=np.float32))
    assert row == b"R\x01\x02\x00" + np.array([1.0, -2.0], dtype="<f4").tobytes()


def test_rows_decode_from_bytearrays_memoryviews_and_tuples():
    rows = encode_rows(np.eye(3, dtype=np.float32))
    values, present = decode_rows((bytearray(rows[0]), memoryview(rows[1]), None), 3)
    assert present.tolist() == [True, True, False]
    assert values.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]


def test_no_rows_decode_to_an_empty_batch():
    values, present = decode_rows([], 4)
    assert values.shape == (0, 4) and present.shape == (0,)
    assert encode_rows(np.zeros((0, 4), dtype=np.float32)) == []


def test_all_missing_rows_decode_to_zeros():
    values, present = decode_rows([None, None], 2)
    assert not present.any() and not values.any()


@pytest.mark.parametrize("cut", [0, 1, 3, 4, 11])
def test_a_short_row_raises_schema_error_naming_it(cut):
    rows = encode_rows(np.ones((3, 2), dtype=np.float32))
    rows[2] = rows[2][:cut]
    err = rows_raise_naming("rows[2]", [rows[0], None, rows[2]], 2)
    assert f"{cut} bytes, expected 12" in err.reason


def test_rows_that_would_frame_correctly_once_joined_are_still_refused():
    # An empty row followed by a double-length one joins to exactly two valid rows.
    rows = encode_rows(np.ones((2, 2), dtype=np.float32))
    rows_raise_naming("rows[0]", [b"", rows[0] + rows[1]], 2)


def test_a_row_of_another_dim_raises_schema_error():
    row = encode_rows(np.ones((1, 3), dtype=np.float32))[0]
    rows_raise_naming("rows[0]", [row], 2)  # caught by its length
    relabelled = row[:2] + b"\x02\x00" + row[4:]  # right length for dim 3, header says 2
    err = rows_raise_naming("rows[1]", [None, relabelled], 3)
    assert "dim 2, expected 3" in err.reason


@pytest.mark.parametrize(
    "patch, word",
    [((0, 0x41), "magic"), ((1, 7), "version"), ((2, 9), "dim")],
)
def test_a_bad_row_header_raises_schema_error_naming_the_row(patch, word):
    rows = encode_rows(np.ones((3, 4), dtype=np.float32))
    bad = bytearray(rows[1])
    bad[patch[0]] = patch[1]
    rows[1] = bytes(bad)
    err = rows_raise_naming("rows[1]", rows, 4)
    assert word in err.reason


def test_a_zero_header_row_is_refused_even_beside_missing_rows():
    rows = encode_rows(np.ones((2, 2), dtype=np.float32))
    rows_raise_naming("rows[2]", [None, rows[0], bytes(12), None], 2)


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_a_non_finite_row_raises_schema_error_naming_the_row(bad):
    values = np.ones((3, 2), dtype=np.float32)
    rows = encode_rows(values)
    rows[2] = rows[2][:8] + np.float32(bad).tobytes()
    rows_raise_naming("rows[3]", [None] + rows, 2)


@pytest.mark.parametrize("bad", ["R\x01\x01\x00abcd", 17, 1.5])
def test_a_row_that_is_not_bytes_raises_schema_error_naming_it(bad):
    rows = encode_rows(np.ones((2, 1), dtype=np.float32))
    rows_raise_naming("rows[1]", [rows[0], bad], 1)


@pytest.mark.parametrize("dim", [0, -1, 65536, 2.0])
def test_an_impossible_dim_raises_schema_error(dim):
    rows_raise_naming("dim", [], dim)


@pytest.mark.parametrize(
    "values",
    [np.ones(3, dtype=np.float32), np.ones((2, 0), dtype=np.float32), np.array([[np.nan]]), np.ones((1, 2), dtype=int)],
)
def test_encoding_invalid_rows_raises_schema_error(values):
    raises_naming("values", encode_rows, values, format="EmbeddingRows")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=14)), max_size=5), st.integers(1, 3))
def test_arbitrary_row_bytes_decode_or_raise_only_schema_error(raw, dim):
    try:
        decode_rows(raw, dim)
    except SchemaError:
        pass
