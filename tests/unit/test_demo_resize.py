"""`streamtrain demo --resize T:N` (streamtrain/console/demo.py `parse_resize`)."""

from __future__ import annotations

import pytest

from streamtrain.console.demo import parse_resize


def test_a_resize_is_seconds_then_shards() -> None:
    assert parse_resize("60:3") == (60.0, 3)
    assert parse_resize("0.5:1") == (0.5, 1)


@pytest.mark.parametrize("text", ["60", "60:", ":3", "x:3", "60:x", "60:0", "-1:2", "60:2.5"])
def test_anything_else_names_the_form_it_expects(text: str) -> None:
    with pytest.raises(ValueError, match=f"{text!r}: expected SECONDS:SHARDS"):
        parse_resize(text)
