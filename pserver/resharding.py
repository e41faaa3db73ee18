"""What each shard holds under a new slot map, from what the shards held under the old one:
the state half of resizing a job's parameter servers (issue 18; the protocol that pauses the
trainers, takes the cut and reloads the shards is still to build).

Slots move, parameters are never rehashed: a row or dense block belongs to the slot it always
hashed to (jobstate/sharding.py), and goes, with its optimizer state and its step counts, to
whichever shard the new map gives that slot. The rest of a shard's state is not per slot:
every shard applies every push group (an empty delta where it owns no row of it), so at a cut
where every shard has applied the same groups, their example counts per partition agree, and
so do their dedup ledgers once folded to the same watermarks (each shard folds on its own
schedule); every shard of the new map takes them so folded. At any other cut they would not
agree, and moving rows there would lose or repeat updates: `regroup` refuses.

Pure: no storage, no etcd, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.rows import RowTable
from streamtrain.pserver.dedup import Dedup
from streamtrain.pserver.state import DenseBlock, ShardState
from streamtrain.schemas import StreamtrainError


class NotACutError(StreamtrainError, ValueError):
    """The shards' states are not of one cut: they applied different push groups."""


def regroup(states: Mapping[int, ShardState], old_map: SlotMap, new_map: SlotMap) -> dict[int, ShardState]:
    """The state of each shard of `new_map` (every index below its `shards`), given the state
    of every shard of `old_map` (`states`, by index), all at one cut.

    Raises:
        NotACutError: the states' example counts, or their ledgers folded alike, differ.
        ValueError: a shard of `old_map` is missing (its slots' rows would be lost), or a
            table has rows of different widths on two shards.
    """
    if set(states) != set(range(old_map.shards)):
        raise ValueError(f"regroup: states of shards {sorted(states)}, but the old map has "
                         f"{old_map.shards}")
    marks = _common_marks(states)
    _same_cut(states, marks)
    first = next(iter(states.values()))
    out = {shard: _folded(first, marks) for shard in range(new_map.shards)}
    for old in states.values():
        for name, table in old.tables.items():
            n = table.size
            if n == 0:
                continue
            owners = new_map.shard_of_rows(name, table.ids[:n])
            for shard in np.unique(owners).tolist():
                _take_rows(out[shard], table, np.flatnonzero(owners == shard))
        for (param, block), dense in old.dense.items():
            target = out[new_map.shard_of_block(param, block)]
            target.dense[(param, block)] = DenseBlock(dense.values.copy(),
                                                      {k: v.copy() for k, v in dense.state.items()},
                                                      dense.steps.copy(), dense.served().copy())
    # Every shard has every table, with the newest clock. The table clock (Adam's bias
    # correction) counts the applies that reached the table on a shard: about the same on
    # every shard, as each gets rows of nearly every push; the newest is the one a single shard
    # holding all the rows would have come closest to. A table no row moves to now would
    # otherwise start its clock again at its first row.
    for name, table in _tables(states).items():
        for state in out.values():
            if name not in state.tables:
                state.tables[name] = RowTable(name, table.dim, tuple(table.state), table.init_scale)
            state.tables[name].updates = max(t.updates for s in states.values()
                                             if (t := s.tables.get(name)) is not None)
    return out


def _tables(states: Mapping[int, ShardState]) -> dict[str, RowTable]:
    return {name: table for state in states.values() for name, table in state.tables.items()}


def _common_marks(states: Mapping[int, ShardState]) -> dict[tuple[str, int], tuple[int, int]]:
    """Per partition, the furthest any shard has folded to."""
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    for state in states.values():
        for partition, mark in state.dedup.marks().items():
            marks[partition] = max(marks.get(partition, mark), mark)
    return marks


def _folded(state: ShardState, marks: dict[tuple[str, int], tuple[int, int]]) -> ShardState:
    """A state with no parameters, and `state`'s ledger and example counts folded to `marks`."""
    out = ShardState(state.rule, state.init_scale, state.damp_stale, state.average_steps)
    out.dedup = Dedup.from_json(state.dedup.to_json())
    out.dedup.dropped = 0  # duplicates each shard dropped: its own count, not the cut's
    out.examples.update(state.examples)
    out.examples_folded.update(state.examples_folded)
    out.fold(marks)
    return out


def _same_cut(states: Mapping[int, ShardState], marks: dict[tuple[str, int], tuple[int, int]]) -> None:
    folded = {shard: _folded(state, marks) for shard, state in states.items()}
    ledgers = {f.dedup.to_json() for f in folded.values()}
    counts = {shard: f.examples_by_partition() for shard, f in folded.items()}
    if len(ledgers) > 1 or any(c != next(iter(counts.values())) for c in counts.values()):
        totals = {shard: sum(c.values()) for shard, c in counts.items()}
        raise NotACutError(f"the shards' states are not of one cut: they applied different push groups "
                           f"(examples applied by shard: {totals})")


def _take_rows(state: ShardState, table: RowTable, rows: np.ndarray) -> None:
    """Copy rows `rows` of `table` (another shard's) into `state`'s table of that name."""
    into = state.tables.get(table.name)
    if into is None:
        into = state.tables[table.name] = RowTable(table.name, table.dim, tuple(table.state), table.init_scale,
                                                   capacity=max(len(rows), 16))
    elif into.dim != table.dim:
        raise ValueError(f"table {table.name!r} has rows of {into.dim} on one shard and {table.dim} on another")
    ids = table.ids[rows]
    at = into.rows_for(ids)
    into.values[at] = table.values[rows]
    into.steps[at] = table.steps[rows]
    for name, values in table.state.items():
        into.state[name][at] = values[rows]
