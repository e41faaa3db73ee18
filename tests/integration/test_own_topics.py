"""A job pointed at topics not written for streamtrain (issue 15): the same click log as a
service's nested JSON, as a CSV export with columns the model must not see, and as Avro and as
Protobuf records whose schema, held by a real registry, changes mid-stream, trains as well as
the same records in Example JSON, and `streamtrain job check` reads each as the trainers do."""

from __future__ import annotations

import dataclasses
import io
import json
import urllib.request
import uuid

import fastavro
import pytest
from google.protobuf import message_factory

from conftest import write_job_file
from streamtrain.infra import Ports
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
from streamtrain.infra.schema_registry import RegistryUnavailableError, fetch_schema
from streamtrain.trainer.registered import compile_proto
from test_cli_jobs import streamtrain
from test_trainer import MODEL, distributed_and_single_auc, make_job, write_examples

pytestmark = [pytest.mark.services, pytest.mark.slow]

TRAIN = MODEL.examples(8_000)
FIELDS = list(MODEL.fields)


def nested(example) -> bytes:
    return json.dumps({"event": {"ids": {f: example.sparse[f][0] for f in FIELDS if example.sparse.get(f)},
                                 "request": "r-1"},
                       "features": {f"d{j}": x for j, x in enumerate(example.dense)},
                       "clicked": example.label > 0.5, "ts": example.event_time_ms}).encode()


def csv_line(i: int, example) -> bytes:
    ids = ["|".join(map(str, example.sparse.get(f, ()))) for f in FIELDS]
    cells = [f"req-{i}", repr(example.label), *ids, *map(repr, example.dense), str(example.event_time_ms),
             f'"{example.label}, later"']
    return ",".join(cells).encode()


