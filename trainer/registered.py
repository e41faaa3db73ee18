"""Avro and Protobuf records in Confluent's wire format, decoded by the paths the job declares.

Each record is a zero magic byte, its writer schema's registry id (4 bytes, big-endian), then
for Protobuf the message's indexes in the schema's file (a count and the indexes, zigzag
varints; the single byte 0 for the first message), then the value's binary encoding. The
schema is fetched from the registry once per id (`infra.schema_registry.fetch_schema`): an
Avro schema is read with fastavro, in C; a `.proto` file is compiled by protoc (grpcio-tools)
into a descriptor pool of its own and its messages parsed by the protobuf runtime (upb, in C).
Either way the value becomes dicts and lists, and `DeclaredRecord` maps them as it maps JSON
documents, so `[input.fields]` means the same for all three. Each record is read with its own
writer schema: a producer that adds an optional field or drops one registers a new id, and the
paths still find what they find (a path no longer present is missing, as in JSON).

Protobuf values as dicts: a nested message is a dict if set, else missing; a scalar without
presence (proto3's) is its value even when it is the default (`clicked = false` is false, not
missing); one with presence (`optional`, proto2) is missing unless set; an enum is its value's
name (hashed, as strings are); `google.protobuf.Timestamp` is a time and the wrapper types
(`Int64Value`, ...) their value.

`ChunkDecoder` reads a chunk's values one by one into dicts, then converts the dicts to columns
at once (`DeclaredFast.parse_documents`, pyarrow); a record the conversion cannot vouch for is
decoded alone, so the verdicts are the one-record decoder's.

A record the job cannot read is bad, with the reason: no magic byte, an id the registry does
not have, a schema of the other kind or one that does not parse, bytes that do not match the
schema. A registry that does not answer is not a reason to call records bad:
`RegistryUnavailableError` gives the task back, to be tried again after a wait.
"""

from __future__ import annotations

import datetime as dt
import io
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, cast

import fastavro
import msgspec
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message

from streamtrain.infra.schema_registry import RegisteredSchema, fetch_schema
from streamtrain.schemas import Example
from streamtrain.schemas.fields import DeclaredFields
from streamtrain.trainer.declared import DeclaredRecord

if TYPE_CHECKING:
    from fastavro.types import Schema

WIRE_MAGIC = 0
HEADER = 5  # magic byte + schema id

Fetch = Callable[[int], RegisteredSchema | None]


def registry_fetch(url: str) -> Fetch:
    return lambda schema_id: fetch_schema(url, schema_id)


class WriterSchemas:
    """What reads each registry id's values (`load` builds it from the schema); an id that
    cannot be used is remembered with its reason, so a stream of such records costs one lookup."""

    def __init__(self, fetch: Fetch, error: type[Exception], schema_type: str,
                 load: Callable[[RegisteredSchema], object]) -> None:
        self._fetch = fetch
        self._error = error
        self._type = schema_type
        self._load = load
        self._readers: dict[int, object] = {}
        self._refused: dict[int, str] = {}

    def get(self, schema_id: int) -> object:
        reader = self._readers.get(schema_id)
        if reader is not None:
            return reader
        reason = self._refused.get(schema_id)
        if reason is None:
            try:
                reader = self._reader(schema_id)
            except self._error as exc:
                self._refused[schema_id] = reason = str(exc)
            else:
                self._readers[schema_id] = reader
                return reader
        raise self._error(reason)

    def _reader(self, schema_id: int) -> object:
        found = self._fetch(schema_id)
        what = self._type.lower()
        if found is None:
            raise self._error(f"{what}: schema id {schema_id} is not in the registry")
        if found.type != self._type:
            raise self._error(f"{what}: schema id {schema_id} is a {found.type} schema, the job reads "
                              f"{_NAMES[self._type]}")
        try:
            return self._load(found)
        except _SchemaError as exc:
            raise self._error(f"{what}: schema id {schema_id} does not parse: {exc}") from None


_NAMES = {"AVRO": "Avro", "PROTOBUF": "Protobuf"}


class _SchemaError(Exception):
    """A registered schema this module cannot read (the reason in the message)."""


class _Framed(DeclaredRecord):
    schema_type: str  # as the registry names it: AVRO, PROTOBUF

    def __init__(self, fields: DeclaredFields, error: type[Exception], stable_id, fetch: Fetch) -> None:
        super().__init__(fields, error, stable_id, self.schema_type.lower())
        self.schemas = WriterSchemas(fetch, error, self.schema_type, self._load)

    def __call__(self, value: bytes | None) -> Example:
        return self.example(self.document(value))

    def document(self, value: bytes | None) -> dict:
        """The record's value as its writer schema reads it (records as dicts)."""
        if value is None or len(value) < HEADER or value[0] != WIRE_MAGIC:
            shown = "no value" if value is None else f"{len(value)} bytes starting {bytes(value[:HEADER])!r}"
            raise self._error(f"{self._kind}: not in Confluent's wire format (a zero byte, then a 4-byte schema "
                              f"id), got {shown}")
        schema_id = int.from_bytes(value[1:HEADER], "big")
        return self._read(schema_id, self.schemas.get(schema_id), value)

    def _load(self, found: RegisteredSchema) -> object:
        raise NotImplementedError

    def _read(self, schema_id: int, reader: object, value: bytes) -> dict:
        raise NotImplementedError


