"""How a task whose training raised ends, when a trainer heartbeats (`trainer.policy`), and
what one commit takes (`trainer.committer.one_commit`)."""

from __future__ import annotations

import pytest
import redis
from confluent_kafka import KafkaException

from streamtrain.infra.schema_registry import RegistryUnavailableError
from streamtrain.jobstate.errors import EtcdError, TaskLostError
from streamtrain.params.paramstore import ParamsUnavailableError
from streamtrain.trainer.committer import one_commit
from streamtrain.trainer.delivery import DeliveryBroken, DeliveryError
from streamtrain.trainer.loader import LoaderDiedTwiceError, LoaderError
from streamtrain.trainer.policy import (
    ETCD_AWAY_S,
    KAFKA_AWAY_S,
    REGISTRY_AWAY_S,
    Stopped,
    TaskEnd,
    group_size,
    heartbeat_due,
    task_end,
)
from streamtrain.trainer.reader import RangeReadError


@pytest.mark.parametrize("exc, end", [
    (Stopped(), TaskEnd("released")),  # given back at once, no attempt counted
    (ParamsUnavailableError([1], retry_after=0.7), TaskEnd("released", 0.7, "giving the task back")),
    (RegistryUnavailableError("registry away"), TaskEnd("released", REGISTRY_AWAY_S, "giving the task back")),
    (TaskLostError("claimed by another"), TaskEnd("lost")),  # not ours: nothing to give back
    (EtcdError("etcd away"), TaskEnd("lost", ETCD_AWAY_S, "dropping the task in hand")),
    # The broker away: no attempt counted, or its restarts would use tasks' attempts up.
    # Behind the tasks waiting: only its partition may be away, and first in line it would hold
    # up every trainer in turn.
    (RangeReadError("no progress for 30 s"), TaskEnd("released", KAFKA_AWAY_S, "giving the task back", behind=True)),
    (DeliveryError("unacknowledged after 30 s"), TaskEnd("released", KAFKA_AWAY_S, "giving the task back",
                                                         behind=True)),
    # What every attempt would meet again: an attempt counted, so the task ends in failed.
    (DeliveryError("too large", refused=True), TaskEnd("failed", 0.0, "failing the task")),
    (LoaderDiedTwiceError("died twice reading t:0 from offset 7"), TaskEnd("failed", 0.0, "failing the task")),
], ids=lambda v: f"{type(v).__name__}{'-refused' if getattr(v, 'refused', False) else ''}")
def test_each_error_ends_the_task_its_own_way(exc, end) -> None:
    assert task_end(exc) == end


def test_an_error_about_the_trainer_or_its_services_stops_it_and_counts_no_attempt() -> None:
    assert task_end(LoaderError("the decoder factory raised")) is None
    assert task_end(DeliveryBroken("fatal producer error")) is None
    assert task_end(redis.ConnectionError("Connection refused")) is None
    assert task_end(KafkaException("transport failure")) is None
    assert task_end(BrokenPipeError()) is None


def test_any_other_error_training_the_task_fails_it_then_stops_the_trainer() -> None:
    """A task that makes training raise (an id out of a table, a shape the model refuses, too
    large for memory) would otherwise be retried forever: a lost holder counts no attempt."""
    for exc in (IndexError("index out of range in self"), RuntimeError("shape mismatch"), MemoryError()):
        assert task_end(exc) == TaskEnd("failed", 0.0, "failing the task; the trainer stops", stops=True)


def test_a_task_is_heartbeaten_every_third_of_its_timeout() -> None:
    assert not heartbeat_due(9.9, 30.0)
    assert heartbeat_due(10.1, 30.0)


def test_one_commit_takes_the_pushes_up_to_and_including_the_first_task_end() -> None:
    assert one_commit([False, False, True, False, True]) == 3
    assert one_commit([True, False]) == 1
    assert one_commit([False, False]) == 2  # pushes alone: all of them
    assert one_commit([]) == 0


@pytest.mark.parametrize("push_every, live, size", [
    ("auto", 0, 4),  # this trainer's own registration not seen yet: it is one
    ("auto", 1, 4),
    ("auto", 2, 4),  # two trainers: 8 mini-batches in flight at once
    ("auto", 3, 2),
    ("auto", 4, 2),
    ("auto", 5, 1),
    ("auto", 100, 1),  # never fewer than one
    (3, 1, 3),  # as set, whatever the trainers
    (1, 100, 1),
])
def test_a_push_holds_the_set_mini_batches_or_about_eight_among_the_live_trainers(push_every, live, size):
    assert group_size(push_every, live) == size


class ScriptedTasks:
    """A task client whose completions go as scripted: "ok", "away" (etcd did not answer),
    "applied-away" (applied, but the reply was lost) or "taken" (the compare failed)."""

    def __init__(self, *script: str) -> None:
        self.script, self.done, self.tries = list(script), False, 0

    def complete(self, task) -> None:
        self.tries += 1
        outcome = self.script.pop(0)
        if outcome in ("ok", "applied-away"):
            self.done = True
        if outcome in ("away", "applied-away"):
            raise EtcdError("etcd txn failed: ConnectionFailedError()")
        if outcome == "taken":
            raise TaskLostError("no longer held")

    def completed(self, task) -> bool:
        return self.done


@pytest.mark.parametrize("script, outcome", [
    (("ok",), None),
    (("away", "away", "ok"), None),  # etcd back after a leader's election: done, not dropped
    (("applied-away", "taken"), None),  # the lost reply had applied: done
    (("away",) * 5, EtcdError),  # etcd away for good: dropped, it times out
    (("taken",), TaskLostError),  # requeued meanwhile: not ours
    (("away", "taken"), TaskLostError),
])
def test_a_completion_etcd_did_not_answer_is_tried_again_and_told_apart_from_a_lost_task(
        monkeypatch, script, outcome) -> None:
    import streamtrain.trainer.committer as committer

    monkeypatch.setattr(committer, "COMPLETE_RETRY_S", (0.0,) * 4)  # five tries
    tasks = ScriptedTasks(*script)
    running = committer.Committer(None, tasks, lambda ended: None)
    try:
        if outcome is None:
            running._complete(object())
        else:
            with pytest.raises(outcome):
                running._complete(object())
    finally:
        running.close()
    assert tasks.tries == len(script)
