"""Is the win real? Per-image coarse counts, bootstrap intervals, paired comparisons and committed thresholds,
each against a literal computation."""

import math

import numpy as np
import pytest

from segood.metrics import FloatOrderAccumulator, PixelOODAccumulator, exact_metrics
from segood.metrics.bootstrap import (Bootstrap, ImageCounts, coarse_keys, compare, resampled_means,
                                      resampled_metrics, tied_ranks)
from segood.metrics.thresholds import RULES, at_threshold, commit


def images(n, d, seed, pixels=300, ood=0.3):
    """n images of iid scores: ID ~ N(0, 1), OOD ~ N(d, 1) (pooled AUROC = Phi(d / sqrt 2)), with ignore pixels."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, pixels)) < ood).astype(np.uint8)
    labels[:, :7] = 255
    scores = rng.normal(size=(n, pixels)) + d * (labels == 1)
    return scores, labels


def accumulate(scores, labels, acc=None):
    acc = acc or FloatOrderAccumulator(per_image=True)
    for s, lab in zip(scores, labels):
        acc.update(s[None], lab[None])
    return acc


def coarse(scores):
    """The literal coarse score of each pixel: its coarse float-order key (what the per-image counts bin)."""
    return coarse_keys(scores).astype(np.float64)


def test_per_image_counts_are_the_pixels_coarse_bins():
    scores, labels = images(5, 1.0, 0)
    scores[2, 10:20] = [0.0, -0.0, 1e-300, -1e-300, np.inf, -np.inf, 3e38, -3e38, 5e-324, 2.0]
    acc = accumulate(scores, labels)
    for k, (s, lab) in enumerate(zip(scores, labels)):
        keys, counts = acc.images.keys[k], acc.images.counts[k]
        expected_keys, inverse = np.unique(coarse_keys(s[lab <= 1]), return_inverse=True)
        expected = np.zeros((expected_keys.size, 2), np.int64)
        np.add.at(expected, (inverse, lab[lab <= 1]), 1)
        np.testing.assert_array_equal(keys, expected_keys)
        np.testing.assert_array_equal(counts, expected)


def test_a_resample_equals_the_literal_pool_of_the_drawn_images():
    scores, labels = images(12, 0.8, 1)
    acc = accumulate(scores, labels)
    weights = Bootstrap(5, seed=3).weights(12)
    got = resampled_metrics(acc.images, weights)
    for r, row in enumerate(weights.astype(int)):
        drawn = np.repeat(np.arange(12), row)  # image k drawn row[k] times
        literal = exact_metrics(coarse(scores[drawn]), labels[drawn])
        for name in ("auroc", "auprc", "fpr95", "max_iou"):
            assert got[name][r] == pytest.approx(literal[name], abs=1e-12), (name, r)


def test_intervals_cover_the_true_auroc_at_about_their_nominal_rate():
    d, covered, runs = 1.0, 0, 60
    truth = 0.5 * (1 + math.erf(d / 2))  # Phi(d / sqrt 2)
    for run in range(runs):
        acc = accumulate(*images(25, d, 100 + run, pixels=120))
        lo, hi = compare({"m": acc.images}, Bootstrap(200, seed=run))["intervals"]["m"]["auroc"]
        covered += lo <= truth <= hi
    assert 0.85 <= covered / runs <= 1.0, covered


def test_the_paired_bootstrap_finds_a_planted_difference_and_not_a_null_one():
    scores, labels = images(30, 1.0, 7)
    noise = np.random.default_rng(8).normal(size=scores.shape)
    strong = accumulate(scores, labels)
    weak = accumulate(scores + 1.2 * noise, labels)  # the same images, a noisier detector
    same = accumulate(scores + 0.01 * noise, labels)  # a detector indistinguishable from the first
    found = compare({"strong": strong.images, "weak": weak.images, "same": same.images}, Bootstrap(300, seed=0))
    assert found["significant"]["auroc"]["strong"]["weak"] and found["p_better"]["auroc"]["strong"]["weak"] > 0.99
    assert not found["significant"]["auroc"]["strong"]["same"]
    assert found["p_better"]["fpr95"]["strong"]["weak"] > 0.95  # lower is better: the sign follows the metric
    pooled = {m: acc.compute()["auroc"] for m, acc in (("strong", strong), ("weak", weak), ("same", same))}
    ranks = tied_ranks(pooled, found["significant"]["auroc"], True)
    assert ranks["weak"] == 3 and ranks["strong"] == ranks["same"] == 1


def test_tied_ranks_by_hand():
    significant = {a: {b: {("a", "c"), ("b", "c"), ("a", "d"), ("b", "d")}.__contains__((a, b)) for b in "abcd"}
                   for a in "abcd"}
    assert tied_ranks({"a": 0.9, "b": 0.89, "c": 0.7, "d": 0.69, "e": None}, significant, True) == \
        {"a": 1, "b": 1, "c": 3, "d": 3, "e": None}
    # "s" is compared with none (significant against all, as a board's self-reported entry): it takes its place
    # between a and b without leading b's group
    unpaired = {a: {b: a == "s" or b == "s" or significant[a][b] for b in "abcds"} for a in "abcds"}
    assert tied_ranks({"a": 0.9, "s": 0.895, "b": 0.89, "c": 0.7}, unpaired, True, compared=set("abcd")) == \
        {"a": 1, "s": 2, "b": 1, "c": 4}
    # a chain: b is not significantly worse than a, nor c than b, but c is than a, the group's leader: a new group
    chain = {a: {b: {a, b} == {"a", "c"} for b in "abc"} for a in "abc"}
    assert tied_ranks({"a": 0.9, "b": 0.8, "c": 0.7}, chain, True) == {"a": 1, "b": 1, "c": 3}
    assert tied_ranks({"a": 0.1, "b": 0.2, "c": 0.3}, chain, False) == {"a": 1, "b": 1, "c": 3}  # (lower is better)


def test_per_image_counts_survive_states_merges_and_refuse_forgeries():
    scores, labels = images(6, 1.0, 2)
    whole = accumulate(scores, labels)
    halves = accumulate(scores[:3], labels[:3]).merge(accumulate(scores[3:], labels[3:]))
    for acc in (halves, type(whole).from_state_dict(whole.state_dict())):
        for name in ("image_offsets", "image_keys", "image_counts", "image_values"):
            np.testing.assert_array_equal(acc.state_dict()[name], whole.state_dict()[name])
    linear = accumulate(scores, labels, PixelOODAccumulator(400, (-6.0, 7.0), per_image=True))
    assert len(PixelOODAccumulator.from_state_dict(linear.state_dict()).images) == 6
    state = whole.state_dict()
    for forged, reason in ((dict(image_keys=state["image_keys"][::-1].copy()), "must increase"),
                           (dict(image_offsets=state["image_offsets"][:-1]), "image_offsets"),
                           (dict(image_counts=state["image_counts"] * 2), "sum to"),
                           (dict(image_values=np.full_like(state["image_values"], np.inf)), "image_values")):
        with pytest.raises(ValueError, match=reason):
            FloatOrderAccumulator.from_state_dict({**state, **forged})
    old = {k: v for k, v in state.items() if not k.startswith("image_")}  # a state from before: no intervals
    assert len(FloatOrderAccumulator.from_state_dict(old).images) == 0
    with pytest.raises(ValueError, match="no per-image counts"):
        compare({"m": ImageCounts(("auroc",))})


def test_intervals_and_weights_by_hand():
    assert Bootstrap(confidence=0.5).interval([np.nan, 0, 1, 2, 3, 4]) == [1.0, 3.0]  # NaN resamples left out
    assert Bootstrap(confidence=0.9).interval(np.arange(101.0)) == pytest.approx([5.0, 95.0])
    assert Bootstrap().interval([np.nan, np.nan]) == [None, None]
    weights = Bootstrap(400, seed=7).weights(3)
    assert weights.shape == (400, 3) and (weights.sum(axis=1) == 3).all()
    assert (weights.sum(axis=0) > 0).all()  # every image is drawn, the last one included
    np.testing.assert_array_equal(weights, Bootstrap(400, seed=7).weights(3))  # the reported seed repeats them
    assert not np.array_equal(weights, Bootstrap(400, seed=8).weights(3))


def test_a_method_against_itself_is_a_coin_toss_and_never_significant():
    scores, labels = images(6, 1.0, 9)
    counts = accumulate(scores, labels).images
    found = compare({"a": counts, "b": counts}, Bootstrap(20))
    for name in ("auroc", "auprc", "fpr95", "max_iou"):  # every paired difference is 0: ties count half
        assert found["p_better"][name]["a"]["b"] == 0.5
        assert found["significant"][name]["a"]["b"] is False


def test_resamples_without_ood_pixels_are_counted_and_left_out_of_the_intervals():
    """Only the first of three images holds OOD pixels: the resamples that do not draw it leave the pooled metrics
    undefined, and their number is reported (the intervals are over the others)."""
    scores, labels = images(3, 1.0, 4)
    labels[1:][labels[1:] == 1] = 0
    counts = accumulate(scores, labels).images
    settings = Bootstrap(200, seed=3)
    drawn = settings.weights(3)[:, 0] > 0
    found = compare({"a": counts}, settings)
    assert found["undefined_resamples"]["a"] == {name: int((~drawn).sum()) for name in ("auroc", "auprc", "fpr95",
                                                                                         "max_iou")}
    samples = resampled_metrics(counts, settings.weights(3))["auroc"]
    assert np.isnan(samples[~drawn]).all() and not np.isnan(samples[drawn]).any()
    assert compare({"a": accumulate(*images(3, 1.0, 4)).images}, settings)["undefined_resamples"]["a"] == {}


def test_per_image_means_average_the_drawn_images_where_the_metric_is_defined():
    counts = ImageCounts(("auroc",))
    counts.add(np.array([0.0, 1.0]), np.array([[1, 0], [0, 1]]), [0.8])
    counts.add(np.array([0.0]), np.array([[2], [0]]), [np.nan])  # no OOD pixel: its AUROC is undefined
    weights = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 2.0]])
    np.testing.assert_array_equal(resampled_means(counts, weights, ("auroc",))["auroc"], [0.8, 0.8, np.nan])


def test_an_image_with_no_counted_pixel_keeps_its_place_in_a_saved_state():
    scores, labels = images(3, 1.0, 10)
    labels[1] = 255
    acc = accumulate(scores, labels)
    assert len(acc.images) == 3 and acc.images.keys[1].size == 0
    back = FloatOrderAccumulator.from_state_dict(acc.state_dict())
    assert len(back.images) == 3 and back.images.keys[1].size == 0
    np.testing.assert_array_equal(back.state_dict()["image_values"], acc.state_dict()["image_values"])


def test_committed_thresholds_by_hand():
    """TPR exactly 0.95 (19 of 20 OOD pixels) qualifies, ties go to the lowest threshold, and where nothing is
    predicted OOD precision is NaN. Dyadic scores: the float-order grid's thresholds are the scores themselves."""
    scores = np.array([0.75] * 19 + [0.125] + [0.0625, 0.25, 0.5, 0.875])
    labels = np.array([1] * 20 + [0] * 4, np.uint8)
    result = FloatOrderAccumulator().update(scores, labels).compute()
    assert result["fpr95"] == 0.25
    assert commit(result, "tpr95") == 0.75
    assert at_threshold(result, 0.75) == pytest.approx(
        {"tpr": 0.95, "fpr": 0.25, "precision": 0.95, "balanced_accuracy": 0.85, "f1": 0.95, "iou": 19 / 21})
    nothing = at_threshold(result, 2.0)
    assert np.isnan(nothing.pop("precision"))
    assert nothing == {"tpr": 0.0, "fpr": 0.0, "balanced_accuracy": 0.5, "f1": 0.0, "iou": 0.0}
    # the linear grid's bins at 0.25, 0.5 and 0.75 hold nothing: their counts are equal, and a rule takes the lowest
    tied = PixelOODAccumulator(5).update(np.array([0.1, 0.9]), np.array([0, 1], np.uint8)).compute()
    assert [commit(tied, rule) for rule in ("balanced_accuracy", "f1", "iou")] == [0.25] * 3
    assert commit(tied, "tpr95") == 0.75


