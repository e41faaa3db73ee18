"""A task's report on `<job>.metrics` (schemas/report.py)."""

from __future__ import annotations

import json

import pytest

from streamtrain.schemas import SchemaError, TaskReport


def test_a_task_report_round_trips_and_names_a_bad_field() -> None:
    report = TaskReport("clicks:0:00000000000000000512", "t-0", 1, 512, 3, 130, 0.45, 0.77, 0.1, 0.5, 0.05,
                        10.0, 11.5, 9_000)
    assert TaskReport.from_json(report.to_json()) == report
    empty = TaskReport("clicks:1:00000000000000000000", "t-0", 0, 0, 2, 0, None, None, 0.0, 0.0, 0.0, 1.0, 1.0)
    assert TaskReport.from_json(empty.to_json()) == empty
    doc = json.loads(report.to_json())
    for key, value in (("auc", 1.5), ("examples", -1), ("loss", "low")):
        with pytest.raises(SchemaError) as caught:
            TaskReport.from_json(json.dumps({**doc, key: value}))
        assert caught.value.field == key, caught.value
