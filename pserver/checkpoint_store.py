"""Shard checkpoints through pyarrow's filesystem layer: a local directory by default, any URI
pyarrow supports (s3://, hdfs://, gs://) by config.

Layout under `<checkpoint_uri>/shard-<i>/<checkpoint_id>/`: one .npy file per array (ids,
values, steps and every optimizer state array of each table; dense blocks and their served averages), `index.json` (each
table's width and update count), `dedup.json`, `examples.json` (examples applied per task and partition), and
`MANIFEST.json` written last with every file's size and sha256. A checkpoint counts only once
its manifest exists and its files match it, so a crash mid-write leaves an ignored directory,
never a torn checkpoint. Older checkpoints are deleted only after the new manifest is written
(Paddle's pserver deleted first; we do not). Ids sort by time, so the newest complete one wins.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from streamtrain.jobstate.job_checkpoints import new_checkpoint_id
from streamtrain.params.optimizers import UpdateRule
from streamtrain.params.rows import RowTable
from streamtrain.pserver.dedup import Dedup
from streamtrain.pserver.state import DenseBlock, ShardState
from streamtrain.schemas import (
    CheckpointManifest,
    ExampleCounts,
    FileEntry,
    SavedBlock,
    SavedTable,
    SchemaError,
    StateIndex,
    StreamtrainError,
)

MANIFEST = "MANIFEST.json"


class CheckpointError(StreamtrainError, RuntimeError):
    """A checkpoint could not be written, or none that exists is readable."""


class CheckpointMismatchError(CheckpointError):
    """The newest checkpoint was written for another optimizer or another slot map: starting
    fresh would silently throw the trained parameters away, so the shard refuses to start."""


class SlotsMismatchError(CheckpointMismatchError):
    """The checkpoint holds other slots than the shard owns now."""


def _slots_text(slots: tuple[int, ...]) -> str:
    shown = ", ".join(str(s) for s in slots[:4])
    return f"{len(slots)} slots ({shown}{', ...' if len(slots) > 4 else ''})"


@dataclass(frozen=True)
class Restored:
    state: ShardState
    manifest: CheckpointManifest


class CheckpointStore:
    def __init__(self, uri: str, job: str, shard: int, keep: int = 3) -> None:
        try:
            self.fs, root = pafs.FileSystem.from_uri(uri)
            self.uri = uri
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"checkpoint_uri {uri!r}: {exc}") from exc
        self.root = f"{root.rstrip('/')}/shard-{shard}"
        self.job, self.shard, self.keep = job, shard, keep

    # -- writing -------------------------------------------------------------------------
    def save(self, state: ShardState, grad_offsets: dict[str, int], input_watermarks: dict[str, int],
             slots: tuple[int, ...], checkpoint_id: str | None = None, keep_also: Collection[str] = (),
             *, epoch: int = 0, published: tuple[int, int] = (0, 0)) -> CheckpointManifest:
        """Write a checkpoint of the shard's `slots` under slot map `epoch`; `checkpoint_id`
        names a job-wide one every shard writes on request (ids must sort by time: the newest
        complete one is loaded on restart). Only the newest `keep` are kept, and those in
        `keep_also` (the job's rollback target). `published`: the manifest's
        (`published_epoch`, `published_round`)."""
        checkpoint_id = checkpoint_id or new_checkpoint_id()
        directory = f"{self.root}/{checkpoint_id}"
        self.fs.create_dir(directory, recursive=True)
        files = [self._write(directory, name, blob) for name, blob in _snapshot(state).items()]
        manifest = CheckpointManifest(checkpoint_id, self.job, self.shard, time.time(), state.rule.name,
                                      tuple(files), grad_offsets, input_watermarks, slots, epoch, *published)
        self._write(directory, MANIFEST + ".tmp", manifest.to_json())
        # The rename is the commit point (atomic on local and HDFS filesystems; object stores
        # have no partial objects, so a missing manifest is the only failure they show).
        self.fs.move(f"{directory}/{MANIFEST}.tmp", f"{directory}/{MANIFEST}")
        self._prune(keep_also)
        return manifest

    def _write(self, directory: str, name: str, blob: bytes) -> FileEntry:
        with self.fs.open_output_stream(f"{directory}/{name}") as out:
            out.write(blob)
        return FileEntry(name, len(blob), hashlib.sha256(blob).hexdigest())

    def _prune(self, keep_also: Collection[str]) -> None:
        complete = self.complete_ids()
        for old in complete[: max(0, len(complete) - self.keep)]:
            if old not in keep_also:
                self.fs.delete_dir(f"{self.root}/{old}")

    def retire_after(self, checkpoint_id: str) -> list[str]:
        """Delete every checkpoint newer than `checkpoint_id`, complete or not: after a rollback
        to it they hold a timeline the job abandoned, and a restart must never load one."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError as exc:
            raise CheckpointError(f"cannot list {self.root}: {exc}") from exc
        newer = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name > checkpoint_id)
        for old in newer:
            self.fs.delete_dir(f"{self.root}/{old}")
        return newer

    # -- reading -------------------------------------------------------------------------
    def complete_ids(self) -> list[str]:
        """Ids of the checkpoints with a manifest, oldest first."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError as exc:
            raise CheckpointError(f"cannot list {self.root}: {exc}") from exc
        ids = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
        return [c for c in ids
                if self.fs.get_file_info(f"{self.root}/{c}/{MANIFEST}").type == pafs.FileType.File]

    def load_latest(self, rule: UpdateRule, slots: tuple[int, ...] | None = None) -> Restored | None:
        """The newest checkpoint whose files match its manifest and that holds `slots`; None
        if there is none yet. One of other slots is passed over (a shard of a job being resized
        may have checkpointed under the old map after the resized checkpoint was written, which
        the resize's rollback retires), but if there are only such, that is refused."""
        other_slots: SlotsMismatchError | None = None
        for checkpoint_id in reversed(self.complete_ids()):
            try:
                return self.load(checkpoint_id, rule, slots)
            except SlotsMismatchError as exc:
                other_slots = other_slots or exc
            except CheckpointMismatchError:
                raise
            except (CheckpointError, SchemaError, OSError, ValueError):
                continue  # damaged: fall back to the one before
        if other_slots is not None:
            raise other_slots
        return None

    def load(self, checkpoint_id: str, rule: UpdateRule, slots: tuple[int, ...] | None = None) -> Restored:
        """One checkpoint by id; `slots`: those the shard owns now, which the checkpoint must
        hold (None: not checked). Raises CheckpointError (or SchemaError, OSError) if
        unreadable, CheckpointMismatchError if written for another optimizer or other slots."""
        directory = f"{self.root}/{checkpoint_id}"
        manifest = CheckpointManifest.from_json(self._read(f"{directory}/{MANIFEST}"))
        if manifest.optimizer != rule.name:
            raise CheckpointMismatchError(
                f"checkpoint {checkpoint_id} of shard {self.shard} was written by optimizer "
                f"{manifest.optimizer!r}; the job now uses {rule.name!r}")
        if slots is not None and tuple(manifest.slots) != tuple(slots):
            # Its rows of slots moved away would be served twice, those of slots moved in never.
            raise SlotsMismatchError(
                f"checkpoint {checkpoint_id} of shard {self.shard} holds the parameters of "
                f"{_slots_text(manifest.slots)} (slot map epoch {manifest.epoch}), but the job's slot map now "
                f"gives this shard {_slots_text(slots)}: a checkpoint taken under another slot map cannot be loaded")
        blobs = {}
        for entry in manifest.files:
            blob = self._read(f"{directory}/{entry.path}")
            if len(blob) != entry.size or hashlib.sha256(blob).hexdigest() != entry.sha256:
                raise CheckpointError(f"{directory}/{entry.path} does not match its manifest")
            blobs[entry.path] = blob
        return Restored(_restore(blobs, rule), manifest)

    def _read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _load_npy(blob: bytes) -> np.ndarray:
    return np.load(io.BytesIO(blob), allow_pickle=False)


def _snapshot(state: ShardState) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    tables, dense_blocks = [], []
    for t, (name, table) in enumerate(sorted(state.tables.items())):
        n = table.size
        tables.append(SavedTable(name, table.dim, f"table{t}", table.updates))
        files[f"table{t}.ids.npy"] = _npy(table.ids[:n])
        files[f"table{t}.values.npy"] = _npy(table.values[:n])
        files[f"table{t}.steps.npy"] = _npy(table.steps[:n])
        for s, arr in table.state.items():
            files[f"table{t}.state.{s}.npy"] = _npy(arr[:n])
    for b, ((param, block), dense) in enumerate(sorted(state.dense.items())):
        dense_blocks.append(SavedBlock(param, block, f"dense{b}"))
        files[f"dense{b}.values.npy"] = _npy(dense.values)
        files[f"dense{b}.steps.npy"] = _npy(dense.steps)
        files[f"dense{b}.average.npy"] = _npy(dense.served())
        for s, arr in dense.state.items():
            files[f"dense{b}.state.{s}.npy"] = _npy(arr)
    files["dedup.json"] = state.dedup.to_json()
    files["examples.json"] = ExampleCounts(dict(state.examples), dict(state.examples_folded)).to_json()
    files["index.json"] = StateIndex(tuple(tables), tuple(dense_blocks)).to_json()
    return files


def _restore(blobs: dict[str, bytes], rule: UpdateRule) -> ShardState:
    index = StateIndex.from_json(blobs["index.json"])
    state = ShardState(rule)
    for meta in index.tables:
        f = meta.file
        ids = _load_npy(blobs[f"{f}.ids.npy"])
        table = RowTable(meta.name, meta.dim, rule.state_names, state.init_scale, capacity=max(len(ids), 16))
        rows = table.rows_for(ids)  # same ids -> rows 0..n-1 in order
        table.values[rows] = _load_npy(blobs[f"{f}.values.npy"])
        table.steps[rows] = _load_npy(blobs[f"{f}.steps.npy"])
        # Checkpoints from before the table clock: its rows' most updates is the closest bound.
        table.updates = meta.updates if meta.updates is not None else int(table.steps[:len(ids)].max(initial=0))
        for s in rule.state_names:
            table.state[s][rows] = _load_npy(blobs[f"{f}.state.{s}.npy"])
        state.tables[meta.name] = table
    for block in index.dense:
        f = block.file
        state.dense[(block.param, block.block)] = DenseBlock(
            _load_npy(blobs[f"{f}.values.npy"]),
            {s: _load_npy(blobs[f"{f}.state.{s}.npy"]) for s in rule.state_names},
            _load_npy(blobs[f"{f}.steps.npy"]),
            # A checkpoint of before the served average: it starts from the values.
            _load_npy(blobs[f"{f}.average.npy"]) if f"{f}.average.npy" in blobs else None)
    state.dedup = Dedup.from_json(blobs["dedup.json"])
    examples = ExampleCounts.from_json(blobs["examples.json"])
    state.examples.update(examples.tasks)
    state.examples_folded.update(examples.partitions)
    return state
