"""A job pointed at topics not written for streamtrain (issue 15): the same click log as a
service's nested JSON and as a CSV export with columns the model must not see trains as well as
the same records in Example JSON, and `streamtrain job check` reads each as the trainers do."""

from __future__ import annotations

import dataclasses
import json

import uuid

import pytest

from conftest import write_job_file
from streamtrain.infra.clients import TopicSpec, ensure_topics, redis_client
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


FORMATS = {
    "example": ([e.to_json() for e in TRAIN], {}),
    "nested": ([nested(e) for e in TRAIN], {"json_fields": {
        "sparse": {f: f"event.ids.{f}" for f in FIELDS},
        "dense": [f"features.d{j}" for j in range(MODEL.dense_features)],
        "label": "clicked", "time": "ts"}}),
    "csv": ([csv_line(i, e) for i, e in enumerate(TRAIN)], {"format": "csv", "csv_columns": [
        "request:ignore", "y:label", *(f"{f}:sparse" for f in FIELDS),
        *(f"d{j}:dense" for j in range(MODEL.dense_features)), "ts:time", "revenue:ignore"]}),
}


@pytest.fixture(scope="module")
def aucs(services, tmp_path_factory) -> dict[str, float]:
    """Holdout AUC after one sync pass over each form of the same records, and one process's."""
    out, redis_conn = {}, redis_client(services)
    for name, (values, input_section) in FORMATS.items():
        topic = f"own-{name}-{uuid.uuid4().hex[:10]}"
        ensure_topics(services, [TopicSpec(topic, 2)])
        counts = write_examples(services, topic, values, 2)
        config = make_job(f"{topic}-job", topic, tmp_path_factory.mktemp(name), sgd="sync")
        config = dataclasses.replace(config, input=dataclasses.replace(config.input, **input_section))
        out[name], out["single"] = distributed_and_single_auc(services, redis_conn, config, TRAIN, topic, counts, 1)
        check = streamtrain(services, "job", "check", "--job", str(write_job_file(
            tmp_path_factory.mktemp(name) / "job.toml", config)), "--sample", "500", "--json")
        assert check.returncode == 0, check.stderr.decode()
        report = json.loads(check.stdout)
        assert (report["records"], report["good"]) == (500, 500), report["bad"][:3]
        assert {f["name"] for f in report["fields"] if f["used"]} == set(FIELDS)
    redis_conn.close()
    print(f"holdout AUC: {out}")
    return out


@pytest.mark.parametrize("name", ["nested", "csv"])
def test_a_log_of_its_own_form_trains_as_well_as_example_json(aucs, name) -> None:
    assert aucs["example"] > 0.72
    assert abs(aucs[name] - aucs["example"]) < 0.005, aucs
