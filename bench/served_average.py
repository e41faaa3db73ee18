"""How much an average of the dense layers steadies what is scored (`train.average_steps`), by
simulation: one process trains the WideDeep-shaped model of `bench.staleness` on the
production workload of `bench.e2e` (Adam for the MLP, SparseAdam for the rows, lr 0.01,
batches of 512) and scores the holdout every 10 steps over its last `10 * evals` steps, with
the dense layers as trained and as the shards average them (`params.averages`) over each of
`--average` steps.

    python -m bench.served_average [--records 1000000] [--order log|job] [--seeds 0]
                                   [--average 10,50,200] [--evals 20]

`--order job` takes the records as a job's two trainers do: 8,192-record tasks of each of two
partitions (record i on partition i % 2), the next task from the partition further behind, a
mini-batch of one trainer or the other at random. Prints a JSON line per seed: for the values
and each average, the final holdout AUC and mean prediction, and over the evaluations the mean
prediction's standard deviation and mean error in % of the observed CTR, and the mean AUC.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.staleness import BATCH, BUCKETS, DIM, LR, hashed, mlp
from streamtrain.params.averages import average_step
from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig, auc

TASK = 8192


def batches(records: int, order: str, rng: np.random.Generator) -> list[np.ndarray]:
    if order == "log":
        return [np.arange(s, min(s + BATCH, records)) for s in range(0, records, BATCH)]
    per, taken = records // 2, [0, 0]

    def take() -> list[int]:
        p = min((0, 1), key=lambda q: (taken[q] >= per, taken[q]))
        lo = taken[p]
        taken[p] = min(per, lo + TASK)
        return (2 * np.arange(lo, taken[p]) + p).tolist()

    held, out = [take(), take()], []
    while any(held):
        live = [i for i, h in enumerate(held) if h]
        t = live[rng.integers(len(live))]
        out.append(np.array(held[t][:BATCH]))
        held[t] = held[t][BATCH:] or take()
    return out


def simulate(records: int, holdout: int, order: str, seed: int, averages: list[int], evals: int) -> dict:
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    model = ClickModel(ClickModelConfig.production())
    train, test = model.columns(records), model.columns(holdout, start=records)
    width = len(model.fields) * DIM + model.dense_features
    torch.manual_seed(seed)
    dense, scored = mlp(width), mlp(width)
    first = nn.Parameter(torch.empty(BUCKETS, 1).uniform_(-0.01, 0.01))
    second = nn.Parameter(torch.empty(BUCKETS, DIM).uniform_(-0.01, 0.01))
    dense_opt = torch.optim.Adam(dense.parameters(), lr=LR)
    sparse_opt = torch.optim.SparseAdam([first, second], lr=LR)
    ids, x, y = torch.from_numpy(hashed(model, train)), torch.from_numpy(train.dense), torch.from_numpy(
        train.clicked.astype(np.float32))
    test_ids, test_x = torch.from_numpy(hashed(model, test)), torch.from_numpy(test.dense)
    kept = {n: [p.detach().clone() for p in dense.parameters()] for n in averages}
    seen: dict[int, list[tuple[float, float]]] = {0: [], **{n: [] for n in averages}}

    @torch.no_grad()
    def score(params) -> tuple[float, float]:
        for mine, p in zip(scored.parameters(), params):
            mine.copy_(p)
        p = torch.sigmoid(first[test_ids].sum((1, 2)) +
                          scored(torch.cat([second[test_ids].flatten(1), test_x], 1)).squeeze(1)).numpy()
        return float(p.mean()), auc(test.clicked, p)

    steps = batches(records, order, rng)
    for step, batch in enumerate(map(torch.from_numpy, steps)):
        rows, inverse = torch.unique(ids[batch], return_inverse=True)
        r1, r2 = first[rows].detach().requires_grad_(True), second[rows].detach().requires_grad_(True)
        logit = r1[inverse].sum((1, 2)) + dense(torch.cat([r2[inverse].flatten(1), x[batch]], 1)).squeeze(1)
        dense.zero_grad()
        F.binary_cross_entropy_with_logits(logit, y[batch]).backward()
        first.grad = torch.sparse_coo_tensor(rows[None], r1.grad, first.shape, check_invariants=False)
        second.grad = torch.sparse_coo_tensor(rows[None], r2.grad, second.shape, check_invariants=False)
        dense_opt.step()
        sparse_opt.step()
        with torch.no_grad():  # as a shard averages a block
            for n, average in kept.items():
                for a, p in zip(average, dense.parameters()):
                    average_step(a.numpy(), p.detach().numpy(), step + 1, n)
        if len(steps) - 1 - step < 10 * evals and (len(steps) - 1 - step) % 10 == 0:
            seen[0].append(score(list(dense.parameters())))
            for n in averages:
                seen[n].append(score(kept[n]))
    ctr = float(test.clicked.mean())
    out: dict = {"seed": seed, "order": order, "observed_ctr": round(ctr, 4)}
    for n, scores in seen.items():
        p, a = np.array([s[0] for s in scores]), np.array([s[1] for s in scores])
        out["values" if n == 0 else f"average_{n}"] = {
            "holdout_auc": round(float(a[-1]), 4), "mean_p": round(float(p[-1]), 4),
            "mean_p_sd_pct": round(float(100 * p.std() / ctr), 2),
            "mean_p_error_pct": round(float(100 * (p.mean() / ctr - 1)), 2), "auc_mean": round(float(a.mean()), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--holdout", type=int, default=50_000)
    parser.add_argument("--order", choices=["log", "job"], default="log")
    parser.add_argument("--seeds", default="0", help="comma-separated")
    parser.add_argument("--average", default="10,50,200", help="comma-separated steps of each average")
    parser.add_argument("--evals", type=int, default=20, help="evaluations, every 10 steps, at the end")
    args = parser.parse_args()
    averages = [int(n) for n in args.average.split(",")]
    for seed in map(int, args.seeds.split(",")):
        print(json.dumps(simulate(args.records, args.holdout, args.order, seed, averages, args.evals)), flush=True)


if __name__ == "__main__":
    main()
