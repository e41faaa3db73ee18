"""A task's records, read from Kafka and decoded in a child process, as featurized chunks.

Like PyTorch's DataLoader workers, and for the same reason: decoding is Python work that
holds the interpreter lock, in C calls of milliseconds (msgspec over a chunk of records,
numpy over its columns). In the trainer's own process it held the training thread back at
every point that thread let go of the lock (a socket write, torch's backward pass): the
training thread kept 0.37 of a core busy while it waited for the rest. In a child process
decoding has its own lock and the trainer's process only unpickles numpy arrays.

The child reads exactly `[start, end)` of a partition with `RangeReader`, decodes chunks of
records with the job's decoder and featurizes them; bad records come back as `BadRecord`s for
the trainer to dead-letter (its transactional producer must write them). Requests and chunks
go over a socket pair, pickled (`multiprocessing.connection` framing); a full socket is the
back-pressure that keeps the child at most a chunk or two ahead of the trainer's queue. The
child exits when the trainer closes the loader or its socket reaches end of file, which is
also what a SIGKILLed trainer leaves it.

A child that dies (killed, out of memory) is replaced and the range goes on from the record
after the last chunk handed over; mini-batches are cut from the records, not the chunks, so
the task trains as it would have. A child that dies again before handing over another chunk
(a record that crashes the decoder, say) is a `LoaderError`.

The replacement is a standby: a second child, started when the first has read a range, that
has imported, built its reader and decoder and waits. Starting a child cold is an interpreter's
imports, which on a busy machine take seconds: most of a killed loader's recovery, and all of
its slowest ones (bench/RESULTS.md, "restarts forked warm; a loader's standby"). A standby
taken is replaced at the next range. The
active child is always the older of the two.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import cast

from streamtrain.infra import Endpoints
from streamtrain.schemas import StreamtrainError
from streamtrain.schemas.config import InputSection
from streamtrain.trainer.decoders import ChunkDecoder
from streamtrain.trainer.features import Batch, Featurizer
from streamtrain.trainer.reader import RangeReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BadRecord:
    """A record that is no example of the job's format, and why."""

    topic: str
    partition: int
    offset: int
    value: bytes
    reason: str


@dataclass(frozen=True)
class Loaded:
    """A chunk of a task's records in offset order: the good ones featurized, the bad ones
    with their reasons."""

    block: Batch | None  # None when no record of the chunk decoded
    bad: list[BadRecord]
    resume: int  # the offset after the chunk's last record: where the range goes on


@dataclass(frozen=True)
class LoaderSpec:
    """What the child needs to read and decode a job's records."""

    endpoints: Endpoints
    group: str  # librdkafka wants a group id; nothing is committed under it
    input: InputSection
    fields: tuple[str, ...]
    dense_features: int
    hash_buckets: int
    chunk_records: int


class LoaderError(StreamtrainError, RuntimeError):
    """The loader's child process died or failed in a way no task retry can fix."""


class LoaderDiedTwiceError(LoaderError):
    """The child died twice reading from the same offset: a record there kills it (or the
    process was killed twice in a row there). The task fails; the trainer goes on."""


class _ChildGone(LoaderError):
    """The child process is gone (its socket closed)."""


