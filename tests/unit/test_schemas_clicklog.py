"""The raw click log and the joiner's changelog value (schemas/clicklog.py): round trips, the
documented wire form, versions, and errors that name the key."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import ClickRecord, Example, ImpressionRecord, JoinWaiting, SchemaError

IMPRESSION = ImpressionRecord("imp-7-42", 1_700_000_000_042, {"user": (17,), "ad": (3,)}, (0.5, -1.25))

DOCUMENTS = [
    IMPRESSION,
    ImpressionRecord("é", 0, {}, ()),
    ClickRecord("imp-7-42", 1_700_000_003_517),
    JoinWaiting(3, IMPRESSION),
    JoinWaiting(0, None, 1_700_000_003_517),
    JoinWaiting(2**31 - 1, IMPRESSION, 5),
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: type(d).__name__)
def test_every_click_log_document_round_trips_and_is_versioned(doc) -> None:
    data = doc.to_json()
    assert type(doc).from_json(data) == doc
    assert type(doc).from_json(data.decode()) == doc
    assert json.loads(data)["v"] == 1


def test_the_wire_forms_are_the_documented_ones() -> None:
    assert json.loads(IMPRESSION.to_json()) == {"v": 1, "id": "imp-7-42", "ts": 1_700_000_000_042,
                                                "sparse": {"ad": [3], "user": [17]}, "dense": [0.5, -1.25]}
    assert json.loads(ClickRecord("imp-7-42", 9).to_json()) == {"v": 1, "id": "imp-7-42", "ts": 9}
    assert json.loads(JoinWaiting(0, None, 9).to_json()) == {"v": 1, "p": 0, "imp": None, "click_ts": 9}
    assert json.loads(JoinWaiting(3, IMPRESSION).to_json())["imp"] == json.loads(IMPRESSION.to_json())


def test_records_written_before_the_types_moved_to_schemas_still_read() -> None:
    # What producers/clicklog.py and producers/joinstate.py wrote: ASCII-escaped, spaced JSON.
    old_imp = json.dumps({"v": 1, "id": "imp-1", "ts": 5, "sparse": {"user": [17], "ad": [3]}, "dense": [0.5]})
    assert ImpressionRecord.from_json(old_imp.encode()) == ImpressionRecord("imp-1", 5, {"ad": (3,), "user": (17,)},
                                                                            (0.5,))
    old_waiting = json.dumps({"v": 1, "p": 1, "imp": json.loads(old_imp), "click_ts": None})
    assert JoinWaiting.from_json(old_waiting.encode()).impression.impression_id == "imp-1"


def test_features_are_normalised_as_an_examples_are_and_label_into_one() -> None:
    imp = ImpressionRecord("a", 7, {"b": [2], "a": [1]}, [0.1])
    assert list(imp.sparse) == ["a", "b"] and imp.sparse["b"] == (2,)
    assert imp.to_example(1.0) == Example({"a": (1,), "b": (2,)}, (0.1,), 1.0, 7)


@pytest.mark.parametrize("cls, doc, field", [
    (ImpressionRecord, {"id": "a", "ts": 0, "sparse": {}, "dense": []}, "v"),
    (ImpressionRecord, {"v": 2, "id": "a", "ts": 0, "sparse": {}, "dense": []}, "v"),
    (ImpressionRecord, {"v": 1, "id": "", "ts": 0, "sparse": {}, "dense": []}, "id"),
    (ImpressionRecord, {"v": 1, "id": "a", "ts": -1, "sparse": {}, "dense": []}, "ts"),
    (ImpressionRecord, {"v": 1, "id": "a", "ts": 0, "dense": []}, "sparse"),
    (ImpressionRecord, {"v": 1, "id": "a", "ts": 0, "sparse": {"user": [1, -2]}, "dense": []}, "sparse.user[1]"),
    (ImpressionRecord, {"v": 1, "id": "a", "ts": 0, "sparse": {}, "dense": [0.5, float("nan")]}, "dense[1]"),
    (ClickRecord, {"v": 2, "id": "a", "ts": 0}, "v"),
    (ClickRecord, {"v": 1, "id": 7, "ts": 0}, "id"),
    (ClickRecord, {"v": 1, "id": "a", "ts": "0"}, "ts"),
    (ClickRecord, {"v": 1, "id": "a"}, "ts"),
    (JoinWaiting, {"v": 2, "p": 0, "imp": None, "click_ts": 1}, "v"),
    (JoinWaiting, {"p": 0, "imp": None, "click_ts": 1}, "v"),
    (JoinWaiting, {"v": 1, "imp": None, "click_ts": 1}, "p"),
    (JoinWaiting, {"v": 1, "p": 2**31, "imp": None, "click_ts": 1}, "p"),
    (JoinWaiting, {"v": 1, "p": 0, "imp": None, "click_ts": None}, "imp"),
    (JoinWaiting, {"v": 1, "p": 0, "imp": None, "click_ts": 1.5}, "click_ts"),
    (JoinWaiting, {"v": 1, "p": 0, "imp": [], "click_ts": None}, "imp"),
    (JoinWaiting, {"v": 1, "p": 0, "imp": {"v": 2, "id": "a", "ts": 0, "sparse": {}, "dense": []}}, "imp.v"),
    (JoinWaiting, {"v": 1, "p": 0, "imp": {"v": 1, "id": "a", "ts": 0, "sparse": {}, "dense": [1e39]}}, "imp.dense[0]"),
])
def test_a_malformed_record_names_its_format_and_key(cls, doc, field) -> None:
    with pytest.raises(SchemaError) as caught:
        cls.from_json(json.dumps(doc))
    assert caught.value.format == cls.__name__ and caught.value.field == field, caught.value
    assert f"'{field}'" in str(caught.value)


@pytest.mark.parametrize("data", [b"not json", b"[1]", b"\xff", None])
def test_what_is_not_a_json_object_is_refused_as_a_whole(data) -> None:
    for cls in (ImpressionRecord, ClickRecord, JoinWaiting):
        with pytest.raises(SchemaError) as caught:
            cls.from_json(data)
        assert caught.value.field == "$"


def test_constructors_refuse_what_decoders_refuse() -> None:
    with pytest.raises(SchemaError, match="'ts'"):
        ClickRecord("a", -1)
    with pytest.raises(SchemaError, match="'dense\\[0\\]'"):
        ImpressionRecord("a", 0, {}, (float("inf"),))
    with pytest.raises(SchemaError, match="'imp'"):
        JoinWaiting(0)
