import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.schemas import SchemaError
from streamtrain.schemas.cursor import PartitionCursor


@st.composite
def cursors(draw):
    origin = draw(st.integers(0, 2**40))
    trained = origin + draw(st.integers(0, 2**20))
    nxt = trained + draw(st.integers(0, 2**20))
    stop = draw(st.none() | st.integers(nxt, nxt + 2**20))
    topic = draw(st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", fullmatch=True))
    return PartitionCursor(topic, draw(st.integers(0, 2**31 - 1)), nxt, trained, origin, stop, draw(st.integers(0, 9)))


@settings(max_examples=60, deadline=None)
@given(cursors())
def test_cursor_round_trips_through_json(cursor):
    assert PartitionCursor.from_json(cursor.to_json()) == cursor


@pytest.mark.parametrize(
    "key, value, field",
    [("trained", 5, "trained"), ("next", 50, "next"), ("next", 300, "next"), ("topic", "a/b", "topic"), ("v", 2, "v")],
)
def test_inconsistent_cursor_raises_schema_error(key, value, field):
    doc = json.loads(PartitionCursor("clicks", 0, 200, 100, 10, 250).to_json())
    doc[key] = value
    with pytest.raises(SchemaError) as info:
        PartitionCursor.from_json(json.dumps(doc))
    assert (info.value.format, info.value.field) == ("PartitionCursor", field)