def literal_rates(scores, labels, t):
    counted = labels <= 1
    predicted = scores >= t
    tp = int((predicted & (labels == 1)).sum())
    fp = int((predicted & (labels == 0)).sum())
    n_ood, n_id = int((labels == 1).sum()), int((labels == 0).sum())
    assert counted.sum() == n_ood + n_id
    return {"tpr": tp / n_ood, "fpr": fp / n_id, "precision": tp / (tp + fp) if tp + fp else np.nan,
            "balanced_accuracy": (tp / n_ood + 1 - fp / n_id) / 2, "f1": 2 * tp / (tp + n_ood + fp),
            "iou": tp / (n_ood + fp)}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_committed_thresholds_equal_a_literal_computation(rule):
    tune_scores, tune_labels = images(8, 1.0, 4)
    test_scores, test_labels = images(8, 0.5, 5)
    tune = FloatOrderAccumulator().update(tune_scores, tune_labels).compute()
    t = commit(tune, rule)
    candidates = np.unique(tune_scores[tune_labels <= 1])  # a literal search over every distinct score
    rates = [literal_rates(tune_scores, tune_labels, c) for c in candidates]
    if rule == "tpr95":
        best = max(c for c, r in zip(candidates, rates) if r["tpr"] >= 0.95)
        assert literal_rates(tune_scores, tune_labels, t)["tpr"] >= 0.95
        assert literal_rates(tune_scores, tune_labels, best)["fpr"] == pytest.approx(
            literal_rates(tune_scores, tune_labels, t)["fpr"], abs=2e-3)  # t is a bin edge at or below best
    else:
        best = max(r[rule] for r in rates)
        assert literal_rates(tune_scores, tune_labels, t)[rule] == pytest.approx(best, abs=2e-3)
    got = at_threshold(FloatOrderAccumulator().update(test_scores, test_labels).compute(), t)
    expected = literal_rates(test_scores, test_labels, t)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12, nan_ok=True), name
    with pytest.raises(ValueError, match="unknown threshold rule"):
        commit(tune, "accuracy")


