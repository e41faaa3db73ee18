"""The average of a dense block that is scored (train.average_steps)."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.params.averages import WARM_UP, average_step, average_weight


@pytest.mark.parametrize("step, steps, weight", [
    (1, 50, WARM_UP / (WARM_UP + 1)),  # early: about the last tenth of the steps taken
    (90, 50, 0.1),
    (WARM_UP * 49, 50, 1 / 50),  # from here on, 1 / steps
    (10**6, 50, 1 / 50),
    (5, 0, 1.0), (5, 1, 1.0),  # the values themselves
])
def test_the_newest_values_weigh_one_in_average_steps_once_a_tenth_of_the_steps_is_more(step, steps, weight) -> None:
    assert average_weight(step, steps) == pytest.approx(weight)


def test_an_average_step_moves_the_average_by_the_weight_in_place() -> None:
    average = np.zeros((1, 2), dtype=np.float32)
    average_step(average, np.array([[4.0, -8.0]], dtype=np.float32), 10**6, 4)
    np.testing.assert_allclose(average, [[1.0, -2.0]])
    average_step(average, np.array([[1.0, 2.0]], dtype=np.float32), 10**6, 4)
    np.testing.assert_allclose(average, [[1.0, -1.0]])
    average_step(average, np.array([[3.0, 5.0]], dtype=np.float32), 10**6, 0)
    np.testing.assert_array_equal(average, [[3.0, 5.0]])


def test_an_average_from_the_first_step_leaves_little_of_the_initial_values() -> None:
    """The failure it prevents: over 50 steps from the first, a job of 31 steps still scored
    its initial dense values at half weight (0.06 AUC under its trained values)."""
    average = np.zeros(1, dtype=np.float32)
    for step in range(1, 32):
        average_step(average, np.ones(1, dtype=np.float32), step, 50)
    assert average[0] > 0.99
