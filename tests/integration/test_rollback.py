"""A quiescent checkpoint, more training, then `rollback`: the parameters are the checkpoint's
again, and what came after it is trained once more, exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import wait_for
from master.etcd import Etcd
from pserver.sharding import SlotMap
from schemas import EtcdKeys
from streamtrain.checkpoints import request_checkpoint, rollback
from test_trainer import HOLDOUT, MODEL, Background, applied_exactly, make_job, run_job, write_examples
from trainer.scoring import Scorer

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_rollback_restores_parameters_and_replays_what_came_after(services, redis_conn, topic_factory,
                                                                 unique, tmp_path) -> None:
    topic = topic_factory("rollback", partitions=2)
    config = make_job(unique("rollback"), topic, tmp_path, passes=0, max_records=1000)
    first = write_examples(services, topic, [e.to_json() for e in MODEL.examples(6_000)], 2)
    coord, background = Etcd.connect(services), Background()
    try:
        run_job(services, coord, config, background, trainers=1)
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 120, "the first 6,000")
        checkpoint = request_checkpoint(coord, config.name)
        assert coord.get(EtcdKeys(config.name).checkpoint_job(checkpoint.id)) is not None
        scorer = Scorer(config, redis_conn, SlotMap.from_json(coord.get(EtcdKeys(config.name).slots).value))
        probe = HOLDOUT[:2_000]
        at_checkpoint = scorer.score(probe)

        more = write_examples(services, topic, [e.to_json() for e in MODEL.examples(4_000, start=6_000)], 2)
        both = {p: first[p] + more[p] for p in first}
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120, "all 10,000")
        assert not np.allclose(scorer.score(probe), at_checkpoint, atol=1e-4)

        rollback(coord, config.name, checkpoint.id, resume=False)
        wait_for(lambda: np.allclose(scorer.score(probe), at_checkpoint, atol=1e-6, rtol=0), 10,
                 "the checkpoint's parameters served again")
        wait_for(lambda: applied_exactly(redis_conn, config.name, first, topic), 10,
                 "the shards' counts back at the checkpoint")

        coord.delete_prefix(EtcdKeys(config.name).control("pause"))  # trainers go on
        wait_for(lambda: applied_exactly(redis_conn, config.name, both, topic), 120,
                 "the 4,000 after the checkpoint trained again, once")
    finally:
        background.close()
        coord.close()
