import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import SchemaError, TaskId, TaskRecord

FAST = settings(max_examples=80, deadline=None)

topics = st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True).filter(lambda t: t not in (".", ".."))
partitions = st.integers(0, 2**31 - 1)
offsets = st.integers(0, 2**62)


@st.composite
def records(draw):
    topic, partition, start = draw(topics), draw(partitions), draw(offsets)
    pass_no = draw(st.integers(0, 5))
    return TaskRecord(
        task_id=TaskRecord.make_id(topic, partition, start, pass_no),
        topic=topic,
        partition=partition,
        start=start,
        end=start + draw(st.integers(1, 2**62 - 1)),  # start + length stays within int64
        pass_no=pass_no,
        attempt=draw(st.integers(0, 10)),
        trainer_id=draw(st.none() | st.text(min_size=1, max_size=20)),
        deadline=draw(st.none() | st.floats(0, 4e9)),
        reason=draw(st.none() | st.text(min_size=1, max_size=40)),
        claim=draw(st.integers(0, 2**40)),
        push_every=draw(st.integers(0, 64)),
    )


def small(**change) -> TaskRecord:
    return dataclasses.replace(TaskRecord.for_range("clicks", 3, 100, 200), **change)


def raises_naming(field, fn, *args):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    err = info.value
    assert (err.format, err.field) == ("TaskRecord", field)
    assert f"'{field}'" in str(err)
    return err


@FAST
@given(records())
def test_task_record_round_trips_through_json(record):
    assert TaskRecord.from_json(record.to_json()) == record


def test_json_form_has_the_documented_keys():
    doc = json.loads(small(attempt=1, trainer_id="t-1", deadline=1.5, claim=4, push_every=2).to_json())
    assert doc == {
        "v": 1, "task_id": "clicks:3:00000000000000000100", "topic": "clicks", "partition": 3,
        "start": 100, "end": 200, "pass_no": 0, "attempt": 1, "trainer_id": "t-1",
        "deadline": 1.5, "reason": None, "claim": 4, "push_every": 2,
    }  # fmt: skip


def test_a_record_written_before_push_every_reads_as_not_fixed():
    doc = json.loads(small(claim=4).to_json())
    del doc["push_every"]
    assert TaskRecord.from_json(json.dumps(doc)).push_every == 0


def test_task_id_is_topic_partition_and_zero_padded_start():
    assert TaskRecord.make_id("clicks", 3, 100) == "clicks:3:00000000000000000100"


def test_later_passes_get_their_own_task_id():
    assert TaskRecord.make_id("clicks", 3, 100, pass_no=2) == "clicks:3:00000000000000000100:2"
    assert TaskRecord.for_range("clicks", 3, 100, 200, pass_no=2).task_id.endswith(":2")


@FAST
@given(topics, partitions, offsets, st.integers(0, 3))
def test_parse_id_inverts_make_id(topic, partition, start, pass_no):
    task_id = TaskRecord.make_id(topic, partition, start, pass_no)
    assert TaskRecord.parse_id(task_id) == TaskId(topic, partition, start, pass_no)


@FAST
@given(topics, partitions, st.lists(offsets, min_size=2, max_size=10))
def test_task_ids_of_one_partition_sort_by_start_offset(topic, partition, starts):
    by_id = sorted(starts, key=lambda s: TaskRecord.make_id(topic, partition, s))
    assert by_id == sorted(starts)


@pytest.mark.parametrize(
    "task_id",
    [
        "clicks:3:100",
        "clicks:03:00000000000000000100",
        "clicks:-3:00000000000000000100",
        "clicks:3:00000000000000000100:0",
        "clicks:3:00000000000000000100:01",
        "clicks:3:00000000000000000100:1:1",
        "cl icks:3:00000000000000000100",
        ":3:00000000000000000100",
        "clicks:3:0000000000000000010x",
        "clicks:3:" + "1" * 5000,
        "clicks",
        "",
        None,
    ],
)
def test_malformed_task_ids_raise_schema_error(task_id):
    raises_naming("task_id", TaskRecord.parse_id, task_id)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"end": 100}, "end"),
        ({"end": 50}, "end"),
        ({"attempt": -1}, "attempt"),
        ({"claim": -1}, "claim"),
        ({"claim": 1.0}, "claim"),
        ({"push_every": -1}, "push_every"),
        ({"pass_no": -1}, "pass_no"),
        ({"pass_no": 1}, "task_id"),
        ({"task_id": "clicks:3:00000000000000000101"}, "task_id"),
        ({"trainer_id": ""}, "trainer_id"),
        ({"trainer_id": 5}, "trainer_id"),
        ({"deadline": float("nan")}, "deadline"),
        ({"deadline": "soon"}, "deadline"),
        ({"reason": b"oops"}, "reason"),
        ({"partition": True}, "partition"),
    ],
)
def test_invalid_task_records_raise_schema_error(change, field):
    raises_naming(field, lambda: small(**change))


@pytest.mark.parametrize(
    "args, field",
    [
        (("clicks", 3, -1, 10), "start"),
        (("clicks", -1, 0, 10), "partition"),
        (("clicks", 2**31, 0, 10), "partition"),
        (("cli:cks", 3, 0, 10), "topic"),
        (("", 3, 0, 10), "topic"),
        (("clicks", 3, 10, 10), "end"),
        (("clicks", 3, "0", 10), "start"),
    ],
)
def test_invalid_ranges_raise_schema_error(args, field):
    raises_naming(field, TaskRecord.for_range, *args)


def test_replace_revalidates_and_keeps_the_record_frozen():
    claimed = small(attempt=1, trainer_id="t-1", deadline=10, claim=7)
    assert claimed.deadline == 10.0 and isinstance(claimed.deadline, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        claimed.claim = 8
    raises_naming("task_id", lambda: dataclasses.replace(claimed, start=150))


def test_json_keys_after_end_are_optional():
    text = '{"v":1,"task_id":"clicks:3:00000000000000000100","topic":"clicks","partition":3,"start":100,"end":200}'
    assert TaskRecord.from_json(text) == small()


@pytest.mark.parametrize("key", ["v", "task_id", "topic", "partition", "start", "end"])
def test_missing_required_json_key_raises_schema_error(key):
    doc = json.loads(small().to_json())
    del doc[key]
    err = raises_naming(key, TaskRecord.from_json, json.dumps(doc))
    assert "missing" in err.reason


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("v", 2, "v"),
        ("start", -1, "start"),
        ("start", 100.0, "start"),
        ("end", 100, "end"),
        ("partition", "3", "partition"),
        ("deadline", "NaN", "deadline"),
        ("claim", None, "claim"),
        ("attempt", [], "attempt"),
        ("push_every", "auto", "push_every"),
    ],
)
def test_wrong_json_values_raise_schema_error(key, value, field):
    doc = json.loads(small().to_json())
    doc[key] = value
    raises_naming(field, TaskRecord.from_json, json.dumps(doc))


def test_json_nan_deadline_raises_schema_error():
    text = small().to_json().decode().replace('"deadline":null', '"deadline":NaN')
    raises_naming("deadline", TaskRecord.from_json, text)


@pytest.mark.parametrize("text", [b"", b"null", b"[]", b"{", b"\xff\xfe", b"[" * 100000])
def test_unparseable_json_raises_schema_error(text):
    raises_naming("$", TaskRecord.from_json, text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.binary(max_size=60))
def test_arbitrary_input_decodes_or_raises_only_schema_error(data):
    try:
        TaskRecord.from_json(data)
    except SchemaError:
        pass
