"""The names a local job's supervisor gives its children, and what the live view reads back."""

from __future__ import annotations

from streamtrain.local import pserver_child, shard_of_child


def test_a_pserver_childs_name_gives_back_its_shard_and_no_other_child_has_one() -> None:
    assert [shard_of_child(pserver_child(i)) for i in (0, 1, 12)] == [0, 1, 12]
    assert pserver_child(3) == "pserver-3"  # also its log's name, which docs/cli.md lists
    for other in ("master", "trainer-0", "producer", "pserver-", "pserver-x", "pserver-\u0662", "shard-1"):
        assert shard_of_child(other) is None, other
