import numpy as np
import pytest
import torch

from streamtrain.params.paramstore import ParamsUnavailableError, Pull
from streamtrain.schemas import FlushMark, PublishedRound, RoundRows
from streamtrain.trainer.params import DenseLayout, ParamSync
from streamtrain.trainer.replica import START, Position, RowReplica, follows

WIDTH = 3


def rows(ids, value: float) -> np.ndarray:
    return np.full((len(ids), WIDTH), value, dtype=np.float32)


def entry(epoch: int, round_no: int, ids=(), value: float = 0.0, reset: bool = False, applied=None,
          table: str = "t") -> PublishedRound:
    ids = np.array(ids, dtype=np.uint64)
    parts = (RoundRows(table, ids, rows(ids, value)),) if len(ids) else ()
    return PublishedRound(epoch, round_no, reset, applied or {}, parts)


def mark(at: bytes, epoch: int) -> FlushMark:
    return FlushMark(at, epoch, int(at.split(b"-")[1]))


def held(replica: RowReplica, ids) -> np.ndarray:
    slots = replica.lookup(np.array(ids, dtype=np.uint64))
    assert (slots >= 0).all()
    return replica.gather(slots)


@pytest.mark.parametrize("position, round_, follows_it", [
    (Position(1, 4), entry(1, 5), True),
    (Position(1, 4), entry(1, 6), False),  # a round missing: trimmed before it was read
    (Position(1, 4), entry(2, 5), False),  # another epoch
    (Position(1, 4), entry(1, 5, reset=True), False),  # the shard republished everything
    (None, entry(1, 5), False),  # nothing known before it
    (Position(1, 4), None, False),  # it did not decode
])
def test_a_round_keeps_the_rows_held_only_if_it_follows_the_last_one_without_a_gap(
        position, round_, follows_it) -> None:
    assert follows(position, round_) is follows_it


@pytest.mark.parametrize("base", [0, 2**40])  # ids found directly, and by probing
def test_rows_are_held_once_read_or_changed_and_rounds_keep_them_current(base) -> None:
    a, b, c, d = (base + i for i in (5, 7, 11, 99))
    replica = RowReplica("t", WIDTH, shards=2)
    replica.start({0: mark(b"9-1", 9), 1: None})
    assert replica.after == {0: b"9-1", 1: START}
    ids = np.array([a, b, c], dtype=np.uint64)
    assert (replica.lookup(ids) == -1).all()
    slots = replica.insert(ids, np.array([0, 0, 1]), rows(ids, 1.0))
    assert replica.lookup(ids).tolist() == slots.tolist()
    applied = replica.apply({0: [(b"9-2", entry(9, 2, [a, d], 2.0, applied={"me": 4}))]}, {})
    assert applied == {0: {"me": 4}} and replica.drops == 0 and replica.after[0] == b"9-2"
    # d was not held: a round changed it, so its key may be older than the round; now held.
    assert held(replica, [a, b, c, d])[:, 0].tolist() == [2.0, 1.0, 1.0, 2.0]
    # Shard 1 had not flushed at the start: read from its beginning, it is followed from the
    # flush this pull found, the rounds before it passed over.
    replica.apply({1: [(b"3-6", entry(3, 6, [c], 2.5)), (b"3-8", entry(3, 8, [c], 3.0))]}, {1: mark(b"3-7", 3)})
    assert replica.after[1] == b"3-8" and held(replica, [c])[0, 0] == 3.0
    replica.apply({1: [(b"3-9", entry(3, 9, [c], 4.0))]}, {1: mark(b"3-7", 3)})
    assert held(replica, [a, b, c])[:, 0].tolist() == [2.0, 1.0, 4.0]
    assert replica.after == {0: b"9-2", 1: b"3-9"} and replica.drops == 0


def test_a_gap_or_a_reset_drops_only_that_shards_rows_and_follows_it_again_from_its_flush() -> None:
    replica = RowReplica("t", WIDTH, shards=2)
    replica.start({0: mark(b"1-1", 1), 1: mark(b"1-1", 2)})
    ids = np.array([5, 6, 7], dtype=np.uint64)
    replica.insert(ids, np.array([0, 1, 1]), rows(ids, 1.0))
    generation = replica.generation
    # Round 2 of shard 1 was missed (trimmed): its rows go, and it is followed again from its
    # last flush, round 2: the rounds after it are applied.
    replica.apply({1: [(b"1-3", entry(2, 3, [6], 5.0)), (b"1-4", entry(2, 4, [6], 6.0))]}, {1: mark(b"1-2", 2)})
    assert replica.generation > generation and replica.drops == 1 and replica.after[1] == b"1-4"
    assert replica.lookup(ids).tolist()[2] == -1 and held(replica, [5, 6])[:, 0].tolist() == [1.0, 6.0]
    replica.insert(ids[2:], np.array([1]), rows(ids[2:], 6.0))
    # Shard 0 republished everything: a new epoch, flushed at its reset round.
    replica.apply({0: [(b"5-1", entry(7, 1, reset=True))]}, {0: mark(b"5-1", 7)})
    assert replica.lookup(ids).tolist()[0] == -1 and held(replica, [6, 7])[:, 0].tolist() == [6.0, 6.0]
    assert replica.after[0] == b"5-1"
    replica.apply({0: [(b"5-2", entry(7, 2, [5], 8.0))]}, {})
    assert held(replica, [5])[0, 0] == 8.0
    replica.apply({1: [(b"1-5", None)]}, {})  # a round that did not decode: nothing known of it
    assert replica.lookup(ids).tolist()[1:] == [-1, -1] and replica.after[1] == b"1-2"


