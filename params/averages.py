"""What is scored of a dense block: an exponential moving average of its values over about its
last `train.average_steps` steps (pserver/state.py keeps it; trainer/local.py, the in-process
reference, keeps the same).

Adam at a constant learning rate moves the output layer from one mini-batch to the next, and
a job's mean prediction with it, by about the spread of a job's final ones; an average over its
last steps moves far less and scores slightly higher (`bench.served_average`; bench/RESULTS.md,
"the dense layers scored as an average of their last 50 steps"). Early on the average spans
about the last tenth of the steps taken instead, as TensorFlow's ExponentialMovingAverage does
with `num_updates`: a fixed span from the first step would leave a job of a few dozen steps
scoring well under its trained values, its initial ones still a large part of the average.
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
