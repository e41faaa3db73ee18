"""What a trainer estimates of its own pushes between pulls (`trainer.groups`)."""

from __future__ import annotations

import pytest

from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.groups import estimates_dense, rows_in_flight


def config(**train) -> JobConfig:
    lines = ['[job]\nname = "j"\n[input]\ntopics = ["t"]\n[train]'] + [f"{k} = {v!r}" for k, v in train.items()]
    return JobConfig.from_toml("\n".join(lines).replace("'", '"'))


@pytest.mark.parametrize("train, dense, rows", [
    ({}, True, False),  # the defaults: a group's second step trains before the shards have its first
    ({"push_every": 1}, False, False),  # nothing in flight: every step pulls after its pushes are published
    ({"sgd": "sync", "push_every": 1}, False, False),
    ({"sgd": "sync"}, True, False),
    ({"max_in_flight": 2}, True, True),
    ({"push_every": 3}, True, False),  # within a group, steps train before the shards apply
    ({"pull_every": 2}, True, False),  # dense blocks a step behind
    ({"sgd": "bounded", "staleness": 2}, True, False),
])
def test_only_what_a_later_step_may_miss_is_estimated(train, dense, rows) -> None:
    job = config(**train)
    assert (estimates_dense(job), rows_in_flight(job)) == (dense, rows)
