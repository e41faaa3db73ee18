"""Avro and Protobuf records in Confluent's wire format (trainer/registered.py): the same
declared paths as JSON, each record read with its own writer schema, and a clear reason for
every record it cannot read. The registry is a dict here; tests/integration/test_own_topics.py
uses a real one."""

from __future__ import annotations

import datetime as dt
import functools
import io
import json

import fastavro
import pytest
from google.protobuf import message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.infra.schema_registry import RegisteredSchema, RegistryUnavailableError
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder, DecodeError, make_decoder, stable_id
from streamtrain.trainer.registered import DeclaredAvro, DeclaredProtobuf, compile_proto
from test_trainer_parts import assert_chunk_decodes_as_one_by_one

V1 = {"type": "record", "name": "Click", "fields": [
    {"name": "user", "type": {"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "long"}, {"name": "country", "type": "string"}]}},
    {"name": "tags", "type": {"type": "array", "items": "long"}},
    {"name": "price", "type": "double"},
    {"name": "clicked", "type": "boolean"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
# The producer's next version drops the country and adds an optional device.
V2 = {**V1, "fields": [
    {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}},
    *V1["fields"][1:],
    {"name": "device", "type": ["null", "string"], "default": None},
]}

JOB = '''[job]
name = "j"
[input]
topics = ["t"]
format = "avro"
registry = "http://127.0.0.1:1/apis/ccompat/v7"
[input.fields]
sparse = { user = "user.id", country = "user.country", tags = "tags", device = "device" }
dense = ["price"]
label = "clicked"
time = "ts"
'''


class Registry:
    def __init__(self, *schemas: tuple[int, str, object]) -> None:
        self.schemas = {i: RegisteredSchema(i, text if isinstance(text, str) else json.dumps(text), kind)
                        for i, kind, text in schemas}
        self.lookups: list[int] = []

    def __call__(self, schema_id: int) -> RegisteredSchema | None:
        self.lookups.append(schema_id)
        return self.schemas.get(schema_id)


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    out.write(b"\0" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


WHEN = dt.datetime(2026, 11, 23, 10, 0, 0, 250000, tzinfo=dt.timezone.utc)
R1 = {"user": {"id": 81723, "country": "de"}, "tags": [3, 9], "price": 0.42, "clicked": True, "ts": WHEN}
R2 = {"user": {"id": 81723}, "tags": [], "price": 1.5, "clicked": False, "ts": WHEN, "device": "ios"}


def decoder(registry: Registry) -> DeclaredAvro:
    return DeclaredAvro(JobConfig.from_toml(JOB).input.fields, DecodeError, stable_id, registry)


def test_records_of_two_schema_versions_become_examples_by_the_declared_paths() -> None:
    decode = decoder(Registry((1, "AVRO", V1), (2, "AVRO", V2)))
    first, second = decode(framed(1, V1, R1)), decode(framed(2, V2, R2))
    assert first.sparse == {"user": (81723,), "country": (stable_id("de"),), "tags": (3, 9)}
    assert first.dense == pytest.approx((0.42,))  # float32, as every example's
    assert (first.label, first.event_time_ms) == (1.0, 1795428000250)
    assert second.sparse == {"user": (81723,), "device": (stable_id("ios"),)}
    assert (second.dense, second.label) == ((1.5,), 0.0)


def test_each_schema_is_fetched_once_and_an_unknown_id_once() -> None:
    registry = Registry((1, "AVRO", V1))
    decode = decoder(registry)
    for _ in range(3):
        decode(framed(1, V1, R1))
    for _ in range(2):
        with pytest.raises(DecodeError, match="schema id 7 is not in the registry"):
            decode(framed(7, V1, R1))
    assert registry.lookups == [1, 7]


@pytest.mark.parametrize("value, reason", [
    (b'{"user": 1}', "not in Confluent's wire format"),
    (b"\0\0\0", "not in Confluent's wire format"),
    (framed(1, V1, R1)[:-3], "the bytes do not match schema id 1"),
    (framed(1, V1, R1) + b"\1", "1 bytes left over after a value of schema id 1"),
    (framed(3, V1, R1), "schema id 3 is a PROTOBUF schema, the job reads Avro"),
    (framed(4, V1, R1), "schema id 4 does not parse"),
    (framed(5, {"type": "long"}, 12), "schema id 5 is not a record schema"),
])
def test_a_record_it_cannot_read_is_bad_with_the_reason(value, reason) -> None:
    registry = Registry((1, "AVRO", V1), (3, "PROTOBUF", 'syntax = "proto3";'), (4, "AVRO", '{"type": "nope"}'),
                        (5, "AVRO", {"type": "long"}))
    with pytest.raises(DecodeError, match=reason):
        decoder(registry)(value)


def test_a_declared_path_the_record_does_not_satisfy_is_named() -> None:
    schema = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "price"]}
    with pytest.raises(DecodeError, match="avro field 'price' \\(dense\\): missing, and no default"):
        decoder(Registry((1, "AVRO", schema)))(framed(1, schema, {k: v for k, v in R1.items() if k != "price"}))


def test_a_chunk_keeps_its_good_records_and_names_the_bad_ones() -> None:
    registry = Registry((1, "AVRO", V1))
    section = JobConfig.from_toml(JOB).input
    chunk = ChunkDecoder(section, ("country", "device", "tags", "user"), 1, registry)
    decoded = chunk.decode([framed(1, V1, R1), b"junk", framed(1, V1, {**R1, "clicked": False})])
    assert decoded.columns.labels.tolist() == [1.0, 0.0]
    assert [(i, "wire format" in reason) for i, reason in decoded.bad] == [(1, True)]
    assert make_decoder(section, registry)(framed(1, V1, R1)).label == 1.0


_longs = st.integers(-5, 2**63 - 1)
_v1 = st.fixed_dictionaries({
    "user": st.fixed_dictionaries({"id": _longs, "country": st.sampled_from(["de", "fr", ""])}),
    "tags": st.lists(_longs, max_size=3), "price": st.floats(allow_nan=True, allow_infinity=True),
    "clicked": st.booleans(), "ts": st.integers(0, 2**41).map(lambda ms: WHEN + dt.timedelta(milliseconds=ms))})
_v2 = _v1.map(lambda r: {**r, "user": {"id": r["user"]["id"]}}).flatmap(
    lambda r: st.sampled_from([None, "ios", "web"]).map(lambda d: {**r, "device": d}))
_values = st.lists(st.one_of(
    _v1.map(lambda r: framed(1, V1, r)), _v2.map(lambda r: framed(2, V2, r)),
    st.sampled_from([None, b"", b"\0\0\0\0\7xyz", b"\1\0\0\0\1"]),
    _v1.map(lambda r: framed(1, V1, r)[:-2])), max_size=30)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_chunks_of_two_schema_versions_decode_as_one_by_one_does(values) -> None:
    registry = Registry((1, "AVRO", V1), (2, "AVRO", V2))
    assert_chunk_decodes_as_one_by_one(JobConfig.from_toml(JOB).input, ("country", "device", "tags", "user"),
                                       values, dense=1, registry=registry)


# ---------------------------------------------------------------------------------- Protobuf
P1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Click {
  message User { int64 id = 1; string country = 2; }
  User user = 1;
  repeated int64 tags = 2;
  double price = 3;
  bool clicked = 4;
  google.protobuf.Timestamp ts = 5;
}
message Other { int64 x = 1; }
"""
# The next version drops the country and adds an optional device (an enum).
P2 = P1.replace("int64 id = 1; string country = 2;", "int64 id = 1;").replace(
    "  google.protobuf.Timestamp ts = 5;\n", "  google.protobuf.Timestamp ts = 5;\n"
    "  enum Device { UNKNOWN = 0; IOS = 1; }\n  optional Device device = 6;\n")
PROTO_JOB = JOB.replace('format = "avro"', 'format = "protobuf"')


@functools.cache
def message_class(text: str):
    return message_factory.GetMessageClass(compile_proto(text)[0])


def message(text: str, **values):
    cls = message_class(text)
    ts = values.pop("ts", None)
    out = cls(**values)
    if ts is not None:
        out.ts.FromDatetime(ts)
    return out


def proto_framed(schema_id: int, msg, indexes: bytes = b"\0") -> bytes:
    return b"\0" + schema_id.to_bytes(4, "big") + indexes + msg.SerializeToString()


def proto_decoder(registry: Registry) -> DeclaredProtobuf:
    return DeclaredProtobuf(JobConfig.from_toml(PROTO_JOB).input.fields, DecodeError, stable_id, registry)


def test_protobuf_records_of_two_schema_versions_become_examples_by_the_declared_paths() -> None:
    decode = proto_decoder(Registry((1, "PROTOBUF", P1), (2, "PROTOBUF", P2)))
    first = decode(proto_framed(1, message(P1, user={"id": 81723, "country": "de"}, tags=[3, 9], price=0.42,
                                           clicked=True, ts=WHEN)))
    assert first.sparse == {"user": (81723,), "country": (stable_id("de"),), "tags": (3, 9)}
    assert first.dense == pytest.approx((0.42,))
    assert (first.label, first.event_time_ms) == (1.0, 1795428000250)
    # proto3's defaults are values: an unset `clicked` is false and an unset price 0, not missing;
    # an optional field set is there, named by its enum value.
    second = decode(proto_framed(2, message(P2, user={"id": 5}, ts=WHEN, device=1)))
    assert second.sparse == {"user": (5,), "device": (stable_id("IOS"),)}
    assert (second.dense, second.label) == ((0.0,), 0.0)


def test_protobuf_message_indexes_pick_the_message() -> None:
    decode = proto_decoder(Registry((1, "PROTOBUF", P1)))
    with pytest.raises(DecodeError, match="protobuf field 'price' \\(dense\\): missing"):
        # indexes [1] (count 1, index 1, zigzag: 2 2) name `Other`, which has no price
        decode(proto_framed(1, message(P1, clicked=True), indexes=b"\2\2"))
    with pytest.raises(DecodeError, match="has no message at indexes \\[5\\]"):
        decode(proto_framed(1, message(P1), indexes=b"\2\12"))


@pytest.mark.parametrize("value, reason", [
    (b"\1\0\0\0\1\0", "protobuf: not in Confluent's wire format"),
    (b"\0\0\0\0\1\0\x0a\xff", "protobuf: the bytes do not match shop.Click of schema id 1"),
    (b"\0\0\0\0\1\x82", "the message indexes after schema id 1 are cut off"),
    (b"\0\0\0\0\2\0", "schema id 2 is a AVRO schema, the job reads Protobuf"),
    (b"\0\0\0\0\3\0", "schema id 3 does not parse: .*Expected"),
])
def test_a_protobuf_record_it_cannot_read_is_bad_with_the_reason(value, reason) -> None:
    registry = Registry((1, "PROTOBUF", P1), (2, "AVRO", V1), (3, "PROTOBUF", "syntax = \"proto3\"; message {"))
    with pytest.raises(DecodeError, match=reason):
        proto_decoder(registry)(value)


def test_protobuf_chunks_decode_as_one_by_one_does() -> None:
    registry = Registry((1, "PROTOBUF", P1), (2, "PROTOBUF", P2))
    values = [proto_framed(1, message(P1, user={"id": i, "country": "fr"}, tags=[i, 2 * i], price=i / 3,
                                      clicked=i % 2 == 0, ts=WHEN)) for i in range(20)]
    values += [proto_framed(2, message(P2, user={"id": 7}, ts=WHEN, device=i % 2)) for i in range(5)]
    values += [None, b"junk", proto_framed(1, message(P1))[:-1] + b"\xff"]
    assert_chunk_decodes_as_one_by_one(JobConfig.from_toml(PROTO_JOB).input, ("country", "device", "tags", "user"),
                                       values, dense=1, registry=registry)


def test_a_registry_that_does_not_answer_judges_no_record() -> None:
    def away(schema_id: int):
        raise RegistryUnavailableError(f"schema registry http://r: schema id {schema_id}: connection refused")

    chunk = ChunkDecoder(JobConfig.from_toml(JOB).input, ("country", "device", "tags", "user"), 1, away)
    with pytest.raises(RegistryUnavailableError):  # the trainer gives the task back (trainer/worker.py)
        chunk.decode([framed(1, V1, R1)])
