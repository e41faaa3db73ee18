"""The control plane's documents (schemas/control.py): round trips, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import (
    CheckpointRequest,
    LatestCheckpoint,
    PauseRequest,
    ResizeRecord,
    RollbackAck,
    RollbackRequest,
    SchemaError,
    ShardCheckpoint,
)

DOCUMENTS = [
    PauseRequest("rollback", 1.5),
    CheckpointRequest(ask="n1", at=2.0),
    CheckpointRequest("00000000000000000042", "n1", 2.5),
    CheckpointRequest("00000000000000000042"),
    ShardCheckpoint(1, "file:///tmp/ckpt", 4096, 3.0, "adam", {"emb": 10, "wide": 0}),
    LatestCheckpoint("00000000000000000042", 2, 4.0),
    LatestCheckpoint("00000000000000000042", 2, 4.0, ask="n1"),
    RollbackRequest("00000000000000000042", "master", 5.0),
    RollbackAck(0, 77, 6.0),
    ResizeRecord(3, "00000000000000000043", 7.0),
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: type(d).__name__)
def test_every_control_document_round_trips_and_is_versioned(doc) -> None:
    data = doc.to_json()
    assert type(doc).from_json(data) == doc
    assert json.loads(data)["v"] == 1


def test_a_rollback_goes_from_the_masters_phase_to_the_shards() -> None:
    request = RollbackRequest("c-1", "master", 5.0)
    assert request.next_phase() == RollbackRequest("c-1", "shards", 5.0)


@pytest.mark.parametrize("cls, doc, field", [
    (CheckpointRequest, {"v": 1}, "id"),
    (CheckpointRequest, {"v": 1, "id": "../x"}, "id"),
    (CheckpointRequest, {"v": 1, "id": 7}, "id"),
    (CheckpointRequest, {"id": "c-1"}, "v"),
    (LatestCheckpoint, {"v": 1, "id": "c-1", "at": 1.0}, "shards"),
    (LatestCheckpoint, {"v": 1, "id": "latest", "shards": 2, "at": 1.0}, "id"),
    (RollbackRequest, {"v": 1, "to": "c-1", "phase": "trainers", "at": 1.0}, "phase"),
    (RollbackAck, {"v": 1, "shard": -1, "grad_offset": 0, "at": 1.0}, "shard"),
    (ShardCheckpoint, {"v": 1, "shard": 0, "uri": "u", "grad_offset": 0, "created_at": 1.0, "optimizer": "adam",
                       "rows": []}, "rows"),
    (PauseRequest, {"v": 1, "by": "x", "at": float("nan")}, "at"),
    (ResizeRecord, {"v": 1, "shards": 0, "checkpoint": "c-1", "at": 1.0}, "shards"),
    (ResizeRecord, {"v": 1, "shards": 3, "at": 1.0}, "checkpoint"),
])
def test_a_malformed_document_names_its_format_and_field(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format.startswith(cls.__name__) and caught.value.field == field, caught.value
