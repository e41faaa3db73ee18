import json

import pytest

from streamtrain.producers.joinstate import JoinState
from streamtrain.schemas import ImpressionRecord, JoinWaiting, SchemaError


def _imp(i: str, ts: int) -> ImpressionRecord:
    return ImpressionRecord(i, ts, {"ad": (3,)}, (0.5,))


def _labels(emits):
    return {e.impression_id: e.example.label for e in emits}


def test_a_click_inside_the_window_makes_label_1_at_once():
    state = JoinState(window_ms=1000, grace_ms=100)
    state.on_impression(_imp("a", 10_000), 0)
    emits, changes = state.on_click("a", 10_900, 0)
    assert _labels(emits) == {"a": 1.0}
    assert [(c.impression_id, c.waiting) for c in changes] == [("a", None)]
    assert state.expire(10**9) == ([], [])  # nothing left to close


def test_no_click_closes_with_label_0_once_event_time_passes_window_and_grace():
    state = JoinState(window_ms=1000, grace_ms=100)
    state.on_impression(_imp("a", 10_000), 0)
    assert state.expire(11_100) == ([], [])
    emits, changes = state.expire(11_101)
    assert _labels(emits) == {"a": 0.0} and changes[0].waiting is None


def test_a_click_before_its_impression_waits_for_it_and_a_late_one_makes_label_0():
    state = JoinState(window_ms=1000, grace_ms=0)
    state.on_click("early", 10_500, 1)
    assert _labels(state.on_impression(_imp("early", 10_000), 1)[0]) == {"early": 1.0}
    state.on_impression(_imp("late", 10_000), 1)
    assert _labels(state.on_click("late", 11_001, 1)[0]) == {"late": 0.0}


def test_orphan_and_repeated_clicks_are_dropped_and_never_emit():
    state = JoinState(window_ms=1000, grace_ms=0)
    state.on_impression(_imp("a", 0), 0)
    state.on_click("a", 10, 0)
    state.on_click("a", 20, 0)  # a repeat after the impression was labelled
    emits, _ = state.expire(10**6)
    assert emits == [] and state.counters.clicks_dropped == 1


def test_state_rebuilt_from_the_changelog_gives_the_same_outcome():
    live = JoinState(window_ms=1000, grace_ms=0)
    log = []
    for imp in (_imp("a", 0), _imp("b", 5), _imp("c", 7)):
        log += live.on_impression(imp, 0)[1]
    log += live.on_click("b", 100, 0)[1]
    rebuilt = JoinState(window_ms=1000, grace_ms=0)
    for change in log:  # as the changelog stores it: JSON, last value per key wins
        rebuilt.restore(change.impression_id, None if change.waiting is None
                        else JoinWaiting.from_json(change.waiting.to_json()))
    assert set(rebuilt.waiting) == {"a", "c"}
    assert _labels(rebuilt.expire(10**6)[0]) == _labels(live.expire(10**6)[0]) == {"a": 0.0, "c": 0.0}


def test_a_changelog_record_of_another_version_is_refused_naming_the_version() -> None:
    live = JoinState(window_ms=1000, grace_ms=0)
    (change,) = live.on_impression(_imp("a", 0), 0)[1]
    newer = {**json.loads(change.waiting.to_json()), "v": 2}
    with pytest.raises(SchemaError) as caught:
        JoinWaiting.from_json(json.dumps(newer))
    assert (caught.value.format, caught.value.field) == ("JoinWaiting", "v")
    assert "unknown version 2" in str(caught.value)