class DeclaredAvro(_Framed):
    """One Avro record in Confluent's wire format into an Example. Raises `error` naming what
    is wrong: the framing, the schema, the bytes, or a declared path."""

    schema_type = "AVRO"

    def _load(self, found: RegisteredSchema) -> object:
        try:
            return fastavro.parse_schema(msgspec.json.decode(found.text))
        except (msgspec.DecodeError, fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as exc:
            raise _SchemaError(str(exc)) from None

    def _read(self, schema_id: int, reader: object, value: bytes) -> dict:
        stream = io.BytesIO(value)
        stream.seek(HEADER)
        try:
            # `reader` is what this class's `_load` made of the schema: fastavro's parsed schema.
            doc = fastavro.schemaless_reader(stream, cast("Schema", reader), None)
        except (EOFError, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as exc:
            raise self._error(f"avro: the bytes do not match schema id {schema_id}: {exc!r}") from None
        if stream.tell() != len(value):
            raise self._error(f"avro: {len(value) - stream.tell()} bytes left over after a value of schema id "
                              f"{schema_id}")
        if not isinstance(doc, dict):
            raise self._error(f"avro: schema id {schema_id} is not a record schema, got a {type(doc).__name__}")
        return doc


class DeclaredProtobuf(_Framed):
    """One Protobuf record in Confluent's wire format into an Example, as `DeclaredAvro`."""

    schema_type = "PROTOBUF"

    def _load(self, found: RegisteredSchema) -> object:
        return compile_proto(found.text)

    def _read(self, schema_id: int, reader: object, value: bytes) -> dict:
        messages: list[Descriptor] = reader  # type: ignore[assignment]
        pos, indexes = _message_indexes(value, HEADER)
        if pos < 0:
            raise self._error(f"protobuf: the message indexes after schema id {schema_id} are cut off")
        descriptor = _message_at(messages, indexes)
        if descriptor is None:
            raise self._error(f"protobuf: schema id {schema_id} has no message at indexes {indexes}")
        try:
            message = message_factory.GetMessageClass(descriptor).FromString(value[pos:])
        except ProtobufDecodeError as exc:
            raise self._error(f"protobuf: the bytes do not match {descriptor.full_name} of schema id {schema_id}: "
                              f"{exc}") from None
        return _document(message)


def compile_proto(text: str) -> list[Descriptor]:
    """The top-level messages of a `.proto` file, compiled by protoc (grpcio-tools, in a child
    process so its complaints can be read) into a pool of their own, the well-known types
    importable; raises _SchemaError with protoc's complaint."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "schema.proto").write_text(text)
        out = Path(tmp, "schema.pb")
        done = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{files('grpc_tools') / '_proto'}",
             f"--descriptor_set_out={out}", "--include_imports", "schema.proto"],
            capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0 or not out.exists():
            raise _SchemaError(done.stderr.strip().replace(tmp + "/", "")[-500:] or f"protoc exit {done.returncode}")
        compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in compiled.file:
        pool.Add(proto)
    return list(pool.FindFileByName("schema.proto").message_types_by_name.values())


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position); position -1 if the varint runs past the end."""
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return 0, -1


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _varint(data, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def _message_indexes(data: bytes, pos: int) -> tuple[int, list[int]]:
    """Confluent's message indexes: a count, then that many indexes (a lone 0: [0])."""
    count, pos = _zigzag(data, pos)
    if pos < 0:
        return -1, []
    if count == 0:
        return pos, [0]
    indexes = []
    for _ in range(min(count, 64)):
        index, pos = _zigzag(data, pos)
        if pos < 0:
            return -1, []
        indexes.append(index)
    return pos, indexes


def _message_at(messages: list[Descriptor], indexes: list[int]) -> Descriptor | None:
    found: Descriptor | None = None
    for index in indexes:
        choices = messages if found is None else found.nested_types
        if not 0 <= index < len(choices):
            return None
        found = choices[index]
    return found


_UTC = dt.timezone.utc
_WRAPPERS = {f"google.protobuf.{name}Value" for name in
             ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}


# How each field of a message type becomes a value, worked out once per type: a record's
# conversion is then a loop over (name, has presence, repeated, convert) tuples.
_Convert = Callable[[object], object] | None
# Keyed by the descriptor itself: two versions of a schema share full names, not fields.
_PLANS: dict[Descriptor, list[tuple[str, bool, bool, _Convert]]] = {}


def _document(message: Message) -> dict:
    out: dict[str, object] = {}
    for name, presence, repeated, convert in _plan(message.DESCRIPTOR):
        if repeated:
            values = getattr(message, name)
            out[name] = list(values) if convert is None else [convert(v) for v in values]
        elif presence and not message.HasField(name):
            continue
        else:
            value = getattr(message, name)
            out[name] = value if convert is None else convert(value)
    return out


def _plan(descriptor: Descriptor) -> list[tuple[str, bool, bool, _Convert]]:
    plan = _PLANS.get(descriptor)
    if plan is None:
        plan = []
        for field in descriptor.fields:
            kind = field.message_type
            if field.is_repeated and kind is not None and kind.GetOptions().map_entry:
                continue  # maps are not paths of ours
            plan.append((field.name, field.has_presence, field.is_repeated, _converter(field)))
        _PLANS[descriptor] = plan
    return plan


def _converter(field: FieldDescriptor) -> _Convert:
    kind = field.message_type
    if kind is not None:
        if kind.full_name == "google.protobuf.Timestamp":
            return lambda value: value.ToDatetime(tzinfo=_UTC)  # type: ignore[attr-defined]
        if kind.full_name in _WRAPPERS:
            return lambda value: value.value  # type: ignore[attr-defined]
        return _document
    if field.enum_type is not None:
        names = {number: value.name for number, value in field.enum_type.values_by_number.items()}
        return lambda value: names.get(value, value)
    return None
