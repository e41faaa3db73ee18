"""A small typed layer over the etcd v3 client: ranges, transactions, leases.

Every call goes through here so that client errors become `EtcdError` at one boundary and
the rest of jobstate/, the coordination layer the master, the pservers and the trainers share,
reads as operations on keys, not on gRPC messages.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exc
from pyetcd import transactions as tx

from streamtrain.infra import Endpoints
from streamtrain.infra.clients import etcd_client
from streamtrain.jobstate.errors import EtcdError

# etcd's default --max-txn-ops is 128; stay below it with room for the fencing compares.
MAX_TXN_OPS = 120


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


Compare: TypeAlias = tx.BaseCompare
Op: TypeAlias = tx.Put | tx.Delete | tx.Get | tx.Txn
T = TypeVar("T")


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except (etcd_exc.Etcd3Exception, grpc.RpcError) as exc:
        raise EtcdError(f"etcd {what} failed: {exc!r}") from exc
    except ValueError as exc:
        # pyetcd marks its endpoint failed for a while after a timeout (a process frozen past
        # a call's deadline, etcd restarting) and says so with a bare ValueError.
        if "failed node" not in str(exc):
            raise
        raise EtcdError(f"etcd {what} failed: endpoint marked failed after an error") from exc


class Etcd:
    """One connection to etcd, safe to share between threads."""

    def __init__(self, client: pyetcd.Etcd3Client) -> None:
        self._client = client
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._members = len(getattr(client, "endpoints", None) or {}) or 1

    def _read(self, what: str, call: Callable[[], T]) -> T:
        """A read, tried on the next member while members refuse the connection. The client
        moves on after a member fails but raises (infra/clients.py); a caller that reads once,
        as the CLI and a scorer do, was failed by one dead member of a cluster. Reads change
        nothing, so trying them again is safe; writes are not retried here (a transaction that
        reached a member before it died may have applied)."""
        for attempt in range(self._members):
            try:
                with _translated(what):
                    return call()
            except EtcdError as exc:
                if attempt + 1 == self._members or not isinstance(exc.__cause__, etcd_exc.ConnectionFailedError):
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def connect(cls, endpoints: Endpoints, timeout: float = 10.0) -> Etcd:
        with _translated("connect"):
            return cls(etcd_client(endpoints, timeout=timeout))

    def close(self) -> None:
        """Close the connection; leases stop being kept alive (they expire on their TTL)."""
        for lease in list(self._leases):
            lease.stop_keepalive()
        self._client.close()

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        value, meta = self._read(f"get {key}", lambda: self._client.get(key))
        return None if meta is None else _entry(meta, value)

    def range(self, prefix: str, limit: int | None = None, oldest_first: bool = False,
              keys_only: bool = False) -> list[Entry]:
        """Keys under `prefix`, in key order or creation order."""
        kwargs: dict[str, object] = {"keys_only": keys_only}
        if limit:
            kwargs["limit"] = limit
        if oldest_first:
            kwargs.update(sort_order="ascend", sort_target="create")
        return self._read(f"range {prefix}", lambda: [
            _entry(meta, value) for value, meta in self._client.get_prefix(prefix, **kwargs)])

    def count(self, prefix: str) -> int:
        return self._read(f"count {prefix}", lambda: self._client.get_prefix_response(prefix, count_only=True).count)

    def ranges(self, prefixes: Sequence[str]) -> list[list[Entry]]:
        """Several prefixes read in one round trip (a read-only transaction: one revision)."""
        ops = [tx.Get(p, pyetcd.utils.prefix_range_end(p.encode())) for p in prefixes]
        _, responses = self._read("multi-range", lambda: self._client.transaction(compare=[], success=ops, failure=[]))
        return [[_entry(meta, value) for value, meta in resp] for resp in responses]

    def revision(self) -> int:
        """The store's current revision."""
        return self._read("revision", lambda: self._client.get_response("/", count_only=True).header.revision)

    def compact(self, revision: int) -> None:
        """Drop history (superseded values and tombstones) below `revision`."""
        with _translated(f"compact {revision}"):
            try:
                self._client.compact(revision)
            except grpc.RpcError as exc:
                # Someone (auto-compaction, another master) compacted past it already: fine.
                if "compacted" not in str(exc.details() if hasattr(exc, "details") else exc):
                    raise

    # -- writes --------------------------------------------------------------------------
    def txn(self, compare: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> tuple[bool, list]:
        with _translated("txn"):
            return self._client.transaction(compare=list(compare), success=list(success),
                                            failure=list(failure))

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> None:
        with _translated(f"put {key}"):
            self._client.put(key, value, lease=lease.raw if lease else None)

    def delete_prefix(self, prefix: str) -> None:
        with _translated(f"delete {prefix}"):
            self._client.delete_prefix(prefix)

    def lease(self, ttl: int) -> Lease:
        with _translated("lease grant"):
            lease = Lease(self, self._client.lease(ttl), ttl)
        self._leases.add(lease)
        return lease

    def _refresh(self, raw: pyetcd.Lease) -> int:
        with _translated("lease keepalive"):
            responses = list(self._client.refresh_lease(raw.id))
        return responses[0].TTL if responses else 0


class Lease:
    """An etcd lease kept alive by a daemon thread until revoked or lost.

    `lost` is set when a keepalive finds the lease expired (the process was frozen or etcd
    unreachable for longer than the TTL): everything attached to it is gone.
    """

    def __init__(self, etcd: Etcd, raw: pyetcd.Lease, ttl: int) -> None:
        self._etcd = etcd
        self.raw = raw
        self.ttl = ttl
        self.id: int = raw.id
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep_alive(self) -> Lease:
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.id:x}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = max(self.ttl / 3, 0.2)
        while not self._stop.wait(interval):
            try:
                if self._etcd._refresh(self.raw) <= 0:
                    self.lost.set()
                    return
            except EtcdError:
                continue  # a blip; the TTL still covers us until it does not

    def stop_keepalive(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def revoke(self) -> None:
        self._stop.set()
        try:
            with _translated("lease revoke"):
                self.raw.revoke()
        except EtcdError:
            pass  # it expires by itself


# Builders, so callers write etcd.put_op(...) instead of importing the client library.
def put_op(key: str, value: bytes, lease: Lease | None = None) -> tx.Put:
    return tx.Put(key, value, lease.raw if lease else None)


def delete_op(key: str) -> tx.Delete:
    return tx.Delete(key)


def delete_prefix_op(prefix: str) -> tx.Delete:
    return tx.Delete(prefix, pyetcd.utils.prefix_range_end(prefix.encode()))


def txn_op(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> tx.Txn:
    """A transaction nested in another: evaluated on its own, in the same round trip."""
    return tx.Txn(list(compare), list(success), list(failure))


def nested_succeeded(response) -> bool:
    """Whether a nested transaction's compare held, from its response in the outer one."""
    return bool(response.response_txn.succeeded)


def value_is(key: str, value: bytes) -> Compare:
    return tx.Value(key) == value


def mod_revision_is(key: str, revision: int) -> Compare:
    return tx.Mod(key) == revision


def create_revision_is(key: str, revision: int) -> Compare:
    return tx.Create(key) == revision


def absent(key: str) -> Compare:
    return tx.Version(key) == 0


def _entry(meta, value: bytes) -> Entry:
    key = meta.key.decode() if isinstance(meta.key, bytes) else meta.key
    return Entry(key, value or b"", meta.create_revision, meta.mod_revision)
