import numpy as np
import pytest

from streamtrain import schemas
from streamtrain.producers.clickmodel import ClickModel, ClickModelConfig, auc


def test_same_seed_and_index_give_the_same_impression_whatever_the_slice():
    a = ClickModel(ClickModelConfig(seed=3)).impressions(100, start=1000)
    b = ClickModel(ClickModelConfig(seed=3)).impressions(10, start=1050)
    assert a[50:60] == b


def test_another_seed_gives_another_log():
    a = ClickModel(ClickModelConfig(seed=3)).impressions(50)
    b = ClickModel(ClickModelConfig(seed=4)).impressions(50)
    assert [i.sparse for i in a] != [i.sparse for i in b]


def test_examples_have_one_id_per_field_dense_features_and_binary_labels():
    model = ClickModel()
    examples = model.examples(500, start=7, event_time_ms=123)
    assert all(isinstance(e, schemas.Example) for e in examples)
    assert {tuple(e.sparse) for e in examples} == {tuple(sorted(model.fields))}
    assert all(len(ids) == 1 for e in examples for ids in e.sparse.values())
    assert {len(e.dense) for e in examples} == {model.dense_features}
    assert {e.label for e in examples} == {0.0, 1.0}
    assert {e.event_time_ms for e in examples} == {123}
    impressions = model.impressions(500, start=7)
    assert [e.label for e in examples] == [float(i.clicked) for i in impressions]


def test_default_event_times_count_milliseconds_from_the_origin():
    model = ClickModel()
    assert [e.event_time_ms for e in model.examples(3, start=10)] == [model.config.origin_ms + i for i in (10, 11, 12)]


def test_best_auc_and_base_ctr_are_in_the_documented_range():
    model = ClickModel()
    assert 0.78 <= model.best_auc(50_000) <= 0.85
    ctr = np.mean([e.label for e in model.examples(20_000)])
    assert 0.10 <= ctr <= 0.25


def test_probabilities_of_examples_match_the_generating_ones():
    model = ClickModel()
    impressions = model.impressions(1000, start=500)
    p = model.probabilities(model.examples(1000, start=500), start=500)
    np.testing.assert_allclose(p, [i.probability for i in impressions], rtol=1e-5)


def test_popular_ids_are_much_more_frequent_than_rare_ones():
    ids = np.array([i.sparse["user"] for i in ClickModel().impressions(20_000)])
    counts = np.bincount(ids, minlength=2000)
    assert counts[:10].sum() > 10 * counts[-1000:].sum() / 100  # head of the Zipf vs its tail
    assert ids.max() < 2000


def test_drift_redraws_a_share_of_the_weights_at_each_epoch_boundary():
    model = ClickModel(ClickModelConfig(drift_every=1000, drift_fraction=0.2))
    before, after = model.weights(0)["user"], model.weights(1)["user"]
    shift = after - before
    # Recentring moves every weight by one constant; the redrawn ones move on their own.
    moved = np.abs(shift - np.median(shift)) > 1e-9
    assert 0.1 < moved.mean() < 0.3
    # Impressions of epoch 0 are the same as without drift; later ones are scored differently.
    still = ClickModel(ClickModelConfig(drift_every=0))
    assert model.impressions(1000) == still.impressions(1000)
    late_drift = [i.probability for i in model.impressions(1000, start=5000)]
    late_still = [i.probability for i in still.impressions(1000, start=5000)]
    assert not np.allclose(late_drift, late_still)


def test_drift_weights_do_not_depend_on_the_order_they_are_asked_for():
    forward = ClickModel(ClickModelConfig(drift_every=10))
    forward.weights(1)
    backward = ClickModel(ClickModelConfig(drift_every=10))
    np.testing.assert_array_equal(backward.weights(5)["ad"], forward.weights(5)["ad"])


@pytest.mark.parametrize("labels, scores, expected", [
    ([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4], 1.0),
    ([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4], 0.0),
    ([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5], 0.5),  # all tied
    ([0, 1, 1], [0.2, 0.2, 0.9], 0.75),  # one tie between classes counts half
])
def test_auc_by_ranks_with_ties(labels, scores, expected):
    assert auc(labels, scores) == pytest.approx(expected)


def test_auc_refuses_a_single_class():
    with pytest.raises(ValueError, match="both classes"):
        auc([1, 1], [0.1, 0.2])


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="drift_every"):
        ClickModelConfig(drift_every=-1)


@pytest.mark.parametrize("interaction, match", [(("ad", "ad"), "interaction"), (("ad", "nope"), "interaction"),
                                                (("ad",), "interaction")])
def test_an_interaction_must_name_two_fields_of_the_model(interaction, match):
    with pytest.raises(ValueError, match=match):
        ClickModelConfig(interaction=interaction, interaction_std=1.0)


def test_the_production_workload_has_the_documented_shape_ctr_and_ceiling():
    model = ClickModel(ClickModelConfig.production())
    assert len(model.fields) == 8 and model.dense_features == 4
    assert max(f.cardinality for f in model.config.fields) == 10**6
    assert min(f.cardinality for f in model.config.fields) == 10**3
    examples = model.examples(50_000, start=300_000)
    assert 0.23 <= np.mean([e.label for e in examples]) <= 0.29
    assert 0.82 <= model.best_auc(50_000) <= 0.86


def test_a_scaled_production_workload_has_more_distinct_ids_of_the_same_shape():
    base, scaled = ClickModelConfig.production(), ClickModelConfig.production(vocab_scale=10)
    assert [f.cardinality * 10 for f in base.fields] == [f.cardinality for f in scaled.fields]
    assert [f.zipf for f in base.fields] == [f.zipf for f in scaled.fields]
    n = 20_000
    distinct = [len(np.unique(ClickModel(c).columns(n).ids["user"])) for c in (base, scaled)]
    assert distinct[1] > distinct[0] * 1.1  # 8,080 against 9,288 at this size; 2x at 4M records
    with pytest.raises(ValueError, match="vocab_scale"):
        ClickModelConfig.production(vocab_scale=0)


def test_the_interaction_is_part_of_the_probability_and_a_pure_function_of_the_ids():
    config = ClickModelConfig.production(drift_every=0)
    with_it, without = ClickModel(config), ClickModel(ClickModelConfig(**{**config.__dict__, "interaction_std": 0.0}))
    examples = with_it.examples(2000, start=40)
    p, q = with_it.probabilities(examples, start=40), without.probabilities(examples, start=40)
    logit = np.log(p / (1 - p)) - np.log(q / (1 - q))
    assert 0.7 < logit.std() < 1.3  # interaction_std 1.0
    same = ClickModel(config).probabilities(examples[1000:], start=1040)
    np.testing.assert_allclose(same, p[1000:])
