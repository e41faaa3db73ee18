"""The trainer's side of the parameters: pulling rows and dense blocks from Redis into the
torch model, and turning the gradients of a push group into one GradientDelta per shard.

Dense parameters, end to end, are cut into blocks of `BLOCK` values, addressed `(the layout's
name, block)` (`DenseLayout`), each owned by the shard the slot map says. A shard stores and updates what training
has added to a
block, starting from zero; the parameter's value is the model's own initial value plus that.
The model is built under a fixed seed (`trainer.models.MODEL_SEED`), so its initial values,
PyTorch's own initialisation of each layer, are the same in every process without the shards
knowing them. Update rules that depend only on the gradients (SGD, Adagrad, Adam) train the
sum exactly as they would the parameter; FTRL's regularisation pulls towards the initial value
rather than zero. A block no shard has trained yet is not in Redis: it is then its initial value.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.paramstore import ParamClient, ParamsUnavailableError, PendingPull, Pull
from streamtrain.params.rows import row_view
from streamtrain.schemas import DenseSlice, GradientDelta, SparseRows
from streamtrain.trainer.own import OwnPushes
from streamtrain.trainer.replica import RowReplica

BLOCK = 4096
INIT_SCALE = 0.01  # sparse rows' initial scale: the pservers' ShardState default


@dataclass(frozen=True)
class RowLayout:
    """The model's embedding tables stored as one.

    Every table is looked up by the same hashed feature ids, so shards, Redis and gradient
    deltas keep one row per id holding each table's columns side by side (tables in name
    order): a pull reads, a push carries and a shard applies and publishes one key per id
    instead of one per table and id. With WideDeep's two tables that halves the per-id work,
    which dominates Redis's and the shards' CPU (bench/RESULTS.md, "Figures moved from the
    code and the docs"). One table keeps its name;
    several are named by theirs joined with "+" (`deep+wide`), so a model whose tables change
    meets rows of another width under another name rather than its old rows."""

    name: str
    width: int
    columns: tuple[tuple[str, int, int], ...]  # model table, first column, width

    @classmethod
    def of(cls, tables: dict[str, int]) -> RowLayout:
        names = sorted(tables)
        joined = "+".join(names)
        if len(joined.encode()) > 255:  # a table name's limit (schemas): named by its digest
            joined = "rows-" + hashlib.sha256(joined.encode()).hexdigest()[:16]
        columns, at = [], 0
        for name in names:
            columns.append((name, at, tables[name]))
            at += tables[name]
        return cls(joined, at, tuple(columns))

    def split(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pooled rows (..., width) into the model's tables (..., each table's width): views."""
        return {name: pooled[..., start:start + width] for name, start, width in self.columns}


@dataclass(frozen=True)
class _Block:
    param: str  # the layout's name: every block of a model has it
    block: int
    start: int  # the block's values in the layout's vector
    stop: int


@dataclass(frozen=True)
class _Segment:
    """Where one parameter's values lie in the layout's vector."""

    tensor: nn.Parameter
    start: int
    stop: int


def dense_name(params: list[tuple[str, nn.Parameter]]) -> str:
    """The name of a model's dense blocks: a digest of its parameters' names and shapes, so a
    model whose layers change meets blocks of its own rather than values laid out for others."""
    shapes = ";".join(f"{name}:{'x'.join(str(d) for d in p.shape)}" for name, p in params)
    return "dense-" + hashlib.sha256(shapes.encode()).hexdigest()[:16]


class DenseLayout:
    """The model's dense parameters end to end, in `named_parameters` order, as one vector cut
    into blocks of `BLOCK` values, `(name, block)`; takes the initial values from the model as
    built (seeded: `trainer.models.build_model`).

    Blocks span parameters rather than each parameter being blocks of its own: a deep model's
    biases and small layers would each be a block of 1 to 256 values, and each block costs
    every push, pull, apply and publish a few Python objects and Redis keys whatever its size
    (bench/RESULTS.md, "Figures moved from the code and the docs"). A parameter without a
    gradient in a step, in a block where others have one, sends zeros: its optimizer state
    moves on as if it had a zero gradient (torch.optim would skip it; the built-in models use
    every parameter every step)."""

    def __init__(self, model: nn.Module) -> None:
        params = list(model.named_parameters())
        self.name = dense_name(params)
        self._segments: list[_Segment] = []
        at = 0
        for _, param in params:
            self._segments.append(_Segment(param, at, at + param.numel()))
            at += param.numel()
        self.size = at
        self._initial = np.concatenate(
            [p.detach().reshape(-1).cpu().numpy().astype(np.float32) for _, p in params]
        ) if params else np.zeros(0, dtype=np.float32)
        self._initial.flags.writeable = False
        self.blocks = [_Block(self.name, b, start, min(start + BLOCK, at))
                       for b, start in enumerate(range(0, at, BLOCK))]
        # The parameters each block holds values of (by position in `_segments`).
        self._spans = {b.block: [i for i, s in enumerate(self._segments) if s.start < b.stop and b.start < s.stop]
                       for b in self.blocks}
        self._values = self._initial.copy()  # what the parameters hold
        self._loaded: dict[tuple[str, int], np.ndarray | None] = {}  # the array each block was last loaded from
        # The steps of the update rule each block's values include, read or estimated: what a
        # gradient computed on them was computed at (`DenseSlice.base`).
        self.bases: dict[tuple[str, int], int] = {}
        # Parameters on the CPU become views of `_values`: a load or an estimate written there
        # is in the model at once, with no copy into each parameter (which would be two
        # copies a step). Others (a GPU's) are copied into by `_write`.
        self._shared = bool(params) and all(p.device.type == "cpu" and p.dtype == torch.float32 for _, p in params)
        if self._shared:
            flat = torch.from_numpy(self._values)
            with torch.no_grad():
                for s in self._segments:
                    s.tensor.data = flat[s.start:s.stop].view(s.tensor.shape)

    def initial(self, block: _Block) -> np.ndarray:
        return self._initial[block.start:block.stop]

    @torch.no_grad()
    def load(self, values: dict[tuple[str, int], np.ndarray], bases: dict[tuple[str, int], int] | None = None) -> None:
        """Pulled blocks (what training added) onto their initial values, into the parameters;
        blocks not pulled get their initial value. `bases`: the steps each block's values
        include (none: 0)."""
        changed = []
        for block in self.blocks:
            key = (block.param, block.block)
            self.bases[key] = bases.get(key, 0) if bases else 0
            found = values.get(key)
            if found is not None and self._loaded.get(key) is found:
                continue  # the same (read-only) array as last time: ParamClient pulled the same bytes
            self._loaded[key] = found
            part = self._values[block.start:block.stop]
            if found is None:
                part[:] = self.initial(block)
            else:
                np.add(self.initial(block), found, out=part)
            changed.append(block)
        self._write(changed)

    @torch.no_grad()
    def add(self, changes: dict[tuple[str, int], np.ndarray]) -> None:
        """Add `changes` to blocks of the parameters (a step's estimated effect, trainer/own.py)."""
        changed = []
        for block in self.blocks:
            key = (block.param, block.block)
            change = changes.get(key)
            if change is not None:
                self._values[block.start:block.stop] += change
                self.bases[key] = self.bases.get(key, 0) + 1
                # The values hold an estimate now: the next load writes the block even from the
                # same bytes (a group given up leaves the estimates of steps never pushed).
                self._loaded.pop(key, None)
                changed.append(block)
        self._write(changed)

    def gradients(self) -> list[tuple[str, int, np.ndarray]]:
        """The blocks' gradients (block name, block, values), of blocks where some parameter
        has one: fresh arrays, one copy of them all."""
        grads = [s.tensor.grad for s in self._segments]
        if all(g is None for g in grads):
            return []
        flat = torch.cat([s.tensor.new_zeros(s.stop - s.start) if g is None else g.detach().reshape(-1)
                          for s, g in zip(self._segments, grads)]).cpu().numpy()
        return [(b.param, b.block, flat[b.start:b.stop]) for b in self.blocks
                if any(grads[i] is not None for i in self._spans[b.block])]

    def _write(self, blocks: list[_Block]) -> None:
        """The parameters overlapping `blocks`, from `_values` (nothing to do where they share it)."""
        if self._shared:
            return
        for i in sorted({i for b in blocks for i in self._spans[b.block]}):
            s = self._segments[i]
            s.tensor.data.view(-1).copy_(torch.from_numpy(self._values[s.start:s.stop]))


@dataclass(frozen=True)
class Fetched:
    ids: np.ndarray  # the rows' ids, sorted and distinct (every table's)
    rows: dict[str, np.ndarray]  # table -> (ids, dim) values
    blocks: dict[tuple[str, int], np.ndarray] | None  # None: dense not fetched this time
    applied: dict[int, dict[str, int]]  # shard -> {trainer id: newest step the values include}
    block_versions: dict[tuple[str, int], int] = field(default_factory=dict)  # of the blocks fetched


class ParamSync:
    """Pulls for a mini-batch; retries while a shard is not (yet, or again) in Redis.

    With a `replica` (a trainer's), rows of its table come from it, and a pull reads from Redis
    only the rows it does not hold, plus the shards' rounds since it last looked, which keep
    it current (trainer/replica.py)."""

    def __init__(self, client: ParamClient, layout: DenseLayout, wait_s: float = 60.0,
                 replica: RowReplica | None = None) -> None:
        self.client = client
        self.layout = layout
        self.wait_s = wait_s
        self.replica = replica
        if replica is not None:
            replica.start(client.flushed(replica.after))

    def pull_rows(self, table: str, ids: np.ndarray, dim: int) -> np.ndarray:
        return self._retrying(lambda: self.client.pull_rows(table, ids, dim).values)

    def send(self, tables: dict[str, int], ids: np.ndarray, shards: dict[str, np.ndarray], dense: bool
             ) -> PendingFetch:
        """The rows of `ids` in every table ({name: dim}; `shards`: each id's owner per
        table), and the dense blocks if `dense`, in one round trip: the requests are sent
        now, the replies read by `PendingFetch.result`."""
        keys = [(b.param, b.block) for b in self.layout.blocks] if dense else []
        replica = self.replica
        if replica is None or set(tables) != {replica.table}:
            request = ({name: (ids, dim) for name, dim in tables.items()}, keys)
            return PendingFetch(self, ids, dense, lambda: self.client.send_pull(*request, row_shards=shards))
        slots = replica.lookup(ids)
        cold = slots < 0
        owners = shards[replica.table]
        request = ({replica.table: (ids[cold], replica.width)}, keys)
        # The rounds are asked for again by a retry: rows read without them would be older
        # than the rounds the replica has not applied yet.
        return PendingFetch(self, ids, dense, lambda: self.client.send_pull(
            *request, row_shards={replica.table: owners[cold]}, rounds=replica.after),
            _Cold(slots, cold, owners, replica.generation))

    def pull_dense(self) -> None:
        keys = [(b.param, b.block) for b in self.layout.blocks]
        if keys:
            pull = self._retrying(lambda: self.client.pull({}, keys))
            self.layout.load(pull.blocks, pull.block_versions)

    def load(self, fetched: Fetched, own: OwnPushes) -> dict[str, np.ndarray]:
        """Dense blocks into the model (when fetched); returns the rows. Both with what
        `own` pushes not yet published change."""
        own.published(fetched.applied)
        if fetched.blocks is not None:
            added = own.steps_added(fetched.applied)
            bases = {key: fetched.block_versions.get(key, 0) + added.get(key, 0)
                     for key in fetched.block_versions.keys() | added.keys()}
            self.layout.load(own.add_blocks(fetched.blocks, fetched.applied), bases)
        return {table: own.add_rows(table, fetched.ids, values, fetched.applied)
                for table, values in fetched.rows.items()}

    def _retrying(self, pull):
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return pull()
            except ParamsUnavailableError as exc:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(exc.retry_after)


@dataclass(frozen=True)
class _Cold:
    """What a replica pull looked up before sending: the slot of each id (-1: not held, read
    from Redis), each id's shard, and the replica's generation the slots belong to."""

    slots: np.ndarray
    cold: np.ndarray
    owners: np.ndarray
    generation: int


class PendingFetch:
    """A `ParamSync.send` on the wire."""

    def __init__(self, sync: ParamSync, ids: np.ndarray, dense: bool, send: Callable[[], PendingPull],
                 cold: _Cold | None = None) -> None:
        """`send`: sends the request (now, and again for a retry)."""
        self._sync = sync
        self._ids = ids
        self._dense = dense
        self._send = send
        self._pending = send()
        self._cold = cold

    def result(self) -> Fetched:
        """The fetched parameters; waits and retries while a shard is not in Redis."""
        try:
            pull = self._pending.result()
        except ParamsUnavailableError:
            pull = self._sync._retrying(lambda: self._send().result())
        rows = pull.rows if self._cold is None else self._from_replica(pull)
        return Fetched(self._ids, rows, pull.blocks if self._dense else None, pull.applied, pull.block_versions)

    def _from_replica(self, pull: Pull) -> dict[str, np.ndarray]:
        """The rounds read go into the replica first, then the rows read from keys that no
        round brought meanwhile; the batch's rows are the replica's and those."""
        replica, cold, ids = self._sync.replica, self._cold, self._ids
        assert replica is not None and cold is not None  # a cold part is only made with a replica
        replica.apply(pull.rounds, pull.flushed)
        slots = cold.slots
        if replica.generation != cold.generation:
            slots = replica.lookup(ids)  # rows were dropped (a missed round): some slots are gone
        elif cold.cold.any():
            slots = slots.copy()
            slots[cold.cold] = replica.lookup(ids[cold.cold])  # brought by the rounds just read
        warm = slots >= 0
        if warm.all():
            return {replica.table: replica.gather(slots)}
        # Whole rows moved by take and put (indexing rows with a mask copied at half the speed).
        values = np.empty((len(ids), replica.width), dtype=np.float32)
        rows = row_view(values)
        at = np.flatnonzero(warm)
        np.put(rows, at, row_view(replica.gather(slots.take(at))))
        read = ~warm & cold.cold
        np.put(rows, np.flatnonzero(read), row_view(pull.rows[replica.table].take(
            np.flatnonzero(read[cold.cold]), axis=0)))
        lost = np.flatnonzero(~warm & ~cold.cold)  # held when the pull was sent, dropped since
        if len(lost):
            np.put(rows, lost, row_view(np.ascontiguousarray(self._sync._retrying(lambda: self._sync.client.pull(
                {replica.table: (ids.take(lost), replica.width)}, []).rows[replica.table]))))
        at = np.flatnonzero(~warm)
        replica.hold(ids.take(at), cold.owners.take(at), values.take(at, axis=0))
        return {replica.table: values}


class GradientBuffer:
    """A push's gradients, one step (mini-batch) after another, split by owning shard.

    Steps are not summed: a shard applies each as a step of the update rule, in order, so a
    push of several mini-batches trains as many steps as one process would (summed, they would
    be one step of a batch as large, which costs AUC: bench/RESULTS.md, "Figures moved from the
    code and the docs")."""

    def __init__(self, slot_map: SlotMap, shards: int) -> None:
        self.slot_map = slot_map
        self.shards = shards
        self._sparse: dict[int, list[SparseRows]] = defaultdict(list)
        self._dense: dict[int, list[DenseSlice]] = defaultdict(list)
        self._block_shards: dict[tuple[str, int], int] = {}

    def clear(self) -> None:
        self._sparse.clear()
        self._dense.clear()

    def add_step(self, table: str | None, ids: np.ndarray, grads: np.ndarray, shards: np.ndarray | None,
                 dense: list[tuple[str, int, np.ndarray]], bases: dict[tuple[str, int], int] | None = None) -> None:
        """One step's gradients: of distinct row `ids` of `table` (None: the model has no rows;
        `shards`, each id's owner, if the caller knows them: the pull that fetched the rows
        did) and of dense blocks (`DenseLayout.gradients`), computed at `bases`
        (`DenseLayout.bases`; none: 0)."""
        # Arrays of the wire's types already (the model's names are checked where they are
        # made), so each piece is checked only for finite values: the full checks would cost as
        # much as the rest of a step's gradients here.
        if table is not None:
            ids = ids.astype(np.uint64, copy=False)
            grads = np.ascontiguousarray(grads, dtype=np.float32)
            for shard, (s_ids, s_grads) in self.slot_map.split_rows(table, ids, grads, shards).items():
                self._sparse[shard].append(SparseRows.of_wire_types(table, s_ids, s_grads))
        for param, block, values in dense:
            values = np.ascontiguousarray(values, dtype=np.float32)
            base = bases.get((param, block), 0) if bases else 0
            self._dense[self.shard_of_block(param, block)].append(
                DenseSlice.of_wire_types(param, block, 0, values, base))

    def deltas(self, task_id: str, seq: int, trainer_id: str, step: int, examples: int) -> list[GradientDelta]:
        """One delta per shard, empty ones included: every shard counts every group's
        examples, which is what makes exactly-once checkable by counting."""
        out = [GradientDelta(task_id, seq, trainer_id, shard, step, examples,
                             dense=tuple(self._dense[shard]), sparse=tuple(self._sparse[shard]))
               for shard in range(self.shards)]
        self.clear()
        return out

    def shard_of_block(self, param: str, block: int) -> int:
        shard = self._block_shards.get((param, block))
        if shard is None:
            shard = self._block_shards[(param, block)] = self.slot_map.shard_of_block(param, block)
        return shard
