"""How the job's topics are replicated when a process creates them (`infra.clients.replication`)."""

from __future__ import annotations

import pytest

from streamtrain.infra.clients import replication
from streamtrain.infra.errors import InfraError
from streamtrain.jobstate.config import JobConfig, JobConfigError


@pytest.mark.parametrize("brokers, factor, min_insync, want", [
    (1, 0, 0, (1, 1)),  # one local broker: nothing else can work
    (2, 0, 0, (2, 2)),
    (3, 0, 0, (3, 2)),
    (5, 0, 0, (3, 2)),
    (5, 5, 0, (5, 2)),
    (5, 0, 3, (3, 3)),
])
def test_defaults_follow_the_cluster_and_settings_win(brokers, factor, min_insync, want) -> None:
    assert replication(brokers, factor, min_insync) == want


@pytest.mark.parametrize("brokers, factor, min_insync, words", [
    (1, 3, 0, "needs that many brokers"),
    (1, 0, 2, "above the replication factor"),
])
def test_a_replication_the_cluster_cannot_give_is_refused(brokers, factor, min_insync, words) -> None:
    with pytest.raises(InfraError, match=words):
        replication(brokers, factor, min_insync)


def test_the_job_file_names_the_replication_and_refuses_one_that_acknowledges_nothing() -> None:
    base = '[job]\nname = "j"\n[input]\ntopics = ["t"]\n'
    assert JobConfig.from_toml(base).kafka.replication_factor == 0
    config = JobConfig.from_toml(base + "[kafka]\nreplication_factor = 3\nmin_insync_replicas = 2\n")
    assert (config.kafka.replication_factor, config.kafka.min_insync_replicas) == (3, 2)
    assert JobConfig.from_json(config.to_json()) == config
    with pytest.raises(JobConfigError, match="kafka.min_insync_replicas"):
        JobConfig.from_toml(base + "[kafka]\nreplication_factor = 2\nmin_insync_replicas = 3\n")
    with pytest.raises(JobConfigError, match="kafka.replication_factor"):
        JobConfig.from_toml(base + "[kafka]\nreplication_factor = -1\n")
