from streamtrain.jobstate.topics import GRAD_RETENTION_MS, dlq_spec, grad_spec, metrics_spec


def test_a_gradient_topic_is_one_partition_kept_a_week_whoever_creates_it():
    spec = grad_spec("ctr", 3)
    assert (spec.name, spec.partitions) == ("ctr.grad.3", 1)
    assert spec.config == {"retention.ms": str(GRAD_RETENTION_MS)} and GRAD_RETENTION_MS == 7 * 24 * 3600 * 1000


def test_dead_letters_are_compacted_and_metrics_kept_as_the_broker_does():
    assert (dlq_spec("ctr").name, dlq_spec("ctr").config) == ("ctr.dlq", {"cleanup.policy": "compact"})
    assert metrics_spec("ctr").name == "ctr.metrics"
