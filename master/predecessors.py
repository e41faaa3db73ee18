"""Whether the process that holds a member key or the master lock is known to be gone.

A shard restarted under its index, or a master restarted by its supervisor, would otherwise
wait for its predecessor's lease to end (10 s by default) before it may take the key. When the
holder ran on this machine (same host name and same boot) and its pid is no longer alive, it
cannot write again, and its successor may delete its key at once. Anything less certain keeps
the wait: a holder on another machine, one that wrote no host or boot, a frozen process
(SIGSTOP: still alive), a pid taken again by another process (looks alive).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Mapping

from infra.process import pid_alive
from master.etcd import Etcd, create_revision_is, delete_op

log = logging.getLogger(__name__)

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def this_machine() -> dict[str, str]:
    """What a holder writes of where it runs: host name and boot id ("" where unknown)."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return {"host": socket.gethostname(), "boot": boot}


def gone(holder: Mapping[str, object], here: Mapping[str, str] | None = None,
         alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether `holder` (what the key's holder wrote: host, boot, pid) is a process of this
    machine that no longer runs."""
    here = this_machine() if here is None else here
    pid = holder.get("pid")
    return (bool(here["boot"]) and holder.get("host") == here["host"] and holder.get("boot") == here["boot"]
            and isinstance(pid, int) and pid > 0 and pid != os.getpid() and not alive(pid))


def remove_if_gone(etcd: Etcd, key: str) -> bool:
    """Delete `key` if its holder is `gone` (and still the same holder: fenced on the key's
    create revision). True if it was deleted."""
    entry = etcd.get(key)
    if entry is None:
        return False
    try:
        holder = json.loads(entry.value)
    except ValueError:
        return False
    if not isinstance(holder, dict) or not gone(holder):
        return False
    ok, _ = etcd.txn([create_revision_is(key, entry.create_revision)], [delete_op(key)])
    if ok:
        log.info("%s was held by pid %s of this machine, which is gone: taken over without waiting for "
                 "its lease", key, holder.get("pid"))
    return ok
