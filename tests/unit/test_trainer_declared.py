"""A log's own JSON decoded by declared paths (trainer/declared.py): what one record gives, and
chunks decoded in C exactly as one by one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder, DecodeError, make_decoder, stable_id
from test_trainer_parts import assert_chunk_decodes_as_one_by_one


def section(label: str = "clicked", defaults: str = "{}"):
    return JobConfig.from_toml(f'''[job]
name = "j"
[input]
topics = ["t"]
[input.fields]
sparse = {{ user = "user.id", tags = "ctx.tags", device = "ctx.device" }}
dense = ["price", "ctx.age"]
label = "{label}"
time = "ts"
defaults = {defaults}
''').input


FIELDS = ("device", "tags", "user")


def doc(**kw) -> bytes:
    base = {"user": {"id": 7, "name": "x"}, "ctx": {"tags": ["a", "3"], "device": "ios", "age": 31},
            "price": 2.5, "clicked": True, "ts": 1000, "other": {"deep": [1, 2]}}
    base.update(kw)
    return json.dumps(base).encode()


def test_nested_paths_arrays_hashed_strings_and_booleans_become_an_example() -> None:
    example = make_decoder(section())(doc())
    assert example == Example({"user": (7,), "tags": (stable_id("a"), stable_id("3")), "device": (stable_id("ios"),)},
                              (2.5, 31.0), 1.0, 1000)


def test_a_label_rule_an_iso_time_and_defaults_for_missing_fields() -> None:
    decode = make_decoder(section(label="dwell_ms > 30000", defaults='{ "ctx.age" = 40, "ctx.device" = "web" }'))
    example = decode(json.dumps({"user": {"id": 1}, "ctx": {}, "price": 1, "dwell_ms": 45000,
                                 "ts": "2026-11-23T10:00:00.250Z"}).encode())
    assert example.label == 1.0 and example.dense == (1.0, 40.0)
    assert example.sparse["device"] == (stable_id("web"),) and "tags" not in example.sparse
    assert example.event_time_ms == 1795428000250
    assert decode(doc(dwell_ms=30000)).label == 0.0


@pytest.mark.parametrize("record, reason", [
    (doc(price=None), "'price' (dense): missing, and no default"),
    (doc(price="2.5"), "'price' (dense): '2.5' is not a number"),
    (doc(user={"id": -1}), "'user.id' (sparse): -1 is not an id"),
    (doc(user={"id": 1.5}), "'user.id' (sparse): 1.5 is not an id"),
    (doc(user=5), "'user.id': 'user' is 5, not an object"),
    (doc(clicked="yes"), "'clicked' (label): 'yes' is not true, false or a number"),
    (doc(ts="yesterday"), "'ts' (time): 'yesterday' is neither epoch milliseconds"),
    (b"[1, 2]", "a record must be an object"),
    (b'{"user": ', "json:"),
])
def test_a_bad_record_names_the_path_and_what_is_wrong(record, reason) -> None:
    with pytest.raises(DecodeError) as err:
        make_decoder(section())(record)
    assert reason in str(err.value)


def test_a_clean_chunk_is_decoded_without_the_one_record_decoder(monkeypatch) -> None:
    decoder = ChunkDecoder(section(), FIELDS, 2)
    monkeypatch.setattr(decoder, "_one", lambda value: pytest.fail(f"{value!r} went one by one"))
    records = [doc(user={"id": i}, ts=f"2026-11-23T10:00:{i % 60:02d}Z", clicked=i % 3 == 0) for i in range(300)]
    decoded = decoder.decode(records)
    assert len(decoded.columns) == 300 and not decoded.bad
    assert decoded.columns.sparse[2][0][:3].tolist() == [0, 1, 2]
    assert np.array_equal(decoded.columns.sparse[1][1], np.full(300, 2))
    assert decoded.columns.labels[:3].tolist() == [1.0, 0.0, 0.0]


_ids = st.one_of(st.integers(-3, 2**64 + 3), st.sampled_from(["a", "b", "ios", "", "7"]), st.just(1.5),
                 st.just(True), st.none())
_numbers = st.one_of(st.integers(-5, 10**20), st.floats(allow_nan=False), st.sampled_from([True, "1", None]))
_times = st.one_of(st.integers(-2, 2**63 + 2), st.sampled_from(["2026-11-23T10:00:00Z", "2026-11-23 10:00:00.5+01:00",
                                                               "1969-01-01T00:00:00Z", "soon", 2.5, None]))
_records = st.fixed_dictionaries({}, optional={
    "user": st.one_of(st.fixed_dictionaries({}, optional={"id": _ids}), st.integers(0, 3), st.none()),
    "ctx": st.fixed_dictionaries({}, optional={"tags": st.one_of(st.lists(_ids, max_size=3), _ids),
                                               "device": _ids, "age": _numbers}),
    "price": _numbers,
    "clicked": st.one_of(st.booleans(), st.sampled_from([0, 1, 0.5, 2, -1, "1", None])),
    "ts": _times,
}).map(lambda d: json.dumps(d).encode())
_BASE = b'{"user": {"id": 1}, "ctx": {"age": 3}, "price": 2, "clicked": true, "ts": 5'
# What pyarrow's reader takes and a JSON parser refuses (or a float cannot hold), anywhere.
_raw = st.sampled_from([_BASE + tail for tail in (
    b', "x": NaN}', b', "x": -Infinity}', b', "x": "\xff"}', b', "x": 1.7976931348623159e308}', b', "x": 1e400}',
    b', "x": 1' + b"0" * 400 + b"}", b', "x": "\xed\xa0\x80"}', b"}")]
    + [b'{"user": {"id": "\xff"}, "price": 2, "clicked": true, "ts": 5}',
       b'{"user": {"id": 1}, "price": 1' + b"0" * 400 + b', "clicked": true, "ts": 5}'])
_values = _records | _raw | st.sampled_from([b"[]", b"{", b"null", b'{"price": 1}\n{"price": 2}', None])


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=10))
@example([b'{"ctx": {"tags": ["a", null]}}'])  # a null among string ids: once an IndexError
def test_chunks_decode_as_one_by_one_does(values) -> None:
    """pyarrow's reader and the vectorised checks decide speed only."""
    assert_chunk_decodes_as_one_by_one(section(defaults='{ "ctx.age" = 0 }'), FIELDS, values)


