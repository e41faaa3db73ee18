"""Records a second each input format decodes into a job's columns, on one core.

    python -m bench.decoding [--records 200000] [--chunk 4096]

The production workload of `bench.e2e` (8 fields, Zipf ids, 4 dense features, a label, an event
time), the same records written six ways: streamtrain's Example JSON; CSV lines; a log's own
nested JSON read through `input.fields` (ids as numbers); the same with the ids and the
event time as strings (ids hashed, ISO-8601 times); the nested records as Avro and as Protobuf
in Confluent's wire format (`timestamp-millis` and `google.protobuf.Timestamp` times; the
writer schema handed over in process, as a registry lookup is once per schema). Each is decoded by the trainers' own
`ChunkDecoder`, a chunk at a time as a loader does; every format must give the same columns as
Example JSON (ids aside where strings are hashed). Prints one JSON report: per format, records/s
and µs a record (the best of --rounds rounds, CPU time of this process).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import time

import fastavro
import numpy as np
from google.protobuf import message_factory

from bench.e2e import Workload
from streamtrain.infra.schema_registry import RegisteredSchema
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder
from streamtrain.trainer.registered import compile_proto


def declared_records(w: Workload, strings: bool) -> tuple[list[bytes], str]:
    """The records as a service might log them, and the job's [input.fields] for them."""
    c, fields = w.train, w.model.fields
    origin = w.model.config.origin_ms
    out = []
    ids = {f: c.ids[f].tolist() for f in fields}
    dense, clicked, index = c.dense.astype(np.float64).tolist(), c.clicked.tolist(), c.index.tolist()
    for k in range(len(index)):
        ms = index[k] + origin
        when = (dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
                if strings else ms)
        doc = {"event": {f: (f"{f}-{ids[f][k]}" if strings else ids[f][k]) for f in fields},
               "features": {f"d{j}": x for j, x in enumerate(dense[k])},
               "clicked": bool(clicked[k]), "ts": when}
        out.append(json.dumps(doc, separators=(",", ":")).encode())
    sparse = ", ".join(f'{f} = "event.{f}"' for f in fields)
    dense_paths = ", ".join(f'"features.d{j}"' for j in range(w.model.dense_features))
    section = f'[input.fields]\nsparse = {{ {sparse} }}\ndense = [{dense_paths}]\nlabel = "clicked"\ntime = "ts"'
    return out, section


def avro_records(w: Workload, docs: list[bytes]) -> tuple[list[bytes], dict]:
    """The nested records (ids as numbers) as Avro of one writer schema, id 1, and that schema."""
    schema = {"type": "record", "name": "Click", "fields": [
        {"name": "event", "type": {"type": "record", "name": "Event", "fields": [
            {"name": f, "type": "long"} for f in w.model.fields]}},
        {"name": "features", "type": {"type": "record", "name": "Features", "fields": [
            {"name": f"d{j}", "type": "double"} for j in range(w.model.dense_features)]}},
        {"name": "clicked", "type": "boolean"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    parsed, out = fastavro.parse_schema(schema), []
    for doc in map(json.loads, docs):
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0\1")
        fastavro.schemaless_writer(buf, parsed, doc)
        out.append(buf.getvalue())
    return out, schema


def protobuf_records(w: Workload, docs: list[bytes]) -> tuple[list[bytes], str]:
    """The nested records (ids as numbers) as Protobuf of one `.proto` file, id 2, and that file."""
    event = " ".join(f"int64 {f} = {i};" for i, f in enumerate(w.model.fields, 1))
    features = " ".join(f"double d{j} = {j + 1};" for j in range(w.model.dense_features))
    text = f"""syntax = "proto3";
import "google/protobuf/timestamp.proto";
message Click {{
  message Event {{ {event} }}
  message Features {{ {features} }}
  Event event = 1; Features features = 2; bool clicked = 3; google.protobuf.Timestamp ts = 4;
}}
"""
    cls = message_factory.GetMessageClass(compile_proto(text)[0])
    out = []
    for doc in map(json.loads, docs):
        ts = doc.pop("ts")
        message = cls(**doc)
        message.ts.FromMilliseconds(ts)
        out.append(b"\0\0\0\0\2\0" + message.SerializeToString())
    return out, text


def job(input_lines: str) -> JobConfig:
    return JobConfig.from_toml(f'[job]\nname = "bench"\n[input]\ntopics = ["t"]\n{input_lines}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    started = time.perf_counter()
    w = Workload.make(args.records, 0)
    fields, dense = tuple(w.model.fields), w.model.dense_features
    csv_columns = ", ".join(f'"{c}"' for c in w.csv_columns())
    numbers, numbers_section = declared_records(w, strings=False)
    strings, strings_section = declared_records(w, strings=True)
    avro, schema = avro_records(w, numbers)
    protobuf, proto = protobuf_records(w, numbers)
    registry = {1: RegisteredSchema(1, json.dumps(schema), "AVRO"), 2: RegisteredSchema(2, proto, "PROTOBUF")}.get
    formats = {
        "example_json": (w.json_records(), job("")),
        "csv": (w.csv_lines(), job(f'format = "csv"\ncsv_columns = [{csv_columns}]')),
        "declared_json": (numbers, job(numbers_section)),
        "declared_json_strings": (strings, job(strings_section)),
        "avro": (avro, job(f'format = "avro"\n{numbers_section}')),
        "protobuf": (protobuf, job(f'format = "protobuf"\n{numbers_section}')),
    }
    setup_s = time.perf_counter() - started

    report: dict[str, dict[str, float]] = {}
    reference = None
    for name, (records, config) in formats.items():
        decoder = ChunkDecoder(config.input, fields, dense, registry)
        chunks = [records[i:i + args.chunk] for i in range(0, len(records), args.chunk)]
        best = float("inf")
        for _ in range(args.rounds):
            began = time.process_time()
            decoded = [decoder.decode(chunk) for chunk in chunks]
            best = min(best, time.process_time() - began)
        bad = sum(len(d.bad) for d in decoded)
        labels = np.concatenate([d.columns.labels for d in decoded])
        if reference is None:
            reference = labels
        if bad or not np.array_equal(labels, reference):
            raise SystemExit(f"{name}: {bad} bad records, or labels unlike Example JSON's")
        report[name] = {"records_per_s": round(len(records) / best),
                        "us_per_record": round(best / len(records) * 1e6, 2)}

    print(json.dumps({
        "command": f"python -m bench.decoding --records {args.records} --chunk {args.chunk} --rounds {args.rounds}",
        "records": args.records, "chunk": args.chunk, "formats": report,
        "setup_s": round(setup_s, 1), "total_s": round(time.perf_counter() - started, 1),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
                    "python": platform.python_version()},
    }, indent=2))


if __name__ == "__main__":
    main()
