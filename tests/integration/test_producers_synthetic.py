import subprocess
import sys
from collections import Counter

import pytest

from streamtrain import schemas
from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig
from streamtrain.producers.sink import KafkaSink
from streamtrain.producers.synthetic import SyntheticSource, SyntheticSourceConfig
from streamtrain.schemas import ClickRecord, ImpressionRecord
from topic_reader import read_topic

pytestmark = pytest.mark.services


def test_a_click_log_has_every_impression_once_and_exactly_the_clicks_the_model_decided(services, topic_factory):
    imps, clks = topic_factory("imps", partitions=2), topic_factory("clks", partitions=2)
    model = ClickModelConfig(seed=11, click_delay_median_ms=200)
    config = SyntheticSourceConfig(imps, clks, rate=2000, count=1500, start=100,
                                   max_click_delay_ms=1500, model=model)
    stats = SyntheticSource(config, KafkaSink(services.kafka)).run()

    truth = {i.impression_id: i for i in ClickModel(model).impressions(1500, start=100)}
    expected_clicks = {k for k, i in truth.items() if i.clicked and i.click_delay_ms <= 1500}
    assert stats.impressions == 1500 and stats.clicks == len(expected_clicks) > 100

    impressions = [ImpressionRecord.from_json(m.value()) for m in read_topic(services.kafka, imps, 1500)]
    assert Counter(r.impression_id for r in impressions) == Counter(truth.keys())  # each exactly once
    for r in impressions[:50]:
        assert {k: v[0] for k, v in r.sparse.items()} == truth[r.impression_id].sparse

    messages = read_topic(services.kafka, clks, len(expected_clicks))
    clicks = [ClickRecord.from_json(m.value()) for m in messages]
    assert Counter(c.impression_id for c in clicks) == Counter(expected_clicks)
    assert all(m.key().decode() == ClickRecord.from_json(m.value()).impression_id for m in messages)
    shown = {r.impression_id: r.event_time_ms for r in impressions}
    for c in clicks:
        # The click happened its model delay after the impression was written (to the ms).
        assert c.event_time_ms - shown[c.impression_id] == truth[c.impression_id].click_delay_ms


def test_labelled_mode_through_the_cli_writes_the_models_examples(services, topic_factory, tmp_path):
    topic = topic_factory("examples")
    env = {"STREAMTRAIN_KAFKA": services.kafka, "STREAMTRAIN_ETCD": services.etcd,
           "STREAMTRAIN_REDIS": services.redis, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "streamtrain", "produce", "synthetic", "--topic", topic,
         "--count", "400", "--rate", "0", "--seed", "5"],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "examples 400" in done.stdout

    examples = [schemas.Example.from_json(m.value()) for m in read_topic(services.kafka, topic, 400)]
    truth = ClickModel(ClickModelConfig(seed=5)).examples(400)
    assert len(examples) == 400
    assert [(dict(e.sparse), e.dense, e.label) for e in examples] == \
        [(dict(e.sparse), e.dense, e.label) for e in truth]
