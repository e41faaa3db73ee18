"""What a trainer reaches on the broker: the job's topics, the loader of its input, and the
producers of its deltas and side outputs.

The trainer learns the job's config from etcd once it starts, so these parts are made then, by
a `Broker` the trainer is given or builds from its endpoints. A caller gives its own to put
something else in the broker's place: a test's producer that fails a commit, say
(tests/integration/test_trainer.py).
"""

from __future__ import annotations

from streamtrain.infra import Endpoints
from streamtrain.jobstate.topics import dlq_spec, ensure_job_topics, grad_spec, metrics_spec
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.delivery import Delivery
from streamtrain.trainer.loader import LoaderSpec, RecordLoader


class Broker:
    """The job's Kafka at `endpoints`."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints

    def ensure_topics(self, config: JobConfig, shards: int) -> None:
        """The topics a trainer writes: metrics, dead letters, one per shard (jobstate/topics.py)."""
        job = config.name
        ensure_job_topics(self.endpoints, config,
                          [metrics_spec(job), dlq_spec(job), *(grad_spec(job, shard) for shard in range(shards))])

    def loader(self, config: JobConfig, trainer_id: str, fields: tuple[str, ...], dense_features: int,
               chunk_records: int) -> RecordLoader:
        """The loader child that reads and decodes the trainer's task ranges, started."""
        return RecordLoader(LoaderSpec(self.endpoints, f"{config.name}.trainer.{trainer_id}", config.input, fields,
                                       dense_features, config.model.hash_buckets, chunk_records))

    def delivery(self, config: JobConfig, trainer_id: str) -> Delivery:
        """The trainer's producers; under exactly-once the side outputs' transactional id is
        the trainer's, so a successor with its id fences it (docs/trainer.md)."""
        transactional_id = f"{config.name}.trainer.{trainer_id}" if config.train.delivery == "exactly_once" else None
        return Delivery(self.endpoints, transactional_id)
