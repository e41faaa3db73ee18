import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import FlushMark, PublishedRound, RoundRows, SchemaError


def a_round(**overrides) -> PublishedRound:
    fields = dict(epoch=2**63 + 5, round=7, reset=False, applied={"t0": 3, "t1": 9},
                  rows=(RoundRows("deep+wide", np.array([1, 2**40], dtype=np.uint64),
                                  np.arange(18, dtype=np.float32).reshape(2, 9)),))
    return PublishedRound(**(fields | overrides))


def test_a_round_round_trips_with_its_rows_as_read_only_views() -> None:
    entry = a_round()
    back = PublishedRound.from_bytes(entry.to_bytes())
    assert (back.epoch, back.round, back.reset, back.applied) == (entry.epoch, 7, False, {"t0": 3, "t1": 9})
    (rows,) = back.rows
    assert rows.table == "deep+wide" and rows.ids.tolist() == [1, 2**40]
    assert np.array_equal(rows.values, entry.rows[0].values) and not rows.values.flags.writeable
    assert PublishedRound.from_bytes(a_round(reset=True, rows=(), applied={}).to_bytes()).reset


@pytest.mark.parametrize("overrides, field", [
    ({"reset": True}, "rows"),  # a reset round carries no rows
    ({"applied": {"t": "3"}}, "applied"),
    ({"epoch": -1}, "epoch"),
])
def test_an_invalid_round_raises_schema_error_naming_the_field(overrides, field) -> None:
    with pytest.raises(SchemaError) as info:
        a_round(**overrides)
    assert (info.value.format, info.value.field) == ("PublishedRound", field)


def test_rows_must_be_non_negative_ids_with_one_finite_row_each() -> None:
    for ids, values, field in [(np.array([-1], dtype=np.int64), np.zeros((1, 2), np.float32), "rows.ids"),
                               (np.array([1.0]), np.zeros((1, 2), np.float32), "rows.ids"),
                               (np.array([1], dtype=np.uint64), np.zeros((2, 2), np.float32), "rows.values"),
                               (np.array([1], dtype=np.uint64), np.full((1, 2), np.nan, np.float32), "rows.values")]:
        with pytest.raises(SchemaError) as info:
            RoundRows("t", ids, values)
        assert info.value.field == field


def test_a_truncated_round_raises_schema_error() -> None:
    data = a_round().to_bytes()
    with pytest.raises(SchemaError):
        PublishedRound.from_bytes(data[:-4])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_decode_as_a_round_or_raise_only_schema_error(data) -> None:
    try:
        PublishedRound.from_bytes(b"SR\x01" + data)
    except SchemaError:
        pass


def test_a_flush_mark_round_trips_with_its_version_first() -> None:
    mark = FlushMark(b"1795416671754-37", 2**63 + 5, 37, 4096)
    assert mark.to_bytes() == b"1 1795416671754-37 %d 4096" % (2**63 + 5)
    assert FlushMark.from_bytes(mark.to_bytes()) == mark


def test_a_flush_mark_without_the_shard_version_reads_as_not_known() -> None:
    mark = FlushMark.from_bytes(b"1 1795416671754-37 5")
    assert (mark.round, mark.epoch, mark.version) == (37, 5, None)
    assert mark.to_bytes() == b"1 1795416671754-37 5"


@pytest.mark.parametrize("raw", [b"1795416671754-37 5", b"2 1795416671754-37 5", b"1 x-37 5", b"1 17-37 -5", b"",
                                 b"1 17-37 5 v", b"1 17-37 5 6 7"])
def test_a_flush_mark_that_does_not_parse_names_its_format(raw: bytes) -> None:
    with pytest.raises(SchemaError, match="FlushMark"):
        FlushMark.from_bytes(raw)
