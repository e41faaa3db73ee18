"""The bare loop of `bench.e2e` trains on the features the job trains on."""

from __future__ import annotations

import numpy as np

from bench.e2e import HASH_BUCKETS, Workload, examples, hashed
from streamtrain.trainer.features import Featurizer


def test_the_bare_loop_hashes_ids_as_the_jobs_featurizer_does() -> None:
    work = Workload.make(500, 0)
    featurized = Featurizer(work.model.fields, work.model.dense_features, HASH_BUCKETS).batch(
        examples(work.model, work.train))
    assert np.array_equal(hashed(work.model, work.train, HASH_BUCKETS).numpy().reshape(-1),
                          featurized.ids.astype(np.int64))
