"""The job's documents (schemas/job.py): round trips, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import (
    AppliedSteps,
    BarrierStats,
    BarrierSteps,
    Holder,
    JobState,
    SchemaError,
    ShardStats,
    SlotOwners,
)

DOCUMENTS = [
    JobState("finished", 12.5),
    JobState("running"),
    Holder("master", "node-1:77", 77, "node-1", "b-1", "pid:[4026531836]", 3.0),
    Holder("trainer", "t-0", 78, "node-1"),
    Holder("pserver", "1", 79, "node-1", "b-1", "", 4.0, "10.0.0.2:7000"),
    BarrierSteps(),
    BarrierSteps(4, {"t-0": 3, "t-1": -1}),
    AppliedSteps(),
    AppliedSteps({"t-0": 12, "t-1": 0}),
    SlotOwners((0, 1, 0, 1)),
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
    (AppliedSteps, {"v": 1, "steps": {"t-0": -1}}, "steps.t-0"),
    (AppliedSteps, {"v": 1}, "steps"),
    (SlotOwners, {"v": 1, "owners": "x"}, "owners"),
    (SlotOwners, {"v": 1, "owners": [0, -1]}, "owners[1]"),
    (SlotOwners, {"v": 1, "owners": []}, "owners"),
])
def test_a_malformed_document_names_its_format_and_field(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format == cls.__name__ and caught.value.field == field, caught.value


def test_shard_stats_round_trip_with_and_without_a_barrier() -> None:
    plain = ShardStats(1, 77, True, 5.0, version=3, offset=900, examples=512, checkpoint="c-1",
                       examples_by_partition={"clicks:0": 300, "clicks:1": 212}, table_rows={"emb": 40})
    synced = ShardStats(0, 78, False, 6.0, barrier=BarrierStats(12, 2, ["t-0", "t-1"]))
    for stats in (plain, synced):
        assert ShardStats.from_json(stats.to_json()) == stats


def test_shard_stats_name_a_bad_count_and_ignore_keys_they_do_not_know() -> None:
    doc = json.loads(ShardStats(1, 77, True, 5.0).to_json())
    assert ShardStats.from_json(json.dumps({**doc, "later": 1})) == ShardStats(1, 77, True, 5.0)
    for key, value, field in (("examples", -1, "examples"), ("serving", 1, "serving"),
                              ("examples_by_partition", {"clicks:0": "3"}, "examples_by_partition.clicks:0"),
                              ("barrier", {"next_step": 1, "waiting": 0}, "barrier.participants")):
        with pytest.raises(SchemaError) as caught:
            ShardStats.from_json(json.dumps({**doc, key: value}))
        assert caught.value.field == field, caught.value