@settings(max_examples=100, deadline=None)
@given(st.lists(_records, min_size=1, max_size=10))
def test_chunks_with_a_label_rule_decode_as_one_by_one_does(values) -> None:
    assert_chunk_decodes_as_one_by_one(section(label="price >= 2.5"), FIELDS, values)


def test_declared_fields_survive_the_jobs_json_and_give_the_model_its_fields() -> None:
    from streamtrain.trainer.models import model_spec

    config = JobConfig.from_toml('[job]\nname = "j"\n[input]\ntopics = ["t"]\n[input.fields]\n'
                                 'sparse = { user = "u.id", ad = "a" }\ndense = ["p"]\nlabel = "d >= 3"\n'
                                 'defaults = { p = 1 }')
    assert JobConfig.from_json(config.to_json()) == config
    spec = model_spec(config)
    assert (spec.fields, spec.dense_features) == (("ad", "user"), 1)


@pytest.mark.parametrize("table, key, reason", [
    ('label = "y"', "input.fields", "at least one sparse or dense"),
    ('dense = ["a"]', "input.fields.label", "is required"),
    ('dense = ["a"]\nlabel = "y >> 2"', "input.fields.label", "op one of"),
    ('dense = ["a"]\nlabel = "y > soon"', "input.fields.label", "finite number"),
    ('sparse = { u = "a..b" }\nlabel = "y"', "input.fields.sparse.u", "path of keys"),
    ('dense = ["a"]\nlabel = "y"\nwhen = "t"', "input.fields.when", "unknown key"),
    ('dense = ["a"]\nlabel = "y"\ndefaults = { a = [1] }', "input.fields.defaults.a", "number, string or boolean"),
])
def test_a_bad_declaration_is_refused_naming_the_key(table, key, reason) -> None:
    from streamtrain.schemas.config import JobConfigError

    with pytest.raises(JobConfigError) as err:
        JobConfig.from_toml(f'[job]\nname = "j"\n[input]\ntopics = ["t"]\n[input.fields]\n{table}')
    assert err.value.key == key and reason in err.value.reason


def test_declared_fields_need_the_json_or_avro_format() -> None:
    from streamtrain.schemas.config import JobConfigError

    with pytest.raises(JobConfigError, match="only applies when input.format is 'json', 'avro' or 'protobuf'"):
        JobConfig.from_toml('[job]\nname = "j"\n[input]\ntopics = ["t"]\nformat = "binary"\n'
                            '[input.fields]\ndense = ["a"]\nlabel = "y"')


def test_the_old_name_of_the_declared_fields_says_what_it_became() -> None:
    from streamtrain.schemas.config import JobConfigError

    with pytest.raises(JobConfigError, match=r"input.json_fields: renamed: \[input.fields\]"):
        JobConfig.from_toml('[job]\nname = "j"\n[input]\ntopics = ["t"]\n'
                            '[input.json_fields]\ndense = ["a"]\nlabel = "y"')
