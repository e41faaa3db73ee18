"""The job's documents (schemas/job.py): round trips, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import BarrierSteps, Holder, JobState, SchemaError

DOCUMENTS = [
    JobState("finished", 12.5),
    JobState("running"),
    Holder("master", "node-1:77", 77, "node-1", "b-1", "pid:[4026531836]", 3.0),
    Holder("trainer", "t-0", 78, "node-1"),
    Holder("pserver", "1", 79, "node-1", "b-1", "", 4.0, "10.0.0.2:7000"),
    BarrierSteps(),
    BarrierSteps(4, {"t-0": 3, "t-1": -1}),
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: type(d).__name__)
def test_every_job_document_round_trips_and_is_versioned(doc) -> None:
    data = doc.to_json()
    assert type(doc).from_json(data) == doc
    assert json.loads(data)["v"] == 1


def test_only_a_finished_job_says_so() -> None:
    assert JobState("finished").finished and not JobState("running").finished


@pytest.mark.parametrize("cls, doc, field", [
    (JobState, {"v": 1, "state": "done"}, "state"),
    (JobState, {"state": "finished"}, "v"),
    (Holder, {"v": 1, "role": "master", "name": "m", "host": "h"}, "pid"),
    (Holder, {"v": 1, "role": "master", "name": "m", "pid": "7", "host": "h"}, "pid"),
    (Holder, {"v": 1, "role": "loader", "name": "m", "pid": 7, "host": "h"}, "role"),
    (Holder, {"v": 1, "role": "master", "name": "m", "pid": 7, "host": None}, "host"),
    (BarrierSteps, {"v": 1, "next": 0, "trainers": []}, "trainers"),
    (BarrierSteps, {"v": 1, "next": 0, "trainers": {"t-0": 1.5}}, "trainers.t-0"),
    (BarrierSteps, {"v": 1, "trainers": {}}, "next"),
])
def test_a_malformed_document_names_its_format_and_field(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format == cls.__name__ and caught.value.field == field, caught.value
