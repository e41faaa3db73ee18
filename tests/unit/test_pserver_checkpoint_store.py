"""Checkpoints: exact round trip, atomic publication, pruning, damaged ones skipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain.params.optimizers import Adagrad, Adam
from streamtrain.pserver.checkpoint_store import (
    MANIFEST,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointStore,
    _restore,
    _snapshot,
)
from streamtrain.pserver.state import ShardState
from streamtrain.schemas import DenseSlice, GradientDelta, SparseRows, TaskRecord


def trained(steps: int = 3) -> ShardState:
    state = ShardState(Adam(lr=0.01), average_steps=2)
    rng = np.random.default_rng(0)
    for seq in range(steps):
        ids = np.unique(rng.integers(0, 500, 64).astype(np.uint64))
        state.apply(GradientDelta(TaskRecord.make_id("in", 0, 0), seq, "t", 0, seq, 5,
                                  sparse=(SparseRows("user", ids,
                                                     rng.standard_normal((len(ids), 4)).astype(np.float32)),),
                                  dense=(DenseSlice("fc", 0, 0, rng.standard_normal(6).astype(np.float32)),)))
    return state


def store(tmp_path: Path, keep: int = 3) -> CheckpointStore:
    return CheckpointStore(tmp_path.as_uri(), "job", 1, keep=keep)


def test_round_trip_restores_every_array_dedup_and_offsets(tmp_path: Path) -> None:
    state = trained()
    manifest = store(tmp_path).save(state, {"job.grad.1": 42}, {"in:0": 7}, (1, 3))
    restored = store(tmp_path).load_latest(Adam(lr=0.01))
    assert restored.manifest == manifest and restored.manifest.grad_offsets == {"job.grad.1": 42}
    a, b = state.tables["user"], restored.state.tables["user"]
    ids = a.ids[: a.size]
    ra, rb = a.index.lookup(ids), b.index.lookup(ids)
    for name in ("exp_avg", "exp_avg_sq"):
        assert np.array_equal(a.state[name][ra], b.state[name][rb])
    assert np.array_equal(a.values[ra], b.values[rb]) and np.array_equal(a.steps[ra], b.steps[rb])
    assert b.updates == a.updates == 3  # Adam's clock (params/optimizers.py)
    assert np.array_equal(state.dense[("fc", 0)].values, restored.state.dense[("fc", 0)].values)
    assert np.array_equal(state.dense[("fc", 0)].served(), restored.state.dense[("fc", 0)].served())
    assert not np.array_equal(state.dense[("fc", 0)].served(), state.dense[("fc", 0)].values)
    assert restored.state.dedup.to_json() == state.dedup.to_json()
    assert restored.state.examples == state.examples


def test_a_checkpoint_without_its_manifest_is_ignored(tmp_path: Path) -> None:
    s = store(tmp_path)
    first = s.save(trained(1), {"g": 1}, {}, ())
    second = s.save(trained(2), {"g": 2}, {}, ())
    (tmp_path / "shard-1" / second.checkpoint_id / MANIFEST).unlink()  # died before publishing
    assert s.load_latest(Adam(lr=0.01)).manifest.checkpoint_id == first.checkpoint_id


def test_a_damaged_file_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    s = store(tmp_path)
    first = s.save(trained(1), {"g": 1}, {}, ())
    second = s.save(trained(2), {"g": 2}, {}, ())
    victim = tmp_path / "shard-1" / second.checkpoint_id / "dedup.json"
    victim.write_bytes(b"{}")
    assert s.load_latest(Adam(lr=0.01)).manifest.checkpoint_id == first.checkpoint_id


def test_only_the_newest_k_are_kept(tmp_path: Path) -> None:
    s = store(tmp_path, keep=2)
    ids = [s.save(trained(1), {"g": i}, {}, ()).checkpoint_id for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "shard-1").iterdir()) == ids[2:]


def test_the_rollback_target_is_kept_however_many_come_after(tmp_path: Path) -> None:
    s = store(tmp_path, keep=2)
    target = s.save(trained(1), {"g": 0}, {}, ()).checkpoint_id
    ids = [s.save(trained(1), {"g": i}, {}, (), keep_also=[target]).checkpoint_id for i in range(1, 5)]
    assert s.complete_ids() == [target, *ids[-2:]]


def test_checkpoints_newer_than_a_rollback_target_are_retired_complete_or_not(tmp_path: Path) -> None:
    s = store(tmp_path, keep=5)
    ids = [s.save(trained(1), {"g": i}, {}, ()).checkpoint_id for i in range(3)]
    (tmp_path / "shard-1" / f"{int(ids[-1]) + 1:020d}").mkdir()  # one being written when a shard died
    assert s.retire_after(ids[0]) == [ids[1], ids[2], f"{int(ids[-1]) + 1:020d}"]
    assert s.complete_ids() == ids[:1] and s.load_latest(Adam(lr=0.01)).manifest.checkpoint_id == ids[0]


def test_nothing_to_load_is_none_and_a_changed_optimizer_is_refused(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.load_latest(Adam(lr=0.01)) is None
    s.save(trained(1), {"g": 1}, {}, ())
    with pytest.raises(CheckpointMismatchError, match="adam"):
        s.load_latest(Adagrad(lr=0.01))


def test_a_checkpoint_of_other_slots_than_the_shard_owns_now_is_refused(tmp_path: Path) -> None:
    """Loaded, a checkpoint of other slots would serve the rows of slots moved away twice and
    those moved in never: at start and at a rollback alike, the shard refuses it."""
    s = store(tmp_path)
    checkpoint_id = s.save(trained(1), {"g": 1}, {}, (0, 2, 4), epoch=3).checkpoint_id
    loaded = s.load(checkpoint_id, Adam(lr=0.01), (0, 2, 4)).manifest
    assert (loaded.slots, loaded.epoch) == ((0, 2, 4), 3)
    assert s.load_latest(Adam(lr=0.01)) is not None  # not checked without the slots
    with pytest.raises(CheckpointMismatchError, match=r"holds the parameters of 3 slots \(0, 2, 4\) \(slot map "
                                                      r"epoch 3\), but the job's slot map now gives this shard 2 "
                                                      r"slots \(0, 2\)"):
        s.load(checkpoint_id, Adam(lr=0.01), (0, 2))
    with pytest.raises(CheckpointMismatchError, match="another slot map"):
        s.load_latest(Adam(lr=0.01), (1, 3, 5))


def test_at_start_a_newer_checkpoint_of_the_old_slots_is_passed_over_for_one_of_the_shards_own(tmp_path) -> None:
    """A resize writes the shard's checkpoint of its new slots; a checkpoint the shard took
    under the old map before the resize's rollback reached it is newer, and not its own."""
    s = store(tmp_path)
    resized = s.save(trained(1), {"g": 1}, {}, (0, 3)).checkpoint_id
    s.save(trained(2), {"g": 2}, {}, (0, 2))  # the old map's, taken meanwhile
    assert s.load_latest(Adam(lr=0.01), (0, 3)).manifest.checkpoint_id == resized


def test_unsupported_uri_is_a_clear_error() -> None:
    with pytest.raises(CheckpointError, match="checkpoint_uri"):
        CheckpointStore("nosuchscheme://x", "job", 0)


def test_a_checkpoint_from_before_the_served_average_serves_its_values_until_the_next_step() -> None:
    files = _snapshot(trained())
    restored = _restore({name: blob for name, blob in files.items() if not name.endswith(".average.npy")},
                        Adam(lr=0.01))
    block = restored.dense[("fc", 0)]
    assert block.average is None and np.array_equal(block.served(), block.values)