def test_a_run_reports_intervals_ranks_committed_thresholds_and_runtime(noise_sets, tmp_path, capsys):
    import torch

    from segood.cli import main
    from segood.evaluation import evaluate
    from segood.evaluation.runner import Evaluation
    from segood.models import build_model

    root = noise_sets(seed=2)
    sets = {"perlin_mixed": root / "perlin_mixed.h5", "normal_mixed": root / "normal_mixed.h5"}
    torch.manual_seed(0)
    doc = evaluate(build_model("pspnet", "resnet18").eval(), sets, ["max_softmax", "entropy"], tmp_path / "run",
                   progress=False, commit_on="perlin_mixed", bootstrap=Bootstrap(200, seed=1))
    ev = Evaluation.load(tmp_path / "run" / "state.npz")
    for m in ("max_softmax", "entropy"):
        tuned = ev.acc[(m, "perlin_mixed")].compute()
        for s in sets:
            r = doc["results"][m][s]
            lo, hi = r["intervals"]["auroc"]
            assert 0 <= lo <= hi <= 1 and r["coarsening"]["auroc"] >= 0
            for rule in RULES:
                chosen = r["committed"][rule]
                assert chosen["chosen_on"] == "perlin_mixed" and chosen["threshold"] == commit(tuned, rule)
                expected = at_threshold(ev.acc[(m, s)].compute(), chosen["threshold"])
                assert {k: chosen[k] for k in expected} == {k: None if np.isnan(v) else v for k, v in expected.items()}
                assert r["oracle"][rule]["chosen_on"] == "oracle (this set)"
        assert doc["timings"]["per_method"][m]["scoring_ms_per_image"] >= 0
    assert set(doc["comparisons"]["normal_mixed"]["ranks"]["auroc"]) == {"max_softmax", "entropy"}
    assert doc["bootstrap"]["resamples"] == 200 and doc["bootstrap"]["seed"] == 1
    markdown = (tmp_path / "run" / "results.md").read_text()
    for s in sets:  # (2 noise frames, all OOD, and 2 Cityscapes frames, all ID: 1 resample in 16 draws no OOD)
        undefined = doc["results"]["entropy"][s]["undefined_resamples"]["auroc"]
        assert 0 < undefined < 40 and (f"On {s}, {undefined} of the 200 resamples drew no OOD or no ID pixel" in
                                      markdown)
    assert "At the tpr95 threshold (chosen on perlin_mixed" in markdown and "inference ms / image" in markdown
    assert (tmp_path / "run" / "figures" / "metrics.png").exists()
    assert main(["report", str(tmp_path / "run"), "--resamples", "0", "-v"]) == 0  # no intervals; oracle, named so
    assert "ORACLE: chosen on each test set itself" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a set of the run"):
        evaluate(build_model("pspnet", "resnet18").eval(), sets, ["entropy"], tmp_path / "run2", progress=False,
                 figures=False, commit_on="sun")


