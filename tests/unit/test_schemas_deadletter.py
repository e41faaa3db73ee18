import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import DeadLetter, SchemaError

letters = st.builds(
    DeadLetter,
    source_topic=st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,30}", fullmatch=True),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
    reason=st.text(min_size=1, max_size=80),
    payload=st.binary(max_size=200),
    job=st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", fullmatch=True),
    at_ms=st.integers(0, 2**63 - 1),
)


def small_doc() -> dict:
    return {"v": 1, "job": "ctr", "source_topic": "clicks", "partition": 2, "offset": 77,
            "reason": "Example v1: field 'dense[0]': NaN not allowed", "at_ms": 1700000000000,
            "payload": "eyJ2IjoxfQ=="}  # fmt: skip


def raises_naming(field, fn, *args):
    with pytest.raises(SchemaError) as info:
        fn(*args)
    assert (info.value.format, info.value.field) == ("DeadLetter", field)
    assert f"'{field}'" in str(info.value)


@settings(max_examples=80, deadline=None)
@given(letters)
def test_dead_letter_round_trips_through_json(letter):
    assert DeadLetter.from_json(letter.to_json()) == letter


def test_json_form_has_the_documented_keys_and_base64_payload():
    letter = DeadLetter.from_json(json.dumps(small_doc()))
    assert letter.payload == b'{"v":1}'
    assert json.loads(letter.to_json()) == small_doc()


def test_payload_may_be_a_bytearray_and_is_kept_as_bytes():
    letter = DeadLetter("clicks", 0, 0, "bad", bytearray(b"\x00\xff"), "ctr", 0)
    assert letter.payload == b"\x00\xff" and type(letter.payload) is bytes


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("payload", "not base64!", "payload"),
        ("payload", "eyJ2IjoxfQ", "payload"),
        ("payload", "é", "payload"),
        ("payload", 5, "payload"),
        ("offset", -1, "offset"),
        ("partition", -1, "partition"),
        ("source_topic", "a/b", "source_topic"),
        ("job", "", "job"),
        ("reason", "", "reason"),
        ("at_ms", 1.5, "at_ms"),
        ("v", 3, "v"),
    ],
)
def test_invalid_dead_letters_raise_schema_error(key, value, field):
    doc = small_doc()
    doc[key] = value
    raises_naming(field, DeadLetter.from_json, json.dumps(doc))


@pytest.mark.parametrize("key", list(small_doc()))
def test_missing_json_key_raises_schema_error(key):
    doc = small_doc()
    del doc[key]
    raises_naming(key, DeadLetter.from_json, json.dumps(doc))


def test_payload_must_be_bytes_when_constructed():
    raises_naming("payload", DeadLetter, "clicks", 0, 0, "bad", "text", "ctr", 0)
