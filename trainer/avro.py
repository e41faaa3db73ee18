"""Avro records in Confluent's wire format, decoded by the paths the job declares.

Each record is a zero magic byte, its writer schema's registry id (4 bytes, big-endian), then
the Avro binary encoding of one value of that schema. The schema is fetched from the registry
once per id (`infra.schema_registry.fetch_schema`) and read with fastavro, in C; the value's
records and arrays become dicts and lists, and `DeclaredRecord` maps them as it maps JSON
documents, so `[input.fields]` means the same for both. Each record is read with its own writer
schema: a producer that adds an optional field or drops one changes the id, and the paths
still find what they find (a path no longer present is missing, as in JSON).

`ChunkDecoder` reads a chunk's values one by one into dicts, then converts the dicts to columns
at once (`DeclaredFast.parse_documents`, pyarrow); a record the conversion cannot vouch for is
decoded by `DeclaredAvro` alone, so the verdicts are the one-record decoder's.

A record the job cannot read is bad, with the reason: no magic byte, an id the registry does
not have, a schema that is not Avro or does not parse, bytes that do not match the schema. A
registry that does not answer is not a reason to call records bad: `RegistryUnavailableError`
fails the task, which is tried again later.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import fastavro
import msgspec

from streamtrain.infra.schema_registry import RegisteredSchema, fetch_schema
from streamtrain.jobstate.fields import DeclaredFields
from streamtrain.schemas import Example
from streamtrain.trainer.declared import DeclaredRecord

WIRE_MAGIC = 0
HEADER = 5  # magic byte + schema id

Fetch = Callable[[int], RegisteredSchema | None]


class WriterSchemas:
    """Parsed writer schemas by registry id; an id that cannot be used is remembered with
    its reason, so a stream of such records costs one lookup."""

    def __init__(self, fetch: Fetch, error: type[Exception]) -> None:
        self._fetch = fetch
        self._error = error
        self._parsed: dict[int, object] = {}
        self._refused: dict[int, str] = {}

    def get(self, schema_id: int) -> object:
        parsed = self._parsed.get(schema_id)
        if parsed is not None:
            return parsed
        reason = self._refused.get(schema_id)
        if reason is None:
            try:
                parsed = self._load(schema_id)
            except self._error as exc:
                self._refused[schema_id] = reason = str(exc)
            else:
                self._parsed[schema_id] = parsed
                return parsed
        raise self._error(reason)

    def _load(self, schema_id: int) -> object:
        found = self._fetch(schema_id)
        if found is None:
            raise self._error(f"avro: schema id {schema_id} is not in the registry")
        if found.type != "AVRO":
            raise self._error(f"avro: schema id {schema_id} is a {found.type} schema, the job reads Avro")
        try:
            return fastavro.parse_schema(msgspec.json.decode(found.text))
        except (msgspec.DecodeError, fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as exc:
            raise self._error(f"avro: schema id {schema_id} does not parse: {exc}") from None


class DeclaredAvro(DeclaredRecord):
    """One record in Confluent's Avro wire format into an Example. Raises `error` naming
    what is wrong: the framing, the schema, the bytes, or a declared path."""

    def __init__(self, fields: DeclaredFields, error: type[Exception], stable_id, fetch: Fetch) -> None:
        super().__init__(fields, error, stable_id, "avro")
        self.schemas = WriterSchemas(fetch, error)

    def __call__(self, value: bytes | None) -> Example:
        return self.example(self.document(value))

    def document(self, value: bytes | None) -> dict:
        """The record's value as its writer schema reads it (records as dicts)."""
        if value is None or len(value) < HEADER or value[0] != WIRE_MAGIC:
            shown = "no value" if value is None else f"{len(value)} bytes starting {bytes(value[:HEADER])!r}"
            raise self._error(f"avro: not in Confluent's wire format (a zero byte, then a 4-byte schema id), "
                              f"got {shown}")
        schema_id = int.from_bytes(value[1:HEADER], "big")
        schema = self.schemas.get(schema_id)
        stream = io.BytesIO(value)
        stream.seek(HEADER)
        try:
            doc = fastavro.schemaless_reader(stream, schema, None)
        except (EOFError, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as exc:
            raise self._error(f"avro: the bytes do not match schema id {schema_id}: {exc!r}") from None
        if stream.tell() != len(value):
            raise self._error(f"avro: {len(value) - stream.tell()} bytes left over after a value of schema id "
                              f"{schema_id}")
        if not isinstance(doc, dict):
            raise self._error(f"avro: schema id {schema_id} is not a record schema, got a {type(doc).__name__}")
        return doc


def registry_fetch(url: str) -> Fetch:
    return lambda schema_id: fetch_schema(url, schema_id)
