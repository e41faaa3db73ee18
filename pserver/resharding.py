"""What each shard holds under a new slot map, from what the shards held under the old one:
the state half of resizing a job's parameter servers (issue 18; the protocol that pauses the
trainers, takes the cut and reloads the shards is still to build).

Slots move, parameters are never rehashed: a row or dense block belongs to the slot it always
hashed to (jobstate/sharding.py), and goes, with its optimizer state and its step counts, to
whichever shard the new map gives that slot. The rest of a shard's state is not per slot:
every shard applies every push group (an empty delta where it owns no row of it), so at a cut
where every shard has applied the same groups, their dedup ledgers and example counts agree,
and a shard that gains slots, or joins, takes them as they are. At any other cut they would
not, and moving rows there would lose or repeat updates: `regroup` refuses.

Pure: no storage, no etcd, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streamtrain.jobstate.rows import RowTable
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.pserver.dedup import Dedup
from streamtrain.pserver.state import DenseBlock, ShardState
from streamtrain.schemas import StreamtrainError


class NotACutError(StreamtrainError, ValueError):
    """The shards' states are not of one cut: they applied different push groups."""


def regroup(states: Mapping[int, ShardState], new_map: SlotMap) -> dict[int, ShardState]:
    """The state of each shard of `new_map` (every index below its `shards`), given the state
    of every shard under the old map (`states`, by index), all at one cut.

    Raises:
        NotACutError: the states' dedup ledgers or example counts differ.
        ValueError: a table has rows of different widths on two shards.
    """
    if not states:
        raise ValueError("regroup: no shard states")
    first = next(iter(states.values()))
    _same_cut(states)
    out = {shard: _empty_like(first) for shard in range(new_map.shards)}
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
                                                      dense.steps.copy())
    return out


def _same_cut(states: Mapping[int, ShardState]) -> None:
    ledgers = {shard: state.dedup.to_json() for shard, state in states.items()}
    examples = {shard: (dict(state.examples), dict(state.examples_folded)) for shard, state in states.items()}
    ledger_of = {shard: _without_dropped(ledger) for shard, ledger in ledgers.items()}
    if len(set(ledger_of.values())) > 1 or any(e != next(iter(examples.values())) for e in examples.values()):
        counts = {shard: sum(state.examples_by_partition().values()) for shard, state in states.items()}
        raise NotACutError(f"the shards' states are not of one cut: they applied different push groups "
                           f"(examples applied by shard: {counts})")


def _without_dropped(ledger: bytes) -> bytes:
    """A ledger's groups, without its count of dropped duplicates (which differs by shard)."""
    dedup = Dedup.from_json(ledger)
    dedup.dropped = 0
    return dedup.to_json()


def _empty_like(state: ShardState) -> ShardState:
    """A state with no parameters, and the dedup ledger and example counts of `state`."""
    out = ShardState(state.rule, state.init_scale)
    out.dedup = Dedup.from_json(state.dedup.to_json())
    out.dedup.dropped = 0
    out.examples.update(state.examples)
    out.examples_folded.update(state.examples_folded)
    return out


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
    # The table clock (Adam's bias correction) counts the applies that reached the table on a
    # shard: about the same on every shard, as each gets rows of nearly every push. The newest
    # is the one a single shard holding all these rows would have come closest to.
    into.updates = max(into.updates, table.updates)