def test_the_coarsening_bias_is_shifted_away_given_the_fine_values():
    scores, labels = images(40, 0.7, 11)
    scores = 10 + 0.4 * scores  # crowded in two binades: 64 coarse bins, where FPR95 read coarsely drifts upwards
    acc = accumulate(scores, labels)
    fine = {k: acc.compute()[k] for k in ("auroc", "auprc", "fpr95", "max_iou")}
    found = compare({"m": acc.images}, Bootstrap(300, seed=2), points={"m": fine})["intervals"]["m"]
    for name, value in fine.items():
        lo, hi = found[name]
        assert lo <= value <= hi, (name, lo, value, hi)


def test_coarse_counts_equal_the_coarse_keys_grouped_by_numpy():
    """The one-pass grouping of an image's counts on the coarse grid against coarse_keys and a numpy group sum:
    -0.0 with +0.0, negatives, infinities, empty bins dropped, no thresholds at all."""
    from segood.metrics.bootstrap import coarse_counts, coarse_keys

    rng = np.random.default_rng(4)
    thresholds = np.sort(np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000),
                                         [-0.0, 0.0, np.inf, -np.inf, 5e-324]]))
    hist = rng.integers(0, 3, (2, thresholds.size)) * (rng.random(thresholds.size) < 0.5)
    keys = coarse_keys(thresholds)
    groups, first = np.unique(keys, return_index=True)
    want = np.stack([np.bincount(np.searchsorted(groups, keys), weights=row, minlength=groups.size)
                     for row in hist], axis=1).astype(np.int64)
    got_keys, got = coarse_counts(thresholds, hist)
    occupied = want.any(axis=1)
    np.testing.assert_array_equal(got_keys, groups[occupied])
    np.testing.assert_array_equal(got, want[occupied])
    empty = coarse_counts(np.zeros(0), np.zeros((2, 0), np.int64))
    assert empty[0].shape == (0,) and empty[1].shape == (0, 2)


@pytest.mark.parametrize("settings, message", [({"resamples": -5}, "at least one resample"),
                                               ({"resamples": 0}, "at least one resample"),
                                               ({"confidence": 2.0}, "strictly between 0 and 1"),
                                               ({"seed": -1}, "seed must be an integer of at least 0"),
                                               ({"seed": None}, "seed must be an integer of at least 0"),
                                               ({"seed": 1.5}, "seed must be an integer of at least 0")])
def test_bad_bootstrap_settings_are_refused_when_made(settings, message):
    """Before any frame is scored (they failed at the end of a run)."""
    with pytest.raises(ValueError, match=message):
        Bootstrap(**settings)
