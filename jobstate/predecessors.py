"""Whether the process that holds a member key or the master lock is known to be gone.

A shard restarted under its index, or a master restarted by its supervisor, would otherwise
wait for its predecessor's lease to end (10 s by default) before it may take the key. When the
holder ran on this machine (same host name, same boot) in the same pid namespace (so its pid
means the same process here; containers sharing a host name do not) and its pid is no longer
alive, it cannot write again, and its successor may delete its key at once. Anything less
certain keeps the wait: a holder on another machine or in another container, one that wrote no
host, boot or namespace, a frozen process (SIGSTOP: still alive), a pid taken again by another
process (looks alive).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from streamtrain.infra.process import pid_alive
from streamtrain.jobstate.etcd import Etcd, create_revision_is, delete_op
from streamtrain.schemas import Holder, SchemaError
from streamtrain.schemas.job import Role

log = logging.getLogger(__name__)

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def this_machine() -> dict[str, str]:
    """What a holder writes of where it runs: host name, boot id and pid namespace ("" where
    unknown)."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {"host": socket.gethostname(), "boot": boot, "pidns": pidns}


def this_holder(role: Role, name: str, address: str | None = None) -> Holder:
    """This process as the holder of a key, from now."""
    machine = this_machine()
    return Holder(role, name, os.getpid(), machine["host"], machine["boot"], machine["pidns"], time.time(), address)


def gone(holder: Holder, here: Mapping[str, str] | None = None, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether `holder` is a process of this machine and pid namespace that no longer runs."""
    here = this_machine() if here is None else here
    same_place = all(here[k] and getattr(holder, k) == here[k] for k in ("host", "boot", "pidns"))
    return same_place and holder.pid > 0 and holder.pid != os.getpid() and not alive(holder.pid)


def remove_if_gone(etcd: Etcd, key: str) -> bool:
    """Delete `key` if its holder is `gone` (and still the same holder: fenced on the key's
    create revision). True if it was deleted."""
    entry = etcd.get(key)
    if entry is None:
        return False
    try:
        holder = Holder.from_json(entry.value)
    except SchemaError:
        return False  # not a holder this version wrote: its lease decides
    if not gone(holder):
        return False
    ok, _ = etcd.txn([create_revision_is(key, entry.create_revision)], [delete_op(key)])
    if ok:
        log.info("%s was held by pid %s of this machine, which is gone: taken over without waiting for "
                 "its lease", key, holder.pid)
    return ok
