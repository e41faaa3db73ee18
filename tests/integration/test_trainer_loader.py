"""The trainer's record loader (a child process) against the real broker: exact ranges across
transaction markers, bad records sent back with their offsets, a range given up midway, a
decoder that does not import, a loader that dies."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from confluent_kafka import Producer

from conftest import read_partition
from streamtrain.infra import Endpoints
from streamtrain.producers.clickmodel import ClickModel
from streamtrain.schemas.config import InputSection, JobConfigError
from streamtrain.trainer.features import Featurizer
from streamtrain.trainer.loader import LoaderDiedTwiceError, LoaderSpec, RecordLoader

pytestmark = [pytest.mark.services]

MODEL = ClickModel()


def spec(services: Endpoints, topic: str, chunk_records: int, fmt: str = "json") -> LoaderSpec:
    return LoaderSpec(services, f"{topic}.loader-test", InputSection((topic,), format=fmt), MODEL.fields,
                      MODEL.dense_features, 1 << 20, chunk_records)


def write_in_transactions(services: Endpoints, topic: str, values: list[bytes], per_txn: int) -> None:
    """Each transaction's commit marker takes an offset: offsets and records differ."""
    producer = Producer({"bootstrap.servers": services.kafka, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    for start in range(0, len(values), per_txn):
        producer.begin_transaction()
        for value in values[start:start + per_txn]:
            producer.produce(topic, value, partition=0)
        producer.commit_transaction(30)


def offsets_of(services: Endpoints, topic: str) -> list[int]:
    """The offsets of partition 0's records (markers take offsets in between)."""
    return [m.offset() for m in read_partition(services, topic)]


def test_a_range_comes_back_exactly_in_chunks_with_its_bad_records(services, topic_factory) -> None:
    topic = topic_factory("loader")
    examples = MODEL.examples(120)
    values = [e.to_json() for e in examples]
    for i in (7, 50, 51, 99):
        values[i] = b"{not json"
    write_in_transactions(services, topic, values, per_txn=25)
    offsets = offsets_of(services, topic)
    assert len(offsets) == 120 and offsets[-1] > 119  # markers in between
    start, end = offsets[5], offsets[105]  # records 5..104

    loader = RecordLoader(spec(services, topic, chunk_records=32))
    try:
        chunks = list(loader.read(topic, 0, start, end))
    finally:
        loader.close()

    assert [len(c.block.labels) + len(c.bad) for c in chunks] == [32, 32, 32, 4]
    bad = [b for c in chunks for b in c.bad]
    assert [b.offset for b in bad] == [offsets[i] for i in (7, 50, 51, 99)]
    assert all(b.value == b"{not json" and b.topic == topic and b.partition == 0 and b.reason for b in bad)
    good = [e for i, e in enumerate(examples) if 5 <= i < 105 and i not in (7, 50, 51, 99)]
    want = Featurizer(MODEL.fields, MODEL.dense_features, 1 << 20).batch(good)
    assert np.array_equal(np.concatenate([c.block.ids for c in chunks]), want.ids)
    assert np.array_equal(np.concatenate([c.block.labels for c in chunks]), want.labels)


def test_a_range_given_up_midway_leaves_the_loader_ready_for_the_next(services, topic_factory) -> None:
    topic = topic_factory("loader")
    write_in_transactions(services, topic, [e.to_json() for e in MODEL.examples(3000)], per_txn=1000)
    end = offsets_of(services, topic)[-1] + 1
    loader = RecordLoader(spec(services, topic, chunk_records=100))
    try:
        read = loader.read(topic, 0, 0, end)
        next(read)
        read.close()  # given up after one chunk of thirty
        again = list(loader.read(topic, 0, 0, end))
        assert sum(len(c.block.labels) for c in again) == 3000
    finally:
        loader.close()


def test_a_decoder_that_does_not_import_is_said_at_start(services, topic_factory) -> None:
    topic = topic_factory("loader")
    loader = RecordLoader(spec(services, topic, 100, fmt="no_such_module_here:decode"))
    try:
        # The child's own JobConfigError, crossed over intact (`_picklable`), not a LoaderError
        # wrapping its traceback: the trainer says it as the job file's mistake.
        with pytest.raises(JobConfigError, match=r"^input\.format: 'no_such_module_here:decode': cannot load the "
                                                  r"decoder: No module named 'no_such_module_here'$") as raised:
            loader.wait_ready()
        assert raised.value.key == "input.format"
    finally:
        loader.close()


def test_a_loader_killed_midway_is_replaced_and_the_range_goes_on_after_its_last_chunk(services, topic_factory) -> None:
    topic = topic_factory("loader")
    write_in_transactions(services, topic, [e.to_json() for e in MODEL.examples(3000)], per_txn=1000)
    end = offsets_of(services, topic)[-1] + 1
    loader = RecordLoader(spec(services, topic, chunk_records=100))
    try:
        whole = np.concatenate([c.block.ids for c in loader.read(topic, 0, 0, end)])
        read = loader.read(topic, 0, 0, end)
        chunks = [next(read), next(read)]
        os.kill(loader.pid, signal.SIGKILL)
        chunks += list(read)
        assert loader.restarts == 1
        assert np.array_equal(np.concatenate([c.block.ids for c in chunks]), whole)  # each record once
        os.kill(loader.pid, signal.SIGKILL)  # between ranges: the next read starts another
        assert sum(len(c.block.labels) for c in loader.read(topic, 0, 0, end)) == 3000
        read = loader.read(topic, 0, 0, end)
        next(read)
        os.kill(loader.pid, signal.SIGKILL)
        read.close()  # given up while its child is dead: closes cleanly, starts nothing
        assert loader.restarts == 2
        assert sum(len(c.block.labels) for c in loader.read(topic, 0, 0, end)) == 3000
        assert loader.restarts == 3
    finally:
        loader.close()


def test_a_loader_that_dies_again_at_the_same_record_is_an_error_not_a_loop(services, topic_factory, tmp_path,
                                                                           monkeypatch) -> None:
    (tmp_path / "deadly.py").write_text(
        "import os, signal\n"
        "from streamtrain.schemas import Example\n"
        "def decode(value):\n"
        "    if value == b'boom':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return Example.from_json(value)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    topic = topic_factory("loader")
    values = [e.to_json() for e in MODEL.examples(300)]
    values[150] = b"boom"
    write_in_transactions(services, topic, values, per_txn=300)
    loader = RecordLoader(spec(services, topic, 100, fmt="deadly:decode"))
    try:
        chunks = []
        with pytest.raises(LoaderDiedTwiceError, match="died twice reading"):
            for chunk in loader.read(topic, 0, 0, 301):
                chunks.append(chunk)
        assert len(chunks) == 1 and loader.restarts == 1
    finally:
        loader.close()


def test_a_killed_loader_is_replaced_by_its_standby_which_is_replaced_in_turn(services, topic_factory) -> None:
    topic = topic_factory("loader")
    write_in_transactions(services, topic, [e.to_json() for e in MODEL.examples(3000)], per_txn=1000)
    end = offsets_of(services, topic)[-1] + 1
    loader = RecordLoader(spec(services, topic, chunk_records=100))
    try:
        loader.wait_ready()  # as a trainer does while it starts
        list(loader.read(topic, 0, 0, 100))
        assert loader.standby_pid is None  # not while the trainer starts: after its first range
        read = loader.read(topic, 0, 0, end)
        chunks = [next(read)]
        first = loader.pid
        standby = loader.standby_pid  # started at the second range
        assert standby is not None and standby != first
        os.kill(first, signal.SIGKILL)
        chunks += list(read)
        assert loader.pid == standby and loader.restarts == 1  # taken over, no cold start
        assert sum(len(c.block.labels) for c in chunks) == 3000
        assert loader.standby_pid is None
        list(loader.read(topic, 0, 0, 100))
        assert loader.standby_pid not in (None, first, standby)  # the next range starts another
        children = [loader.pid, loader.standby_pid]
    finally:
        loader.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in children)  # closing ends (and reaps) both