class _Child:
    """A loader child and the trainer's end of its socket, sent the spec."""

    def __init__(self, spec: LoaderSpec) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # user decoders
        self.proc = subprocess.Popen([sys.executable, "-m", "streamtrain.trainer.loader", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        try:
            self.conn.send(spec)
        except OSError:
            pass  # gone already: its first receive says so
        self.ready = False

    def close(self, wait_s: float = 5.0) -> None:
        """Tell it to exit (end of requests), then wait for it, killing it after `wait_s`."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.conn.close()
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class RecordLoader:
    """The trainer's side: one child process reading one range at a time, and its standby."""

    def __init__(self, spec: LoaderSpec, standby: bool = True) -> None:
        """`standby`: keep a second child ready to take over (module doc)."""
        self._spec = spec
        self._request = 0
        self.restarts = 0
        self._gone: Exception | None = None  # the child died while a read was being given up
        self._child = _Child(spec)
        self._keep_standby = standby
        self._standby: _Child | None = None
        self._ranges_read = 0  # to the end: the standby starts after the first

    def _restart(self, reason: Exception) -> None:
        standby, self._standby = self._standby, None
        took = standby if standby is not None and standby.proc.poll() is None else None  # alive: it takes over
        log.warning("record loader (pid %d) died (%s); %s", self._child.proc.pid, reason,
                    f"its standby (pid {took.proc.pid}) takes over" if took is not None else "starting another")
        self._child.kill()
        self.restarts += 1
        if standby is not None and took is None:
            standby.kill()
        self._child = took if took is not None else _Child(self._spec)

    @property
    def pid(self) -> int:
        return self._child.proc.pid

    @property
    def standby_pid(self) -> int | None:
        return None if self._standby is None else self._standby.proc.pid

    def wait_ready(self) -> None:
        """Block until the child has its reader and decoder.

        Raises:
            LoaderError: it could not start; or the error it met building them (a user
                decoder that does not import, say).
        """
        if not self._child.ready:
            kind, body = self._recv()
            if kind == "error":
                raise cast(Exception, body)  # the child sends ("error", an exception)
            self._child.ready = True

    def read(self, topic: str, partition: int, start: int, end: int) -> Generator[Loaded, None, None]:
        """The chunks of `[start, end)`. Closing the iterator early tells the child to stop
        reading that range. A child that dies is replaced and the range goes on after the
        last chunk yielded.

        Raises:
            RangeReadError: the range could not be read (the task is retried elsewhere).
            LoaderDiedTwiceError: the child died twice at the same place.
            LoaderError: the child failed other than on a bad record.
        """
        at = [start]  # where the range goes on: after the last chunk yielded
        died_at = None
        if self._gone is not None:  # replaced here, never while a read is being closed
            gone, self._gone = self._gone, None
            self._restart(gone)
        if self._keep_standby and self._standby is None and self._ranges_read:
            # Once a range was read, not while the trainer starts: a standby's imports would
            # slow a restarted trainer's first task.
            self._standby = _Child(self._spec)
        while True:
            try:
                yield from self._read(topic, partition, at, end)
                self._ranges_read += 1
                return
            except _ChildGone as exc:
                if died_at == at[0]:
                    raise LoaderDiedTwiceError(f"the record loader died twice reading {topic}:{partition} from "
                                      f"offset {at[0]}: {exc}") from exc
                died_at = at[0]
                self._gone = None
                self._restart(exc)

    def _read(self, topic: str, partition: int, at: list[int], end: int) -> Iterator[Loaded]:
        start = at[0]
        self._request += 1
        request = self._request
        self.wait_ready()
        self._send(("read", request, topic, partition, start, end))
        done = False
        try:
            while True:
                # The child's messages (`_serve`): ("chunk", Loaded), ("end", None), ("error", an exception).
                kind, body = self._recv()
                if kind == "chunk":
                    loaded = cast(Loaded, body)
                    at[0] = loaded.resume
                    yield loaded
                elif kind == "end":
                    done = True
                    return
                else:  # "error": raised here, as it would have been in process
                    done = True
                    raise cast(Exception, body)
        finally:
            if not done:
                try:
                    self._abandon(request)
                except _ChildGone as exc:
                    # Closing a read must not start a child: the next read will.
                    self._gone = exc

    def _abandon(self, request: int) -> None:
        self._send(("abandon", request))
        while True:
            kind, body = self._recv()
            if kind in ("end", "error"):
                return

    def _send(self, message: object) -> None:
        try:
            self._child.conn.send(message)
        except OSError as exc:
            raise _ChildGone(f"the record loader (pid {self._child.proc.pid}) is gone: {exc}") from exc

    def _recv(self) -> tuple[str, object]:
        try:
            return self._child.conn.recv()
        except (EOFError, OSError) as exc:
            raise _ChildGone(f"the record loader (pid {self._child.proc.pid}) died "
                             f"(exit code {self._child.proc.poll()})") from exc

    def close(self) -> None:
        if self._standby is not None:  # it holds nothing yet: no need to wind it down
            self._standby.kill()
            self._standby = None
        self._child.close()


def load_range(reader: RangeReader, decoder: ChunkDecoder, featurizer: Featurizer, chunk_records: int,
               topic: str, partition: int, start: int, end: int) -> Iterator[Loaded]:
    """`[start, end)` in chunks of `chunk_records` records (the last one shorter)."""
    records: list = []
    for batch in reader.read_batches(topic, partition, start, end):
        records += batch
        while len(records) >= chunk_records:
            yield _prepared(decoder, featurizer, records[:chunk_records])
            records = records[chunk_records:]
    if records:
        yield _prepared(decoder, featurizer, records)


def _prepared(decoder: ChunkDecoder, featurizer: Featurizer, msgs: list) -> Loaded:
    # Decoding makes a few containers per record, all freed by reference counting; left on,
    # the cyclic collector runs every few hundred records and takes a sizeable part of the
    # loader's time.
    gc.disable()
    try:
        return _decoded(decoder, featurizer, msgs)
    finally:
        gc.enable()


def _decoded(decoder: ChunkDecoder, featurizer: Featurizer, msgs: list) -> Loaded:
    decoded = decoder.decode([m.value() for m in msgs])
    bad = [BadRecord(msgs[i].topic(), msgs[i].partition(), msgs[i].offset(), msgs[i].value() or b"", reason)
           for i, reason in decoded.bad]
    return Loaded(featurizer.featurize(decoded.columns) if len(decoded.columns) else None, bad,
                  msgs[-1].offset() + 1)


def _serve(conn: Connection) -> None:
    """The child: read ranges on request until told to stop or the trainer is gone."""
    spec: LoaderSpec = conn.recv()
    try:
        decoder = ChunkDecoder(spec.input, spec.fields, spec.dense_features)
        featurizer = Featurizer(spec.fields, spec.dense_features, spec.hash_buckets)
        reader = RangeReader(spec.endpoints, spec.group)
    except Exception as exc:  # noqa: BLE001 - the trainer says it at start-up
        conn.send(("error", _picklable(exc)))
        return
    gc.freeze()  # as in the trainer: the long-lived objects are not walked at every collection
    try:
        conn.send(("ready", None))
        while True:
            request = conn.recv()
            if request is None:
                return
            if request[0] != "read":
                continue  # an abandon that crossed the end of its range: nothing to stop
            _, number, topic, partition, start, end = request
            try:
                for loaded in load_range(reader, decoder, featurizer, spec.chunk_records,
                                         topic, partition, start, end):
                    conn.send(("chunk", loaded))
                    if conn.poll() and _abandoned(conn, number):
                        break
                conn.send(("end", None))
            except Exception as exc:  # noqa: BLE001 - every failure goes back to the trainer
                conn.send(("error", _picklable(exc)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the trainer is gone
    finally:
        reader.close()


def _abandoned(conn: Connection, number: int) -> bool:
    message = conn.recv()
    if message is None:
        raise EOFError
    return message == ("abandon", number)


def _picklable(exc: Exception) -> Exception:
    import pickle
    import traceback

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return LoaderError("".join(traceback.format_exception(exc)))


def main() -> None:
    # Ctrl-C and a TERM sent to the process group are the trainer's to handle: it finishes or
    # releases its task, then closes the loader.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s loader: %(message)s")
    _serve(Connection(int(sys.argv[1])))


if __name__ == "__main__":
    # Run as `python -m streamtrain.trainer.loader`, this file is `__main__`: what it pickles must name
    # the classes of the importable module, which the trainer unpickles.
    from streamtrain.trainer import loader

    loader.main()