def test_a_flush_of_an_epoch_whose_rounds_were_not_seen_drops_the_shards_rows() -> None:
    """A republish deletes the stream; with the clock set back, its new ids can sort before
    the position a trainer holds, which then reads nothing more of it: the flush tells."""
    replica = RowReplica("t", WIDTH, shards=1)
    replica.start({0: mark(b"9-4", 1)})
    replica.insert(np.array([5], dtype=np.uint64), np.array([0]), rows([5], 1.0))
    replica.apply({0: []}, {0: mark(b"9-4", 1)})
    assert replica.drops == 0
    replica.apply({0: []}, {0: mark(b"3-1", 2)})
    assert replica.drops == 1 and replica.size == 0 and replica.after[0] == b"3-1"


def test_rounds_of_other_tables_or_widths_change_nothing() -> None:
    replica = RowReplica("t", WIDTH, shards=1)
    replica.start({0: mark(b"1-1", 1)})
    replica.insert(np.array([5], dtype=np.uint64), np.array([0]), rows([5], 1.0))
    wide = PublishedRound(1, 3, False, {}, (RoundRows("t", np.array([5], dtype=np.uint64),
                                                      np.zeros((1, WIDTH + 1), np.float32)),))
    replica.apply({0: [(b"1-2", entry(1, 2, [5], 9.0, table="other")), (b"1-3", wide)]}, {})
    assert held(replica, [5])[0, 0] == 1.0 and replica.drops == 0 and replica.size == 1


def test_a_replica_that_outgrows_its_budget_starts_again_empty_from_each_flush() -> None:
    replica = RowReplica("t", WIDTH, shards=1, max_bytes=4 * WIDTH * 10, capacity=4)
    replica.start({0: mark(b"1-1", 1)})
    first = np.arange(8, dtype=np.uint64)
    replica.insert(first, np.zeros(8, np.int64), rows(first, 1.0))
    replica.apply({0: [(b"1-2", entry(1, 2, [1], 2.0))]}, {0: mark(b"1-2", 1)})
    generation = replica.generation
    more = np.arange(8, 12, dtype=np.uint64)
    slots = replica.insert(more, np.zeros(4, np.int64), rows(more, 2.0))
    assert replica.generation > generation and replica.size == 4 and replica.after[0] == b"1-2"
    assert (replica.lookup(first) == -1).all() and replica.lookup(more).tolist() == slots.tolist()
    # Outgrown by the rounds themselves: the rest of the rounds read are left for the next pull.
    replica.apply({0: [(b"1-3", entry(1, 3, range(20, 30), 3.0)), (b"1-4", entry(1, 4, [8], 4.0))]},
                  {0: mark(b"1-3", 1)})
    assert replica.after[0] == b"1-3" and held(replica, [20])[0, 0] == 3.0
    assert replica.lookup(np.array([8], dtype=np.uint64))[0] == -1


def test_rows_read_from_keys_are_held_only_of_shards_followed_since_a_flush() -> None:
    """Shard 1 has not flushed when the trainer starts: a row read from its key then is not
    held, for the rounds up to the flush it is followed from are passed over and would never
    bring that row up to date (it kept its first value while the shards' had moved on)."""
    replica = RowReplica("t", WIDTH, shards=2)
    replica.start({0: mark(b"9-1", 9), 1: None})
    ids = np.array([5, 6], dtype=np.uint64)
    replica.hold(ids, np.array([0, 1]), rows(ids, 1.0))
    assert replica.lookup(ids).tolist()[1] == -1 and held(replica, [5])[0, 0] == 1.0
    # Round 2 changed row 6 and was flushed: followed from that flush, round 2 is passed over.
    replica.apply({1: [(b"3-1", entry(3, 1, reset=True)), (b"3-2", entry(3, 2, [6], 2.0))]}, {1: mark(b"3-2", 3)})
    assert replica.lookup(ids).tolist()[1] == -1 and replica.after[1] == b"3-2"
    replica.hold(ids[1:], np.array([1]), rows(ids[1:], 2.0))  # read from its key, as of that flush
    replica.apply({1: [(b"3-3", entry(3, 3, [6], 3.0))]}, {})
    assert held(replica, [5, 6])[:, 0].tolist() == [1.0, 3.0]


class _NotPublishedFirst:
    """A ParamClient whose first reply finds shard 0 not in Redis yet: the retry must read
    the rounds again, or the rows it reads from keys could miss rounds after the flush."""

    def __init__(self) -> None:
        self.asked: list[dict[int, bytes]] = []  # the rounds each request asked for

    def flushed(self, after) -> dict:
        return {0: mark(b"1-1", 1)}

    def send_pull(self, rows_, blocks, row_shards=None, rounds=None):
        self.asked.append(dict(rounds or {}))
        ids, _ = rows_["t"]
        first = len(self.asked) == 1

        class Reply:
            def result(self) -> Pull:
                if first:
                    raise ParamsUnavailableError([0], retry_after=0.0)
                return Pull({"t": rows(ids, 1.0)}, {}, {0: 2}, {0: {}}, {0: [(b"1-2", entry(1, 2, [5], 2.0))]},
                            {0: mark(b"1-1", 1)})
        return Reply()


def test_a_pull_retried_while_a_shard_is_away_reads_the_rounds_again() -> None:
    client = _NotPublishedFirst()
    sync = ParamSync(client, DenseLayout(torch.nn.Module()), wait_s=5, replica=RowReplica("t", WIDTH, shards=1))
    ids = np.array([5, 6], dtype=np.uint64)
    fetched = sync.send({"t": WIDTH}, ids, {"t": np.zeros(2, np.int32)}, dense=False).result()
    assert client.asked == [{0: b"1-1"}, {0: b"1-1"}]
    assert fetched.rows["t"][:, 0].tolist() == [2.0, 1.0]  # 5 as round 2 left it, 6 as its key
