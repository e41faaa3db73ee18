import os
import signal
import subprocess
import sys
import threading
from collections import Counter

import pytest

from streamtrain import schemas
from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig
from streamtrain.producers.sink import KafkaSink
from streamtrain.producers.synthetic import SyntheticSource, SyntheticSourceConfig
from topic_reader import read_topic

pytestmark = [pytest.mark.services, pytest.mark.slow]

WINDOW_S = 1.0


def _joiner(services, imps, clks, out, group, log):
    env = dict(os.environ, STREAMTRAIN_KAFKA=services.kafka, STREAMTRAIN_ETCD=services.etcd,
               STREAMTRAIN_REDIS=services.redis)
    return subprocess.Popen(
        [sys.executable, "-m", "streamtrain", "join", "--impressions", imps, "--clicks", clks,
         "--output", out, "--window-s", str(WINDOW_S), "--group", group],
        env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def test_each_impression_yields_exactly_one_example_across_a_joiner_sigkill(services, topic_factory, unique, tmp_path):
    imps, clks = topic_factory("imps", partitions=2), topic_factory("clks", partitions=2)
    out, group = topic_factory("examples", partitions=2), unique("join")
    log = tmp_path / "joiner.log"
    count = 3000
    model = ClickModelConfig(seed=21, click_delay_median_ms=400)
    source = SyntheticSource(SyntheticSourceConfig(imps, clks, rate=600, count=count, max_click_delay_ms=3000,
                                                   model=model), KafkaSink(services.kafka))
    writer = threading.Thread(target=source.run)

    first = _joiner(services, imps, clks, out, group, log)
    writer.start()
    try:
        # Kill -9 mid-stream: once some examples are committed, with more impressions to come
        # and a transaction (outputs, changelog, offsets) in flight.
        seen = read_topic(services.kafka, out, 300, timeout=60, settle=0)
        assert 300 <= len(seen) < count, f"joiner produced {len(seen)} before the kill (log: {log})"
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        second = _joiner(services, imps, clks, out, group, log)
        writer.join(120)
        assert not writer.is_alive()
        messages = read_topic(services.kafka, out, count, timeout=90, settle=3)
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)

    keys = Counter(m.key().decode() for m in messages)
    truth = {i.impression_id: i for i in ClickModel(model).impressions(count)}
    assert not [k for k, n in keys.items() if n > 1], "an impression was emitted twice"
    assert set(keys) == set(truth), f"{len(set(truth) - set(keys))} impressions never emitted"

    for m in messages:
        imp = truth[m.key().decode()]
        example = schemas.Example.from_json(m.value())
        in_window = imp.clicked and imp.click_delay_ms <= WINDOW_S * 1000
        assert example.label == float(in_window), imp
        assert {k: v[0] for k, v in example.sparse.items()} == imp.sparse
    positives = sum(schemas.Example.from_json(m.value()).label for m in messages)
    late = sum(i.clicked and 1000 < i.click_delay_ms <= 3000 for i in truth.values())
    assert positives > 100 and late > 50  # both labels of a click were exercised
