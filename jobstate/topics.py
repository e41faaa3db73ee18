"""The job's own topics, as each of its processes creates them if they are not there yet: whichever
comes first, a shard or a trainer, creates each with the same settings."""

from __future__ import annotations

from streamtrain.infra import Endpoints
from streamtrain.infra.clients import TopicSpec, ensure_topics
from streamtrain.schemas import Topics
from streamtrain.schemas.config import JobConfig

# Gradient topics must keep everything since the oldest kept checkpoint; a week leaves room
# for a shard that cannot checkpoint for days (its storage down) without losing updates.
GRAD_RETENTION_MS = 7 * 24 * 3600 * 1000


def grad_spec(job: str, shard: int) -> TopicSpec:
    """One partition: the total order a shard applies and replays in."""
    return TopicSpec(Topics(job).grad(shard), 1, {"retention.ms": str(GRAD_RETENTION_MS)})


def dlq_spec(job: str) -> TopicSpec:
    """Keyed by the bad record's position, so compaction keeps one entry per record even when
    a replay dead-letters it again."""
    return TopicSpec(Topics(job).dlq, 1, {"cleanup.policy": "compact"})


def metrics_spec(job: str) -> TopicSpec:
    return TopicSpec(Topics(job).metrics)


def ensure_job_topics(endpoints: Endpoints, config: JobConfig, specs: list[TopicSpec]) -> None:
    """`specs` created if missing, replicated as the job file's `[kafka]` says."""
    ensure_topics(endpoints, specs, replication_factor=config.kafka.replication_factor,
                  min_insync_replicas=config.kafka.min_insync_replicas)
