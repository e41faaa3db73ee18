"""Rows per second of each built-in update rule on one core, beside a bare numpy Adagrad.

    python -m bench.optimizer_apply [--table-rows 10000000] [--batch 65536] [--dim 16]

What a shard does per gradient batch, on a table big enough to miss every cache: gather the
batch's distinct rows, their optimizer state and step counts from the table (np.take), apply the
rule, scatter rows, state and steps back (fancy assignment). The bare numpy Adagrad is the
yardstick: the same gather / update / scatter written inline, on the same rows and gradients,
interleaved batch by batch with the Adagrad rule so both see the same machine load. It keeps no
step counter (a shard needs one for lazy per-row state), so it moves one array less per batch.

Prints one JSON report; each rate is the best of --rounds rounds (the least disturbed by other
processes), counted over --batches timed batches:
  rules.<name>.apply_rows_per_s        rule.apply alone, on rows already gathered
  rules.<name>.end_to_end_rows_per_s   gather + apply + scatter (the path of a user's rule)
  rules.<name>.in_place_rows_per_s     rule.apply_at on the tables themselves plus the step
                                       counts: what a shard does with a built-in rule
  bare_numpy_adagrad.*                 the same two rates for the inline Adagrad
  adagrad_rule_vs_bare                 end-to-end ratio, Adagrad rule / bare numpy
  adagrad_row_view_end_to_end_rows_per_s   the Adagrad rule with gather and scatter done on a
                                       one-item-per-row view of the tables (np.take / np.put):
                                       what a shard gains by not using 2-d fancy assignment
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from streamtrain.params.optimizers import UpdateRule, make_rule

LR = 0.05
EPS = 1e-10


def distinct_ids(rng: np.random.Generator, table_rows: int, batch: int) -> np.ndarray:
    """`batch` distinct row indexes, sorted, as np.unique leaves a shard's decoded ids."""
    return np.sort(rng.choice(table_rows, size=batch, replace=False)).astype(np.int64)


