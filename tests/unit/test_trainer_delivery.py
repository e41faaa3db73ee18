"""trainer/delivery.py without a broker: what a refused delta does to the task."""

from __future__ import annotations

import pytest

from streamtrain.infra import Endpoints
from streamtrain.trainer.delivery import Delivery, DeliveryError

NOWHERE = Endpoints(kafka="127.0.0.1:1", etcd="127.0.0.1:1", redis="redis://127.0.0.1:1/0")


def test_a_delta_refused_before_it_is_queued_fails_the_task_and_names_the_topic() -> None:
    delivery = Delivery(NOWHERE, transactional_id=None)
    try:
        # Larger than the producer's message.max.bytes: refused locally, nothing queued. It
        # must fail the task (DeliveryError), not stop the trainer, and every attempt of the
        # task stops at the same group, so its groups still reach each shard in order.
        with pytest.raises(DeliveryError, match=r"job\.grad\.0.*too large"):
            delivery.send("job.grad.0", b"x" * 2_000_000)
    finally:
        delivery.close()  # nothing queued: returns at once
