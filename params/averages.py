"""What is scored of a dense block: an exponential moving average of its values over about its
last `train.average_steps` steps (pserver/state.py keeps it; trainer/local.py, the in-process
reference, keeps the same).

Adam at a constant learning rate moves the output layer from one mini-batch to the next: one
process's mean prediction on the holdout moved by 4-6% of the CTR (one standard deviation)
over its last 200 steps, about the spread of a job's final ones. An average over 50 steps moved
by 1.1-1.2% and scored 0.0004-0.0014 more AUC (`bench.served_average`, bench/RESULTS.md). Early
on the average spans about the last tenth of the steps taken instead, as TensorFlow's
ExponentialMovingAverage does with `num_updates`: over 50 steps from the first, a job of a
few dozen steps scored 0.06 AUC under its trained values, its initial ones still half the
average.
"""

from __future__ import annotations

import numpy as np

WARM_UP = 10  # early on, the average spans about the last 1 / WARM_UP of the steps taken


def average_weight(step: int, steps: int) -> float:
    """The weight of a block's values after its `step`-th step (from 1) in the average that is
    scored: 1 / `steps`, or more while `step` < WARM_UP * (`steps` - 1); `steps` 0 or 1: the
    values themselves."""
    if steps <= 1:
        return 1.0
    return max(1.0 / steps, WARM_UP / (WARM_UP + step))


def average_step(average: np.ndarray, values: np.ndarray, step: int, steps: int) -> None:
    """Move `average` (float32, in place) to a block's `values` after its `step`-th step."""
    weight = average_weight(step, steps)
    if weight >= 1.0:
        np.copyto(average, values)
    else:
        average += (values - average) * np.float32(weight)
