import json
import subprocess
import sys
import threading
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import wait_for
from streamtrain.producers.replay import FileReplay, ReplayConfig
from streamtrain.producers.sink import KafkaSink
from topic_reader import read_topic

pytestmark = pytest.mark.services


def test_a_parquet_file_lands_exactly_its_rows_through_the_cli(services, topic_factory, tmp_path):
    topic = topic_factory("replay", partitions=3)
    path = tmp_path / "log.parquet"
    rows = [{"id": f"r{i}", "ad": i % 7, "ctr": i / 1000} for i in range(3000)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    env = {"STREAMTRAIN_KAFKA": services.kafka, "STREAMTRAIN_ETCD": services.etcd,
           "STREAMTRAIN_REDIS": services.redis, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "streamtrain", "produce", "file", str(path),
                           "--topic", topic, "--key", "id"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rows 3000  passes 1" in done.stdout

    messages = read_topic(services.kafka, topic, 3000)
    assert Counter(m.value() for m in messages) == Counter(json.dumps(r, separators=(",", ":")).encode() for r in rows)
    assert all(json.loads(m.value())["id"] == m.key().decode() for m in messages)


def test_a_looped_csv_replay_is_paced_and_stops_when_asked(services, topic_factory, tmp_path):
    topic = topic_factory("loop")
    path = tmp_path / "log.csv"
    path.write_text("n\n" + "".join(f"{i}\n" for i in range(10)))
    stop = threading.Event()
    replay = FileReplay(ReplayConfig(path, topic, rate=200, loop=True, value="csv"), KafkaSink(services.kafka))
    runner = threading.Thread(target=replay.run, args=(stop,))
    started = time.monotonic()
    runner.start()
    wait_for(lambda: replay.stats.passes >= 3, 30, "three passes over the file")
    stop.set()
    runner.join(30)
    elapsed = time.monotonic() - started
    assert not runner.is_alive()
    stats = replay.stats
    assert stats.passes >= 2
    assert stats.rows <= 200 * elapsed + 25  # paced: one burst of at most rate/10 above the line
    values = [m.value() for m in read_topic(services.kafka, topic, stats.rows)]
    assert values == [str(i % 10).encode() for i in range(stats.rows)]
