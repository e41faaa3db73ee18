"""Trainer pieces without services: decoders, features, AUC, gradient split, models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from master.config import JobConfig
from pserver.sharding import SlotMap
from schemas import Example
from trainer.decoders import DecodeError, make_decoder
from trainer.features import FeatureError, Featurizer, pool
from trainer.metrics import auc
from trainer.models import DeepFM, LogisticRegression, ModelSpec, WideDeep
from trainer.params import DenseLayout, GradientBuffer


def config(**input_section) -> JobConfig:
    lines = ['[job]\nname = "j"\n[input]\ntopics = ["t"]']
    for k, v in input_section.items():
        lines.append(f"{k} = {v}")
    return JobConfig.from_toml("\n".join(lines))


EXAMPLE = Example({"user": (3,), "ad": (7, 8)}, (0.5, -1.0), 1.0, 123)


def test_json_and_binary_decoders_round_trip_and_name_what_is_wrong() -> None:
    assert make_decoder(config().input)(EXAMPLE.to_json()) == EXAMPLE
    assert make_decoder(config(format='"binary"').input)(EXAMPLE.to_bytes()) == EXAMPLE
    with pytest.raises(DecodeError, match="JSON|json"):
        make_decoder(config().input)(b'{"v":1,')
    with pytest.raises(DecodeError, match="tombstone"):
        make_decoder(config().input)(None)


def test_csv_decoder_follows_the_declared_columns() -> None:
    decode = make_decoder(config(format='"csv"', csv_columns='["y:label", "user:sparse", "os:sparse", "price:dense", "ts:time"]').input)
    example = decode(b"1,42|43,ios,2.5,99\n")
    assert example.label == 1.0 and example.dense == (2.5,) and example.event_time_ms == 99
    assert example.sparse["user"] == (42, 43) and len(example.sparse["os"]) == 1
    with pytest.raises(DecodeError, match="5"):
        decode(b"1,2,3")
    with pytest.raises(DecodeError, match="price"):
        decode(b"1,2,ios,cheap,5")


def test_featurizer_hashes_per_field_and_bags_per_example_and_field() -> None:
    f = Featurizer(("user", "ad"), 2, 1 << 20)
    batch = f.batch([EXAMPLE, Example({"ad": (3,)}, (0.0, 0.0), 0.0, 0)])
    assert batch.ids.shape == (4,) and batch.bags.tolist() == [0, 1, 1, 3]
    assert batch.ids[0] != batch.ids[3]  # id 3 in "user" and in "ad" are different features
    assert (batch.ids < (1 << 20)).all()
    with pytest.raises(FeatureError, match="dense"):
        f.check(Example({}, (1.0,), 0.0, 0))
    rows = torch.arange(8, dtype=torch.float32).view(4, 2)
    pooled = pool(rows, torch.tensor([0, 1, 2, 3]), torch.from_numpy(batch.bags), 2, 2)
    assert pooled.shape == (2, 2, 2) and pooled[0, 1].tolist() == [6.0, 8.0]


def test_auc_matches_the_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 10, 300).astype(float)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert auc(labels, scores) == pytest.approx(pairwise)
    assert auc(np.ones(3), np.arange(3)) is None


def test_gradient_buffer_sums_rows_and_sends_one_delta_per_shard() -> None:
    slot_map = SlotMap.uniform(128, 3)
    model = LogisticRegression(ModelSpec(("a",), 2, 4))
    layout = DenseLayout(model)
    layout.load({})
    model.bias.grad = torch.ones(1)
    buffer = GradientBuffer(slot_map, 3)
    buffer.add_rows("lr", np.array([1, 2], dtype=np.uint64), np.ones((2, 1), dtype=np.float32))
    buffer.add_rows("lr", np.array([2, 9], dtype=np.uint64), np.ones((2, 1), dtype=np.float32))
    deltas = buffer.deltas(layout, "t:0:00000000000000000000", 4, "tr", 7, 32)
    assert [d.shard for d in deltas] == [0, 1, 2] and all(d.examples == 32 and d.seq == 4 for d in deltas)
    rows = {int(i): float(g[0]) for d in deltas for part in d.sparse for i, g in zip(part.ids, part.values)}
    assert rows == {1: 1.0, 2: 2.0, 9: 1.0}
    assert sum(len(d.dense) for d in deltas) == 1


@pytest.mark.parametrize("cls", [LogisticRegression, WideDeep, DeepFM])
def test_built_in_models_give_one_logit_per_example(cls) -> None:
    spec = ModelSpec(("a", "b", "c"), 2, 4)
    model = cls(spec)
    pooled = {name: torch.randn(5, 3, dim) for name, dim in model.tables.items()}
    assert model(pooled, torch.randn(5, 2)).shape == (5,)
