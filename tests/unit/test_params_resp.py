"""The compiled MSET and MGET are byte for byte what redis-py would send for the same rows,
in the order of the ids given."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.connection import Connection

from streamtrain.params import resp
from streamtrain.schemas import encode_rows, encode_rows_matrix


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 2), min_size=1, max_size=50, unique=True), st.integers(1, 8))
@example([0, 9, 10, 99, 100, 2**64 - 2], 1)  # each number of digits' edge
def test_mset_equals_redis_py_packing(ids: list[int], dim: int) -> None:
    values = np.random.default_rng(len(ids)).normal(size=(len(ids), dim)).astype(np.float32)
    prefix = "st:job:row:emb:"
    args = []
    for i, row in zip(ids, encode_rows(values)):
        args += [f"{prefix}{i}", row]
    expected = b"".join(Connection().pack_command("MSET", *args))
    assert resp.mset(prefix.encode(), np.array(ids, dtype=np.uint64), encode_rows_matrix(values)) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.sampled_from(["", "p:", "x" * 120]))
@example([2**64 - 1, 0, 1234567], "st:job:row:emb:")
def test_mget_equals_redis_py_packing_in_the_order_given(ids: list[int], prefix: str) -> None:
    expected = b"".join(Connection().pack_command("MGET", *[f"{prefix}{i}" for i in ids]))
    assert resp.mget(prefix.encode(), np.array(ids, dtype=np.uint64)) == expected


# -- Batch: one write, exactly its replies read --------------------------------------------


def _commands(data: bytes) -> list[list[bytes]]:
    """The commands in RESP bytes, as Redis would split them (arrays of bulk strings)."""
    out, at = [], 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        assert data[at:at + 1] == b"*"
        count, at = int(data[at + 1:end]), end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1:end])
            args.append(data[end + 2:end + 2 + size])
            at = end + 2 + size + 2
        out.append(args)
    return out


class FakeRedis:
    """A connection to a Redis that answers every command it was sent, as redis-py's
    `read_response` hands the replies over: error replies raise, EXEC's failures are values."""

    def __init__(self, fail: bytes | None = None) -> None:
        self.writes: list[bytes] = []
        self.replies: list[object] = []
        self.fail = fail  # a command name that fails when it runs

    def send_packed_command(self, command: list[bytes], check_health: bool = True) -> None:
        data = b"".join(command)
        self.writes.append(data)
        queued: list[object] | None = None
        for name, *args in _commands(data):
            result: object = redis.ResponseError("ERR failed") if name == self.fail else (
                len(args) if name == b"INCR" else b"OK")
            if name == b"MULTI":
                queued = []
                self.replies.append(b"OK")
            elif name == b"EXEC":
                self.replies.append(queued)
                queued = None
            elif queued is not None:
                queued.append(result)
                self.replies.append(b"QUEUED")
            else:
                self.replies.append(result)

    def read_response(self) -> object:
        reply = self.replies.pop(0)  # IndexError: a read with no reply due would block for ever
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply


def batch_of(plain: int, queued: int | None) -> resp.Batch:
    batch = resp.Batch()
    for i in range(plain):
        batch.add(resp.mset(b"k:", np.arange(i + 1, dtype=np.uint64), np.zeros((i + 1, 2), np.uint8)))
    if queued is not None:
        batch.multi()
        for i in range(queued):
            batch.queue(resp.command(b"SET", b"q%d" % i, b"v"))
        batch.queue(resp.command(b"INCR", b"version"))
        batch.exec()
    return batch


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5), st.none() | st.integers(0, 6))
def test_a_batch_is_one_write_and_reads_exactly_its_replies(plain: int, queued: int | None) -> None:
    redis_ = FakeRedis()
    results = batch_of(plain, queued).send(redis_)
    assert len(redis_.writes) == 1 and redis_.replies == []  # nothing left unread, nothing read ahead
    assert len(_commands(redis_.writes[0])) == plain + (0 if queued is None else queued + 3)
    assert results == ([] if queued is None else [b"OK"] * queued + [1])


def test_a_command_that_was_not_one_command_is_caught_at_the_first_reply_out_of_step() -> None:
    batch = resp.Batch()
    batch.add(resp.command(b"SET", b"a", b"1") + resp.command(b"SET", b"b", b"2"))  # counted as one
    batch.multi()
    batch.queue(resp.command(b"INCR", b"version"))
    batch.exec()
    # The second SET's OK is read as MULTI's, MULTI's OK where INCR's QUEUED is due.
    with pytest.raises(redis.InvalidResponse, match="expected QUEUED, got b'OK': replies out of step"):
        batch.send(FakeRedis())


def test_a_reply_read_where_multis_ok_is_due_is_caught() -> None:
    batch = resp.Batch()
    batch.add(resp.command(b"SET", b"a", b"1") + resp.command(b"INCR", b"b"))  # counted as one
    batch.multi()
    batch.queue(resp.command(b"SET", b"c", b"1"))
    batch.exec()
    with pytest.raises(redis.InvalidResponse, match="expected MULTI's OK, got 1: replies out of step"):
        batch.send(FakeRedis())


def test_an_exec_reply_of_another_length_than_the_commands_queued_is_caught() -> None:
    class Short(FakeRedis):
        def read_response(self) -> object:
            reply = super().read_response()
            return reply[:-1] if isinstance(reply, list) else reply

    with pytest.raises(redis.InvalidResponse, match="EXEC's 3 results"):
        batch_of(1, 2).send(Short())


def test_a_failed_command_raises_its_error_in_or_outside_the_transaction() -> None:
    with pytest.raises(redis.ResponseError, match="failed"):
        batch_of(0, 2).send(FakeRedis(fail=b"INCR"))  # inside: a value in EXEC's reply
    with pytest.raises(redis.ResponseError, match="failed"):
        batch_of(2, 1).send(FakeRedis(fail=b"MSET"))  # outside: the reply itself


def test_a_batch_refuses_to_be_built_so_that_its_replies_could_not_be_counted() -> None:
    batch = resp.Batch()
    with pytest.raises(ValueError, match="outside a transaction"):
        batch.queue(resp.command(b"INCR", b"v"))
    with pytest.raises(ValueError, match="not a RESP command"):
        batch.add(b"SET a 1\r\n")  # an inline command has no count to check
    batch.multi()
    with pytest.raises(ValueError, match="inside a transaction"):
        batch.add(resp.command(b"SET", b"a", b"1"))
    with pytest.raises(ValueError, match="still open"):
        batch.send(FakeRedis())
    batch.exec()
    with pytest.raises(ValueError, match="one transaction per batch"):
        batch.multi()
