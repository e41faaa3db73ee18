"""Errors of the job's coordination, raised to the master and its clients (trainers, pservers).
Callers never catch etcd's."""

from streamtrain.schemas import StreamtrainError


class CoordinationError(StreamtrainError, RuntimeError):
    """Root of the errors of the job's coordination: etcd, the lock, tasks, membership."""


class EtcdError(CoordinationError):
    """etcd could not be reached or refused a request (translated from the client library)."""


class NotLeaderError(CoordinationError):
    """A fenced write found the lock held by someone else: this master must stop writing and
    exit; a standby has taken over."""


class TaskLostError(CoordinationError):
    """The task is no longer held by this attempt (it timed out and was requeued, or completed
    by another attempt); the caller must drop it without completing."""


class NoFreeIndexError(CoordinationError):
    """Every pserver index below ps_desired is taken."""


class LayoutChangedError(CoordinationError):
    """The job file's `pservers.count` or `pservers.slots` disagrees with the slot map the job
    already has in etcd: its parameters live where that map says, so a master refuses to lead
    rather than let shards and trainers disagree on who owns what."""
