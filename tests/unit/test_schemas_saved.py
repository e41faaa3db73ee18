"""What a checkpoint holds besides its arrays (schemas/saved.py): round trips, versions, and
errors that name the field."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import (
    ExampleCounts,
    JobRecord,
    KeptDocument,
    LedgerEntry,
    LedgerSnapshot,
    SavedBlock,
    SavedTable,
    SchemaError,
    StateIndex,
)

DOCUMENTS = [
    StateIndex(),
    StateIndex((SavedTable("deep+wide", 9, "table0", 1200), SavedTable("old", 4, "table1")),
               (SavedBlock("mlp.0.weight", 0, "dense0"), SavedBlock("mlp.0.weight", 1, "dense1"))),
    ExampleCounts(),
    ExampleCounts({"clicks:0:0:1000:0": 512}, {"clicks:0": 90_000}),
    LedgerSnapshot(),
    LedgerSnapshot(3, (LedgerEntry("clicks", 0, 1, 4000, ((4000, 2), (5000, 0))), LedgerEntry("clicks", 1, 0, 0))),
    JobRecord(),
    JobRecord((KeptDocument({"topic": "clicks", "partition": 0}),), (KeptDocument({"task_id": "a", "later": [1]}),),
              (KeptDocument({"task_id": "b"}),), (), KeptDocument({"state": "running"})),
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
                                                           "watermark": 0, "max_seq": [[1]]}]},
     "partitions[0].max_seq[0]"),
    (LedgerSnapshot, {"v": 1, "partitions": []}, "dropped"),
    (JobRecord, {"v": 1, "cursors": [], "todo": ["x"], "done": [], "failed": []}, "todo[0]"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [], "done": []}, "failed"),
    (JobRecord, {"v": 1, "cursors": [{"partition": 0}], "todo": [], "done": [], "failed": []}, "cursors[0].topic"),
    (JobRecord, {"v": 1, "cursors": [{"topic": "c", "partition": -1}], "todo": [], "done": [], "failed": []},
     "cursors[0].partition"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [], "done": [{"task_id": "a"}, {"v": 1}], "failed": []},
     "done[1].task_id"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [], "done": [], "failed": [{"task_id": "a/b"}]}, "failed[0].task_id"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [{"task_id": "a", "x": float("nan")}], "done": [], "failed": []},
     "todo[0]"),
    (JobRecord, {"v": 1, "cursors": [], "todo": [], "done": [], "failed": [], "state": 3}, "state"),
])
def test_a_malformed_document_names_its_format_and_field(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format == cls.__name__ and caught.value.field == field, caught.value


def test_a_job_record_keeps_each_document_whole_and_writes_it_back_compactly() -> None:
    kept = KeptDocument.from_json(b'{"v": 9, "task_id": "a", "future": {"x": [1, 2]}}')
    assert kept.doc == {"v": 9, "task_id": "a", "future": {"x": [1, 2]}}
    assert kept.to_json() == b'{"v":9,"task_id":"a","future":{"x":[1,2]}}'
    record = JobRecord.from_json(JobRecord(todo=(kept,)).to_json())
    assert record.todo == (kept,) and record.todo[0].to_json() == kept.to_json()


@pytest.mark.parametrize("data", [b"[]", b"not json", b'{"x": NaN}'])
def test_a_kept_document_is_a_json_object_that_encodes(data) -> None:
    with pytest.raises(SchemaError) as caught:
        KeptDocument.from_json(data)
    assert (caught.value.format, caught.value.field) == ("KeptDocument", "$")


def test_a_job_record_holds_kept_documents_only() -> None:
    with pytest.raises(SchemaError) as caught:
        JobRecord(todo=({"task_id": "a"},))
    assert caught.value.field == "todo[0]"
