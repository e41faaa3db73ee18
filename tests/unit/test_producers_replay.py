import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamtrain.producers.errors import ReplayError
from streamtrain.producers.replay import ReplayConfig, read_records


def _rows(path, **kw):
    return list(read_records(ReplayConfig(path, "t", **kw)))


def test_csv_rows_become_json_objects_with_typed_values(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text('id,clicked,price,note\n1,true,0.5,"a, b"\n2,false,,plain\n')
    assert [json.loads(v) for _, v in _rows(path)] == [
        {"id": 1, "clicked": True, "price": 0.5, "note": "a, b"},
        {"id": 2, "clicked": False, "price": None, "note": "plain"},
    ]


def test_csv_can_be_replayed_as_csv_lines_as_written(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text('id,price,note\n007,0.50,"a, b"\n2,1e3,plain\n')
    assert [v for _, v in _rows(path, value="csv")] == [b'007,0.50,"a, b"', b"2,1e3,plain"]


def test_a_headerless_csv_keeps_its_first_line_as_a_row(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text('1,0.5,"a, b"\n0,2.5,plain\n')
    assert [v for _, v in _rows(path, value="csv", header=False)] == [b'1,0.5,"a, b"', b"0,2.5,plain"]
    assert [json.loads(v) for _, v in _rows(path, header=False)][0] == {"f0": 1, "f1": 0.5, "f2": "a, b"}
    named = _rows(path, header=False, columns=("y", "price", "note"), key_column="note")
    assert named[1] == ("plain", b'{"y":0,"price":2.5,"note":"plain"}')


def test_declared_column_names_replace_a_files_header(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("a,b\n1,2\n")
    assert [json.loads(v) for _, v in _rows(path, columns=("y", "x"))] == [{"y": 1, "x": 2}]


@pytest.mark.parametrize("kw, reason", [
    ({"header": False}, "CSV files only"),
    ({"columns": ("a", "a")}, "distinct"),
])
def test_header_options_are_checked(tmp_path, kw, reason):
    path = tmp_path / ("log.jsonl" if "header" in kw else "log.csv")
    path.write_text("{}\n")
    with pytest.raises(ValueError, match=reason):
        ReplayConfig(path, "t", **kw)


def test_parquet_streams_in_batches_and_keys_come_from_a_column(tmp_path):
    path = tmp_path / "log.parquet"
    table = pa.table({"user": [f"u{i}" for i in range(25)], "x": [float(i) for i in range(25)]})
    pq.write_table(table, path, row_group_size=10)
    records = _rows(path, key_column="user", batch_rows=7)
    assert [k for k, _ in records] == [f"u{i}" for i in range(25)]
    assert [json.loads(v)["x"] for _, v in records] == [float(i) for i in range(25)]


def test_parquet_values_without_a_json_type_get_a_readable_form(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({
        "when": pa.array([dt.datetime(2024, 5, 1, 12, 30)], pa.timestamp("ms")),
        "raw": pa.array([b"\x00\x01"]),
        "bad": pa.array([float("nan")]),
        "tags": pa.array([["a", "b"]]),
    }), path)
    assert json.loads(_rows(path)[0][1]) == {"when": "2024-05-01T12:30:00", "raw": "AAE=", "bad": None,
                                             "tags": ["a", "b"]}


def test_json_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1, "b": {"c": "x"}}\n{"a": 2, "b": {"c": "y"}}\n')
    assert [json.loads(v) for _, v in _rows(path)] == [{"a": 1, "b": {"c": "x"}}, {"a": 2, "b": {"c": "y"}}]


def test_format_comes_from_the_suffix_or_must_be_given(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match="csv, parquet, jsonl"):
        ReplayConfig(path, "t")
    assert len(_rows(path, format="jsonl")) == 1


def test_errors_name_the_file_and_what_is_wrong(tmp_path):
    with pytest.raises(ReplayError, match="no such file"):
        _rows(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3\n")
    with pytest.raises(ReplayError, match="bad.csv"):
        _rows(bad)
    good = tmp_path / "good.csv"
    good.write_text("a,b\n1,2\n")
    with pytest.raises(ReplayError, match="key column 'nope'"):
        _rows(good, key_column="nope")
    with pytest.raises(ValueError, match="needs a CSV file"):
        ReplayConfig(tmp_path / "x.parquet", "t", value="csv")
