"""When a shard writes its row keys, and what a flush carries (pserver/redis_rounds.py)."""

import threading

import numpy as np
import pytest

from streamtrain.params.optimizers import SGD
from streamtrain.params.paramstore import stream_id
from streamtrain.pserver.publish_thread import BackgroundPublisher
from streamtrain.pserver.redis_rounds import (
    FLUSH_BUSY_S,
    FLUSH_EVERY_S,
    FLUSH_KEYS_PER_S,
    FLUSH_MAX_ROUNDS,
    FLUSH_MAX_ROWS,
    Publisher,
    flush_due,
    flushed_through,
)
from streamtrain.pserver.state import Changes, ShardState
from streamtrain.schemas import FlushMark, GradientDelta, SparseRows, TaskRecord


@pytest.mark.parametrize("since_s, dirty, rounds, last_keys, due", [
    (0.0, 0, 0, 0, False),
    (FLUSH_EVERY_S * 10, 0, 3, 0, False),  # nothing changed: the keys are current
    (FLUSH_EVERY_S - 0.01, 500, 3, 0, False),
    (FLUSH_EVERY_S, 1, 3, 0, True),
    (FLUSH_EVERY_S, 1, 3, FLUSH_KEYS_PER_S * FLUSH_EVERY_S, True),  # a light stream: a quarter second fresh
    (FLUSH_EVERY_S, 1, 3, FLUSH_KEYS_PER_S * 0.5, False),  # a larger last flush spaces the next
    (0.5, 1, 3, FLUSH_KEYS_PER_S * 0.5, True),
    (FLUSH_BUSY_S - 0.01, 1, 3, FLUSH_KEYS_PER_S * 10, False),
    (FLUSH_BUSY_S, 1, 3, FLUSH_KEYS_PER_S * 10, True),  # but keys are never more than a second behind
    (0.0, FLUSH_MAX_ROWS, 3, FLUSH_KEYS_PER_S * 10, True),  # enough rows waiting
    (0.0, 0, FLUSH_MAX_ROUNDS, 0, True),  # the last flush must stay in the stream for followers
])
def test_a_flush_is_due_when_rows_have_waited_long_enough_or_pile_up(since_s, dirty, rounds, last_keys, due) -> None:
    assert flush_due(since_s, dirty, rounds, last_keys) is due


def test_a_flush_mark_names_its_round_by_stream_id_and_epoch() -> None:
    mark = FlushMark(stream_id(1795416671754, 37), 2**63 + 5, 37)
    assert mark.at == b"1795416671754-37"
    assert FlushMark.from_bytes(mark.to_bytes()) == mark


@pytest.mark.parametrize("mark, version, epoch, round_, holds", [
    (FlushMark(b"1-9", 7, 9, 40), 41, 7, 9, True),  # flushed at the round asked for
    (FlushMark(b"1-12", 7, 12, 40), 40, 7, 9, True),  # or after it
    (FlushMark(b"1-9", 7, 9, 0), 3, 7, 9, True),  # by a round that wrote every row itself
    (FlushMark(b"1-8", 7, 8, 40), 41, 7, 9, False),  # before it: the round's rows may not be in the keys
    (FlushMark(b"1-30", 8, 30, 40), 41, 7, 9, False),  # another epoch: a reset began it since
    (None, 41, 7, 9, False),  # nothing published (a Redis that restarted empty)
    (FlushMark(b"1-30", 7, 30, 40), 41, 7, 0, False),  # nothing known (a manifest written before marks)
    # Redis restarted empty before the flush: the version counted again from 1, and the flush
    # wrote its own rows onto nothing.
    (FlushMark(b"1-30", 7, 30, 40), 1, 7, 9, False),
    (FlushMark(b"1-30", 7, 30), 41, 7, 9, False),  # a mark without its version
])
def test_the_keys_hold_a_checkpoints_rows_only_if_flushed_through_its_round_of_its_epoch_without_a_loss(
        mark, version, epoch, round_, holds) -> None:
    assert flushed_through(mark, version, epoch, round_) is holds


class _NoRedis(Publisher):
    """A publisher whose rounds go nowhere: its bookkeeping without Redis."""

    def __init__(self) -> None:
        super().__init__(None, "job", 0)
        self.version = 0

    def send(self, snapshot, applied=None, reset=False, expect=None) -> int:
        self._round_command(snapshot, applied or {}, reset)
        self.version += 1
        return self.version

    def published(self) -> bool:
        return True


def test_the_position_a_checkpoint_records_is_the_round_that_holds_every_change_applied() -> None:
    state, publisher = ShardState(SGD(lr=1.0)), _NoRedis()
    publishing = BackgroundPublisher(publisher, state, threading.Lock(), 0.05, 60.0)
    publishing.add(train(state, 0, [1, 2]), "t", 0)
    assert publishing.position() == (0, 0)  # everything is still to be written, in a new epoch
    publishing.round()
    epoch, sent = publisher.position()
    assert publishing.position() == (epoch, sent)  # every change is in a round sent
    publishing.add(train(state, 1, [3]), "t", 1)
    assert publishing.position() == (epoch, sent + 1)  # the next round takes the change waiting
    publishing.round()
    assert publishing.position() == (epoch, sent + 1)


def train(state: ShardState, seq: int, ids) -> Changes:
    ids = np.array(ids, dtype=np.uint64)
    return state.apply(GradientDelta(TaskRecord.make_id("in", 0, 0), seq, "t", 0, seq, 1,
                                     sparse=(SparseRows("user", ids, np.ones((len(ids), 2), np.float32)),)))


def test_a_flush_writes_each_row_changed_since_the_last_once_at_its_newest_value() -> None:
    state, publisher = ShardState(SGD(lr=1.0)), Publisher(None, "job", 0)
    first = publisher.snapshot(state, train(state, 0, [1, 2]), flush=False)
    assert [ids.tolist() for _, ids, _ in first.rows] == [[1, 2]] and not first.keys and not first.flush
    second = publisher.snapshot(state, train(state, 1, [2, 3]), flush=True)
    assert [ids.tolist() for _, ids, _ in second.rows] == [[2, 3]]  # the round: what it changed
    (table, ids, values), = second.keys  # the flush: everything since the last, once
    assert table == "user" and ids.tolist() == [1, 2, 3] and second.flush
    t = state.tables["user"]
    assert np.array_equal(values, t.gather(t.index.lookup(ids)))
    third = publisher.snapshot(state, train(state, 2, [4]), flush=True)
    assert [ids.tolist() for _, ids, _ in third.keys] == [[4]]


def test_a_reset_writes_everything_and_its_round_carries_no_rows() -> None:
    state, publisher = ShardState(SGD(lr=1.0)), Publisher(None, "job", 0)
    publisher.snapshot(state, train(state, 0, [1, 2]), flush=False)
    reset = publisher.snapshot(state, Publisher.everything(state), reset=True)
    assert reset.rows == [] and [ids.tolist() for _, ids, _ in reset.keys] == [[1, 2]] and reset.flush
    after = publisher.snapshot(state, train(state, 1, [5]), flush=True)  # the reset was a flush
    assert [ids.tolist() for _, ids, _ in after.keys] == [[5]]