def avro_schema(version: int) -> dict:
    """The click log's writer schema: version 2 drops `request` and adds an optional `device`."""
    event = [{"name": "ids", "type": {"type": "record", "name": "Ids", "fields": [
        {"name": f, "type": {"type": "array", "items": "long"}} for f in FIELDS]}}]
    if version == 1:
        event.append({"name": "request", "type": "string"})
    fields = [
        {"name": "event", "type": {"type": "record", "name": "Event", "fields": event}},
        {"name": "features", "type": {"type": "record", "name": "Features", "fields": [
            {"name": f"d{j}", "type": "double"} for j in range(MODEL.dense_features)]}},
        {"name": "clicked", "type": "boolean"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]
    if version == 2:
        fields.append({"name": "device", "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Click", "namespace": "shop", "fields": fields}


def proto_schema(version: int) -> str:
    """The click log as a .proto file: version 2 drops `request` and adds an optional `device`."""
    ids = " ".join(f"repeated int64 {f} = {i};" for i, f in enumerate(FIELDS, 1))
    features = " ".join(f"double d{j} = {j + 1};" for j in range(MODEL.dense_features))
    request = "string request = 2;" if version == 1 else ""
    device = "optional string device = 5;" if version == 2 else ""
    return f"""syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Click {{
  message Ids {{ {ids} }}
  message Event {{ Ids ids = 1; {request} }}
  message Features {{ {features} }}
  Event event = 1;
  Features features = 2;
  bool clicked = 3;
  google.protobuf.Timestamp ts = 4;
  {device}
}}
"""


def register(registry: str, subject: str, schema: dict | str) -> int:
    kind = {"schemaType": "PROTOBUF"} if isinstance(schema, str) else {}
    body = json.dumps({"schema": schema if isinstance(schema, str) else json.dumps(schema), **kind}).encode()
    request = urllib.request.Request(f"{registry}/subjects/{subject}/versions", body,
                                     {"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())["id"]


def avro_records(registry: str, topic: str) -> list[bytes]:
    """The records in Confluent's wire format, the second half under the schema's next version."""
    ids = {v: register(registry, f"{topic}-value", avro_schema(v)) for v in (1, 2)}
    parsed = {v: fastavro.parse_schema(avro_schema(v)) for v in (1, 2)}
    out = []
    for i, e in enumerate(TRAIN):
        version = 1 if i < len(TRAIN) // 2 else 2
        event = {"ids": {f: list(e.sparse.get(f, ())) for f in FIELDS},
                 **({"request": f"r-{i}"} if version == 1 else {})}
        record = {"event": event, "features": {f"d{j}": x for j, x in enumerate(e.dense)}, "clicked": e.label > 0.5,
                  "ts": e.event_time_ms, **({"device": "ios"} if version == 2 else {})}
        buf = io.BytesIO()
        buf.write(b"\0" + ids[version].to_bytes(4, "big"))
        fastavro.schemaless_writer(buf, parsed[version], record)
        out.append(buf.getvalue())
    return out


def protobuf_records(registry: str, topic: str) -> list[bytes]:
    """The records in Confluent's wire format, the second half under the schema's next version."""
    ids = {v: register(registry, f"{topic}-value", proto_schema(v)) for v in (1, 2)}
    classes = {v: message_factory.GetMessageClass(compile_proto(proto_schema(v))[0]) for v in (1, 2)}
    out = []
    for i, e in enumerate(TRAIN):
        version = 1 if i < len(TRAIN) // 2 else 2
        event = {"ids": {f: list(e.sparse.get(f, ())) for f in FIELDS},
                 **({"request": f"r-{i}"} if version == 1 else {})}
        record = classes[version](event=event, features={f"d{j}": x for j, x in enumerate(e.dense)},
                                  clicked=e.label > 0.5, **({"device": "ios"} if version == 2 else {}))
        record.ts.FromMilliseconds(e.event_time_ms)
        out.append(b"\0" + ids[version].to_bytes(4, "big") + b"\0" + record.SerializeToString())
    return out


FORMATS = {
    "example": ([e.to_json() for e in TRAIN], {}),
    "nested": ([nested(e) for e in TRAIN], {"fields": {
        "sparse": {f: f"event.ids.{f}" for f in FIELDS},
        "dense": [f"features.d{j}" for j in range(MODEL.dense_features)],
        "label": "clicked", "time": "ts"}}),
    "csv": ([csv_line(i, e) for i, e in enumerate(TRAIN)], {"format": "csv", "csv_columns": [
        "request:ignore", "y:label", *(f"{f}:sparse" for f in FIELDS),
        *(f"d{j}:dense" for j in range(MODEL.dense_features)), "ts:time", "revenue:ignore"]}),
    "avro": (avro_records, {"format": "avro", "fields": {
        "sparse": {f: f"event.ids.{f}" for f in FIELDS},
        "dense": [f"features.d{j}" for j in range(MODEL.dense_features)],
        "label": "clicked", "time": "ts"}}),
    "protobuf": (protobuf_records, {"format": "protobuf", "fields": {
        "sparse": {f: f"event.ids.{f}" for f in FIELDS},
        "dense": [f"features.d{j}" for j in range(MODEL.dense_features)],
        "label": "clicked", "time": "ts"}}),
}


@pytest.fixture(scope="module")
def aucs(services, registry, tmp_path_factory) -> dict[str, float]:
    """Holdout AUC after one sync pass over each form of the same records, and a single
    process's on the same examples in the order the job trained them."""
    out, redis_conn = {}, redis_client(services)
    for name, (values, input_section) in FORMATS.items():
        topic = f"own-{name}-{uuid.uuid4().hex[:10]}"
        ensure_topics(services, [TopicSpec(topic, 2)])
        if name in ("avro", "protobuf"):
            values, input_section = values(registry, topic), {**input_section, "registry": registry}
        counts = write_examples(services, topic, values, 2)
        config = make_job(f"{topic}-job", topic, tmp_path_factory.mktemp(name), sgd="sync")
        config = dataclasses.replace(config, input=dataclasses.replace(config.input, **input_section))
        out[name], out[f"{name}-single"] = distributed_and_single_auc(
            services, redis_conn, config, TRAIN, topic, counts, 1)
        check = streamtrain(services, "job", "check", "--job", str(write_job_file(
            tmp_path_factory.mktemp(name) / "job.toml", config)), "--sample", "500", "--json")
        assert check.returncode == 0, check.stderr.decode()
        report = json.loads(check.stdout)
        assert (report["records"], report["good"]) == (500, 500), report["bad"][:3]
        assert {f["name"] for f in report["fields"] if f["used"]} == set(FIELDS)
    redis_conn.close()
    print(f"holdout AUC: {out}")
    return out


# `aucs` counts toward the first of these (pytest-timeout, func_only = false): the registry's
# start (60 s at most) and five jobs, each waited on for 240 s to finish and 30 s to be applied
# (`train_one_pass`), 1,410 s at most, besides each single-process run and `job check`.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", ["nested", "csv", "avro", "protobuf"])
def test_a_log_of_its_own_form_trains_as_well_as_example_json(aucs, name) -> None:
    # Each against a single process on the same examples in the same order: the AUC of two
    # sync runs in different task orders differs by up to 0.006 on its own.
    assert aucs["example"] > 0.72
    assert abs(aucs["example"] - aucs["example-single"]) < 0.002, aucs
    assert abs(aucs[name] - aucs[f"{name}-single"]) < 0.002, aucs


def test_the_registry_client_tells_an_unknown_id_from_a_registry_away(registry) -> None:
    assert fetch_schema(registry, 987654) is None
    with pytest.raises(RegistryUnavailableError, match="schema id 1"):
        fetch_schema(f"http://127.0.0.1:{Ports.free().registry}/apis/ccompat/v7", 1, timeout=1, attempts=1)
