"""The master lock: one active master per job, every write fenced on the lock's identity.

The lock key holds a lease. Acquiring it means creating the key while it is absent; the key's
create revision then identifies this tenure, and every master write is a transaction that
compares it. A master frozen past its lease (GC pause, SIGSTOP, partition) therefore cannot
write after resuming, whatever its clock says: etcd rejects the compare, the master raises
`NotLeaderError` and exits to be restarted as a standby. A lease alone does not fence: the
holder judges whether its lease is still live by its own clock, which stops when the process
does, so the check has to be etcd's, inside each write's transaction.
"""

from __future__ import annotations

import logging
import threading

from pyetcd import transactions as tx

from streamtrain.jobstate.errors import EtcdError, NotLeaderError
from streamtrain.jobstate.etcd import (
    Compare,
    Etcd,
    Lease,
    Op,
    absent,
    create_revision_is,
    nested_succeeded,
    put_op,
    txn_op,
)
from streamtrain.jobstate.predecessors import remove_if_gone

log = logging.getLogger(__name__)


class LeaderLock:
    def __init__(self, etcd: Etcd, key: str, ttl_s: int, identity: bytes) -> None:
        self._etcd = etcd
        self.key = key
        self.ttl_s = ttl_s
        self.identity = identity
        self.revision: int | None = None
        self._lease: Lease | None = None

    def acquire(self, stop: threading.Event) -> bool:
        """Block as a standby until the lock is ours (True) or `stop` is set (False)."""
        waited = False
        while not stop.is_set():
            lease = self._etcd.lease(self.ttl_s)
            ok, responses = self._etcd.txn(
                compare=[absent(self.key)],
                success=[put_op(self.key, self.identity, lease), tx.Get(self.key)],
            )
            if ok:
                _value, meta = responses[1][0]
                self.revision = meta.create_revision
                self._lease = lease.keep_alive()
                log.info("became leader of %s (revision %d)", self.key, self.revision)
                return True
            lease.revoke()
            if not waited:
                holder = self._etcd.get(self.key)
                log.info("standby: %s is held by %s", self.key,
                         holder.value.decode(errors="replace") if holder else "?")
                waited = True
            # Polling, not a watch: a watch must be re-established after every etcd hiccup,
            # and a quarter of the TTL is well inside the takeover promise.
            # A holder known dead (a process of this machine that no longer runs) is not
            # waited out: it cannot write again.
            while not stop.is_set() and self._etcd.get(self.key) is not None and \
                    not remove_if_gone(self._etcd, self.key):
                stop.wait(max(self.ttl_s / 4, 0.1))
        return False

    def fence(self) -> Compare:
        """The compare every master write carries."""
        if self.revision is None:
            raise NotLeaderError(f"{self.key} was never acquired")
        return create_revision_is(self.key, self.revision)

    def check(self) -> None:
        """Raise if the lease is known lost; writes are fenced regardless."""
        if self._lease is None or self._lease.lost.is_set():
            raise NotLeaderError(f"lease of {self.key} expired")

    def write(self, ops: list[Op]) -> None:
        """`ops` in one transaction fenced on the lock; NotLeaderError if it is no longer ours."""
        if not ops:
            return
        ok, _ = self._etcd.txn([self.fence()], ops)
        if not ok:
            raise NotLeaderError(f"{self.key} is no longer ours; stopping")

    def write_if(self, compare: list[Compare], ops: list[Op]) -> bool:
        """Fenced on the lock, then conditional on `compare`, in one round trip. Returns whether
        the inner condition held (False: a trainer got there first)."""
        ok, responses = self._etcd.txn([self.fence()], [txn_op(compare, ops)])
        if not ok:
            raise NotLeaderError(f"{self.key} is no longer ours; stopping")
        return nested_succeeded(responses[0])

    def release(self) -> None:
        if self.revision is None:
            return
        try:
            self._etcd.txn([self.fence()], [tx.Delete(self.key)])
        except EtcdError as exc:  # etcd away: the lease ends the lock by itself
            log.warning("releasing %s failed: %s; its lease will end it", self.key, exc)
        finally:
            if self._lease is not None:
                self._lease.revoke()
            self.revision = None
