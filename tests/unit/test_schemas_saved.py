"""What a checkpoint holds besides its arrays (schemas/saved.py): round trips, versions, and
errors that name the field."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import (ExampleCounts, JobRecord, LedgerEntry, LedgerSnapshot, SavedBlock, SavedTable,
                                 SchemaError, StateIndex)

DOCUMENTS = [
    StateIndex(),
    StateIndex((SavedTable("deep+wide", 9, "table0", 1200), SavedTable("old", 4, "table1")),
               (SavedBlock("mlp.0.weight", 0, "dense0"), SavedBlock("mlp.0.weight", 1, "dense1"))),
    ExampleCounts(),
    ExampleCounts({"clicks:0:0:1000:0": 512}, {"clicks:0": 90_000}),
    LedgerSnapshot(),
    LedgerSnapshot(3, (LedgerEntry("clicks", 0, 1, 4000, ((4000, 2), (5000, 0))), LedgerEntry("clicks", 1, 0, 0))),
    JobRecord(),
    JobRecord(({"topic": "clicks", "partition": 0}, ), ({"task_id": "a"},), ({"task_id": "b"},), (),
              {"state": "running"}),
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: type(d).__name__)
def test_every_saved_document_round_trips_and_is_versioned(doc) -> None:
    data = doc.to_json()
    assert type(doc).from_json(data) == doc
    assert json.loads(data)["v"] == 1


def test_example_counts_written_before_the_version_still_read() -> None:
    legacy = json.dumps({"tasks": {"t": 5}, "partitions": {"clicks:0": 7}})
    assert ExampleCounts.from_json(legacy) == ExampleCounts({"t": 5}, {"clicks:0": 7})


def test_a_table_without_its_clock_reads_as_none() -> None:
    doc = {"v": 1, "tables": {"emb": {"dim": 8, "file": "table0"}}, "dense": []}
    assert StateIndex.from_json(json.dumps(doc)).tables == (SavedTable("emb", 8, "table0"),)


@pytest.mark.parametrize("cls, doc, field", [
    (StateIndex, {"v": 1, "tables": {"emb": {"file": "table0"}}, "dense": []}, "tables.emb.dim"),
    (StateIndex, {"v": 1, "tables": {}, "dense": [{"param": "w", "block": -1, "file": "d"}]}, "dense[0].block"),
    (StateIndex, {"v": 2, "tables": {}, "dense": []}, "v"),
    (ExampleCounts, {"v": 1, "tasks": {"t": "5"}, "partitions": {}}, "tasks.t"),
    (LedgerSnapshot, {"v": 1, "dropped": 0, "partitions": [{"topic": "c", "partition": 0, "pass_no": 0,
                                                           "watermark": 0, "max_seq": [[1]]}]}, "partitions[0].max_seq[0]"),
    (LedgerSnapshot, {"v": 1, "partitions": []}, "dropped"),
    (JobRecord, {"v": 1, "cursors": [], "todo": ["x"], "done": [], "failed": []}, "todo[0]"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [], "done": []}, "failed"),
])
def test_a_malformed_document_names_its_format_and_field(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format == cls.__name__ and caught.value.field == field, caught.value