class Tables:
    """The shard's arrays: parameters, up to two state tables and the per-row step counts."""

    def __init__(self, rows: int, dim: int) -> None:
        # Written once in full so every page is resident before the clock starts (np.zeros
        # alone maps the shared zero page, which makes gathers look far cheaper than they are).
        self.values = np.empty((rows, dim), dtype=np.float32)
        self.values.fill(0.01)
        self.state = [np.empty((rows, dim), dtype=np.float32) for _ in range(2)]
        self.steps = np.empty(rows, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        for array in self.state:
            array.fill(0.0)
        self.steps.fill(0)


class Clock:
    def __init__(self) -> None:
        self.apply = 0.0
        self.total = 0.0
        self.rows = 0

    def rates(self) -> dict[str, float]:
        return {"apply_rows_per_s": self.rows / self.apply,
                "end_to_end_rows_per_s": self.rows / self.total}


def rule_step(rule: UpdateRule, t: Tables, ids: np.ndarray, grads: np.ndarray,
              clock: Clock) -> None:
    began = time.perf_counter()
    rows = np.take(t.values, ids, axis=0)
    state = {name: np.take(t.state[i], ids, axis=0) for i, name in enumerate(rule.state_names)}
    steps = np.take(t.steps, ids)
    applied = time.perf_counter()
    rule.apply(rows, grads, state, steps)
    scatter = time.perf_counter()
    t.values[ids] = rows
    for i, name in enumerate(rule.state_names):
        t.state[i][ids] = state[name]
    steps += 1
    t.steps[ids] = steps
    done = time.perf_counter()
    clock.apply += scatter - applied
    clock.total += done - began
    clock.rows += len(ids)


def row_view(table: np.ndarray) -> np.ndarray:
    """A C-contiguous (rows, dim) table as a 1-d array of opaque rows (one void item per row):
    np.take and np.put then copy whole rows at once instead of going through 2-d indexing."""
    return table.view(np.dtype((np.void, table.shape[1] * table.itemsize))).reshape(len(table))


def rule_step_row_view(rule: UpdateRule, t: Tables, views: list[np.ndarray], ids: np.ndarray,
                       grads: np.ndarray, clock: Clock) -> None:
    """rule_step with gather and scatter on row views: np.take then np.put."""
    began = time.perf_counter()
    dim = t.values.shape[1]
    rows = np.take(views[0], ids).view(np.float32).reshape(len(ids), dim)
    state = {name: np.take(views[i + 1], ids).view(np.float32).reshape(len(ids), dim)
             for i, name in enumerate(rule.state_names)}
    steps = np.take(t.steps, ids)
    applied = time.perf_counter()
    rule.apply(rows, grads, state, steps)
    scatter = time.perf_counter()
    np.put(views[0], ids, row_view(rows))
    for i, name in enumerate(rule.state_names):
        np.put(views[i + 1], ids, row_view(state[name]))
    steps += 1
    np.put(t.steps, ids, steps)
    done = time.perf_counter()
    clock.apply += scatter - applied
    clock.total += done - began
    clock.rows += len(ids)


def rule_step_in_place(rule: UpdateRule, t: Tables, ids: np.ndarray, grads: np.ndarray,
                       clock: Clock) -> None:
    """What RowTable.update does with a built-in: one compiled pass over the rows where they are."""
    began = time.perf_counter()
    steps = np.take(t.steps, ids)
    state = {name: t.state[i] for i, name in enumerate(rule.state_names)}
    out = np.empty_like(grads)
    rule.apply_at(t.values, state, ids, grads, steps, out)
    np.put(t.steps, ids, steps + 1)
    clock.total += time.perf_counter() - began
    clock.rows += len(ids)


def bare_adagrad_step(values: np.ndarray, acc_table: np.ndarray, ids: np.ndarray,
                      grads: np.ndarray, clock: Clock) -> None:
    began = time.perf_counter()
    rows = np.take(values, ids, axis=0)
    acc = np.take(acc_table, ids, axis=0)
    applied = time.perf_counter()
    acc += grads * grads
    rows -= np.float32(LR) * grads / (np.sqrt(acc) + np.float32(EPS))
    scatter = time.perf_counter()
    values[ids] = rows
    acc_table[ids] = acc
    done = time.perf_counter()
    clock.apply += scatter - applied
    clock.total += done - began
    clock.rows += len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batches", type=int, default=30, help="timed batches per rule per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    tables = Tables(args.table_rows, args.dim)
    bare_acc = np.empty((args.table_rows, args.dim), dtype=np.float32)
    bare_acc.fill(0.0)
    # Fewer distinct batches than timed ones: generating them is not what is measured.
    pool = [(distinct_ids(rng, args.table_rows, args.batch),
             rng.standard_normal((args.batch, args.dim), dtype=np.float32)) for _ in range(8)]
    rules = {name: make_rule(name, lr=LR) for name in ("sgd", "adagrad", "adam", "ftrl")}
    views = [row_view(tables.values), *(row_view(a) for a in tables.state)]
    setup_s = time.perf_counter() - started

    best: dict[str, dict[str, float]] = {}

    def keep(name: str, clock: Clock) -> None:
        rates = clock.rates()
        old = best.setdefault(name, rates)
        for key, value in rates.items():
            old[key] = max(old[key], value)

    for _ in range(args.rounds):
        for name, rule in rules.items():
            tables.reset()
            clock, bare, viewed, in_place = Clock(), Clock(), Clock(), Clock()
            for i in range(2):  # warm-up: first-touch costs, allocator growth, compilation
                rule_step(rule, tables, *pool[i], Clock())
                rule_step_in_place(rule, tables, *pool[i], Clock())
            for i in range(args.batches):
                ids, grads = pool[i % len(pool)]
                rule_step(rule, tables, ids, grads, clock)
                rule_step_in_place(rule, tables, ids, grads, in_place)
                if name == "adagrad":
                    bare_adagrad_step(tables.values, bare_acc, ids, grads, bare)
                    rule_step_row_view(rule, tables, views, ids, grads, viewed)
            keep(name, clock)
            best[name]["in_place_rows_per_s"] = max(best[name].get("in_place_rows_per_s", 0.0),
                                                    in_place.rows / in_place.total)
            if name == "adagrad":
                keep("bare_numpy_adagrad", bare)
                keep("adagrad_row_view", viewed)

    bare_rates = best.pop("bare_numpy_adagrad")
    view_rates = best.pop("adagrad_row_view")
    report = {
        "command": "python -m bench.optimizer_apply " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "table_rows": args.table_rows,
        "batch_rows": args.batch,
        "dim": args.dim,
        "timed_batches_per_rule": args.batches,
        "rounds": args.rounds,
        "rules": {name: {k: round(v) for k, v in rates.items()} for name, rates in best.items()},
        "bare_numpy_adagrad": {k: round(v) for k, v in bare_rates.items()},
        "adagrad_rule_vs_bare": round(best["adagrad"]["end_to_end_rows_per_s"]
                                      / bare_rates["end_to_end_rows_per_s"], 3),
        "adagrad_row_view_end_to_end_rows_per_s": round(view_rates["end_to_end_rows_per_s"]),
        "setup_s": round(setup_s, 2),
        "total_s": round(time.perf_counter() - started, 2),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
                    "numpy": np.__version__, "python": platform.python_version()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
