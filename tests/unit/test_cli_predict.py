"""`streamtrain predict`'s record handling, with a stand-in scorer: line numbers, decode errors,
records the model cannot take, base64 for binary, batching."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest

from streamtrain.operations.predict import Predictor
from streamtrain.schemas import Example
from streamtrain.trainer.decoders import make_decoder

GOOD = Example({"ad": (1,)}, (0.5, 0.25), 0.0, 0)


class FakeScorer:
    def __init__(self) -> None:
        self.featurizer = SimpleNamespace(dense_features=2)
        self.calls: list[int] = []

    def score(self, examples):
        self.calls.append(len(examples))
        return np.array([e.dense[0] for e in examples], dtype=np.float32)


def predictor(fmt: str = "json") -> tuple[Predictor, FakeScorer]:
    section = SimpleNamespace(format=fmt, csv_columns=(), fields=None)
    scorer = FakeScorer()
    return Predictor(SimpleNamespace(name="j", input=section), scorer, make_decoder(section)), scorer


def test_one_result_per_record_in_order_with_errors_in_place() -> None:
    p, scorer = predictor()
    short = Example({"ad": (1,)}, (0.5,), 0.0, 0).to_json()
    lines = [GOOD.to_json() + b"\n", b"garbage\n", b"\n", short + b"\n", GOOD.to_json()]
    results = [r.as_dict() for r in p.predict(lines, batch_size=2)]
    assert [r["line"] for r in results] == [1, 2, 4, 5]
    assert results[0] == {"line": 1, "score": 0.5} and results[3] == {"line": 5, "score": 0.5}
    assert set(results[1]) == {"line", "error"} and results[1]["error"]
    assert "dense: 1 features, the model takes 2" in results[2]["error"]
    assert scorer.calls == [1, 1]  # errors are never sent to the model


def test_binary_records_are_read_base64() -> None:
    p, _ = predictor("binary")
    out = [r.as_dict() for r in p.predict([base64.b64encode(GOOD.to_bytes()), b"%%%"])]
    assert out[0] == {"line": 1, "score": 0.5} and "base64" in out[1]["error"]


def test_avro_records_are_read_base64() -> None:
    from streamtrain.schemas.config import JobConfig
    from test_trainer_registered import JOB, R1, V1, Registry, framed

    section = JobConfig.from_toml(JOB.replace('dense = ["price"]', 'dense = ["price", "price"]')).input
    decoder = make_decoder(section, Registry((1, "AVRO", V1)))
    p = Predictor(SimpleNamespace(name="j", input=section), FakeScorer(), decoder)
    out = [r.as_dict() for r in p.predict([base64.b64encode(framed(1, V1, R1))])]
    assert out == [{"line": 1, "score": pytest.approx(0.42)}]
