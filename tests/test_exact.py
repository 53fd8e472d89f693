"""The exact grid (every distinct score a threshold) against literal values and scikit-learn, on data with ties;
its protocol (merge, state, per-image counts, all-reduce), its cap and its place among the grids."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from segood.metrics import (ExactAccumulator, FloatOrderAccumulator, accumulator_from_state, describe_grid,
                            distinct_score_counts, grid_of, grid_spec, load_accumulator, make_accumulator)
from segood.metrics.bootstrap import Bootstrap, coarse_keys, compare, resampled_metrics

from gloo import run_in_group

METRICS = ("auroc", "auprc", "fpr95", "max_iou")


def random_case(rng, shape, decimals):
    """Scores rounded to ``decimals`` (ties when few), OOD shifted up; 10% ignore."""
    u = rng.random(shape)
    labels = np.where(u < 0.1, 255, np.where(u < 0.35, 1, 0)).astype(np.uint8)
    scores = np.round(rng.normal(0, 1, shape) + 0.8 * (labels == 1), decimals)
    return scores, labels


def sklearn_reference(scores, labels):
    """Every metric from scikit-learn's curves, and MaxIoU by a loop over the distinct scores."""
    keep = labels != 255
    y, s = labels[keep].astype(int), np.asarray(scores, np.float64)[keep]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    iou = [np.sum((s >= t) & (y == 1)) / np.sum((s >= t) | (y == 1)) for t in np.unique(s)]
    return {"auroc": roc_auc_score(y, s), "auprc": average_precision_score(y, s), "fpr95": fpr[tpr >= 0.95].min(),
            "max_iou": max(iou)}


def test_literal_values():
    scores, labels = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1], np.uint8)  # sklearn's own example
    result = ExactAccumulator().update(scores, labels).compute()
    assert result["auroc"] == 0.75 and result["auprc"] == pytest.approx(5 / 6, abs=1e-15)
    assert result["fpr95"] == 0.5 and result["max_iou"] == 2 / 3 and result["max_iou_threshold"] == 0.35
    np.testing.assert_array_equal(result["thresholds"], [0.1, 0.35, 0.4, 0.8])
    np.testing.assert_array_equal(result["tp"], [2, 2, 1, 1])
    np.testing.assert_array_equal(result["fp"], [2, 1, 1, 0])
    assert result["bounds"] == {k: (result[k], result[k]) for k in METRICS} and result["exact"] is True
    tied = ExactAccumulator().update(np.full(4, 0.5), np.array([0, 1, 0, 1], np.uint8)).compute()
    assert (tied["auroc"], tied["auprc"], tied["fpr95"], tied["max_iou"]) == (0.5, 0.5, 1.0, 0.5)
    signed = ExactAccumulator().update(np.array([-0.0, 0.0, -np.inf, np.inf]), np.array([0, 1, 0, 1], np.uint8))
    thresholds, hist = signed.curve_counts()  # -0.0 and +0.0 are one value; ±inf are values like any other
    np.testing.assert_array_equal(thresholds, [-np.inf, 0.0, np.inf])
    np.testing.assert_array_equal(hist, [[1, 1, 0], [0, 1, 1]])
    assert signed.compute()["auroc"] == 0.875


@pytest.mark.parametrize("decimals", [0, 1, 3, 8])
def test_equals_sklearn_on_random_data_with_ties(decimals):
    rng = np.random.default_rng(decimals)
    scores, labels = random_case(rng, (6, 40, 50), decimals)
    acc = ExactAccumulator(per_image=True)
    for batch in range(0, 6, 2):  # in batches of two images
        acc.update(scores[batch : batch + 2], labels[batch : batch + 2])
    result, reference = acc.compute(), sklearn_reference(scores, labels)
    for metric in METRICS:
        assert result[metric] == pytest.approx(reference[metric], abs=1e-12), metric
    keep = labels != 255
    assert (result["n_id"], result["n_ood"], result["n_ignored"]) == (np.sum(labels == 0), np.sum(labels == 1),
                                                                      np.sum(~keep))
    s, lab = scores[keep], labels[keep]  # the curves: count(score >= t) per label, every distinct score
    np.testing.assert_array_equal(result["thresholds"], np.unique(s))
    for label, got in ((1, result["tp"]), (0, result["fp"])):
        np.testing.assert_array_equal(got, [np.sum((s >= t) & (lab == label)) for t in result["thresholds"]])
    per_image = [sklearn_reference(s, lab)["auroc"] for s, lab in zip(scores, labels)]
    assert result["per_image_mean"]["auroc"] == pytest.approx(np.mean(per_image), abs=1e-12)
    assert result["per_image_mean"]["n_images"] == 6


def test_distinct_score_counts_equal_a_sort_of_everything():
    rng = np.random.default_rng(1)
    id_scores, ood_scores = rng.integers(-5, 5, 300).astype(np.float64), rng.integers(0, 9, 200).astype(np.float32)
    thresholds, hist = distinct_score_counts(id_scores, ood_scores)
    values = np.unique(np.concatenate([id_scores, ood_scores]))
    np.testing.assert_array_equal(thresholds, values)
    np.testing.assert_array_equal(hist, [[np.sum(id_scores == v) for v in values],
                                         [np.sum(ood_scores == v) for v in values]])
    empty = distinct_score_counts(np.zeros(0), np.zeros(0))
    assert empty[0].shape == (0,) and empty[1].shape == (2, 0)


def test_infinite_scores_rank_like_huge_ones():
    rng = np.random.default_rng(2)
    scores, labels = random_case(rng, 5_000, 1)
    scores[:300] = np.where(rng.random(300) < 0.5, np.inf, -np.inf)
    result = ExactAccumulator().update(scores, labels).compute()
    reference = sklearn_reference(np.clip(scores, -1e300, 1e300), labels)  # same order, finite for sklearn
    for metric in METRICS:
        assert result[metric] == pytest.approx(reference[metric], abs=1e-12), metric


def test_merge_shuffle_and_state_invariance(tmp_path):
    rng = np.random.default_rng(3)
    scores, labels = random_case(rng, (4, 30, 30), 2)
    scores = scores.astype(np.float32).astype(np.float64)  # the same values in either dtype
    whole = ExactAccumulator(per_image=True).update(scores, labels)
    a = ExactAccumulator(per_image=True).update(scores[:1], labels[:1])
    b = ExactAccumulator(per_image=True).update(scores[1:].astype(np.float32), labels[1:])  # another dtype
    merged = a + b
    order = rng.permutation(scores.size)
    shuffled = ExactAccumulator().update(scores.ravel()[order], labels.ravel()[order])
    merged.save(tmp_path / "state.npz")
    restored = load_accumulator(tmp_path / "state.npz")
    assert isinstance(restored, ExactAccumulator) and restored.n_images == 4 and len(restored.images) == 4
    expected = whole.compute()
    for acc in (merged, restored, shuffled):
        got = acc.compute()
        for metric in METRICS:
            assert got[metric] == expected[metric], metric
    assert merged.scores[0].dtype == np.float64  # float64 input: float64 kept
    assert ExactAccumulator().update(scores.astype(np.float32), labels).scores[1].dtype == np.float32
    np.testing.assert_allclose(merged.per_image_sum, whole.per_image_sum, atol=1e-12)
    with pytest.raises(TypeError, match="can only merge a ExactAccumulator"):
        merged.merge(FloatOrderAccumulator())
    with pytest.raises(ValueError, match="different configurations"):
        ExactAccumulator().merge(a)


def test_the_kept_curve_follows_every_change():
    rng = np.random.default_rng(9)
    scores, labels = random_case(rng, (3, 20, 20), 1)
    acc = ExactAccumulator().update(scores[0], labels[0])
    first = acc.compute()["auroc"]
    thresholds, hist = acc.curve_counts()
    hist[...] = 0  # a copy: the accumulator's own curve is untouched
    assert acc.compute()["auroc"] == first
    for change in (lambda a: a.update(scores[1], labels[1]),
                   lambda a: a.merge(ExactAccumulator().update(scores[2], labels[2]))):
        change(acc)
        assert acc.compute()["auroc"] != first
        first = acc.compute()["auroc"]
    assert first == pytest.approx(sklearn_reference(scores, labels)["auroc"], abs=1e-12)
    assert acc.reset().update(scores[0], labels[0]).compute()["n_id"] == np.sum(labels[0] == 0)


def test_per_image_counts_serve_the_bootstrap():
    rng = np.random.default_rng(4)
    scores, labels = random_case(rng, (8, 20, 20), 3)
    exact = ExactAccumulator(per_image=True).update(scores, labels)
    binned = FloatOrderAccumulator(per_image=True).update(scores, labels)
    for k in range(8):  # the same coarse counts as the float-order grid's, from the pixels' coarse keys
        np.testing.assert_array_equal(exact.images.keys[k], binned.images.keys[k])
        np.testing.assert_array_equal(exact.images.counts[k], binned.images.counts[k])
        lab = labels[k]
        keys = np.unique(coarse_keys(scores[k][lab <= 1]))
        np.testing.assert_array_equal(exact.images.keys[k], keys)
    weights = Bootstrap(4, seed=1).weights(8)
    np.testing.assert_array_equal(resampled_metrics(exact.images, weights)["auroc"],
                                  resampled_metrics(binned.images, weights)["auroc"])
    found = compare({"exact": exact.images}, Bootstrap(50), points={"exact": {"auroc": exact.compute()["auroc"]}})
    lo, hi = found["intervals"]["exact"]["auroc"]
    assert lo <= exact.compute()["auroc"] <= hi


def test_the_cap_is_a_clear_error_and_leaves_the_state_alone():
    acc = ExactAccumulator(max_pixels=10).update(np.zeros(8), np.array([0, 1] * 3 + [255] * 2, np.uint8))
    assert acc.n_stored == 6  # ignored pixels are counted, not kept
    with pytest.raises(ValueError, match=r"brings it to 11 pixels, above its cap of 10 .*float-order grid"):
        acc.update(np.zeros(5), np.zeros(5, np.uint8))
    assert acc.n_stored == 6 and acc.compute()["n_id"] == 3
    with pytest.raises(ValueError, match="this merge brings it to 12"):
        acc.merge(ExactAccumulator().update(np.zeros(6), np.zeros(6, np.uint8)))
    state = ExactAccumulator(max_pixels=100).update(np.zeros(20), np.zeros(20, np.uint8)).state_dict()
    state["max_pixels"] = np.array(10, np.int64)
    with pytest.raises(ValueError, match="holds 20 scores, more than its max_pixels"):
        accumulator_from_state(state)


def test_bad_input_and_forged_states():
    labels = np.array([0, 1, 1], np.uint8)
    with pytest.raises(ValueError, match="1 counted pixels have NaN scores"):
        ExactAccumulator().update(np.array([0.1, np.nan, 0.3]), labels)
    ExactAccumulator().update(np.array([0.1, 0.2, np.nan]), np.array([0, 1, 255], np.uint8))  # ignored NaN
    with pytest.raises(ValueError, match="clip has no meaning"):
        ExactAccumulator().update(np.array([0.1, 0.2, 0.3]), labels, clip=True)
    with pytest.raises(ValueError, match="labels contain values"):
        ExactAccumulator().update(np.array([0.1, 0.2]), np.array([0, 7], np.uint8))
    with pytest.raises(ValueError, match=r"1 counted pixels have scores outside the declared score_range \[0, 1\]"):
        ExactAccumulator(score_range=(0, 1)).update(np.array([0.1, 2.0, 0.3]), labels)
    ranged = ExactAccumulator(score_range=(0, 1)).update(np.array([0.1, 0.5, 0.3]), labels)
    assert accumulator_from_state(ranged.state_dict()).score_range == (0.0, 1.0)
    with pytest.raises(ValueError, match="different configurations"):
        ranged.merge(ExactAccumulator())
    with pytest.raises(ValueError, match="the accumulator is empty"):
        ExactAccumulator().compute()
    with pytest.raises(ValueError, match="max_pixels must be positive"):
        ExactAccumulator(max_pixels=0)
    good = ExactAccumulator().update(np.array([0.1, 0.2, 0.3]), labels).state_dict()
    for key, value, message in (("ood_scores", np.array([0.2, np.nan]), "holds NaN"),
                                ("id_scores", np.array([1, 2]), "1-D float32 or float64"),
                                ("id_scores", np.zeros((2, 2)), "1-D float32 or float64")):
        with pytest.raises(ValueError, match=message):
            accumulator_from_state({**good, key: value})
    with pytest.raises(ValueError, match="lacks"):
        accumulator_from_state({k: v for k, v in good.items() if k != "ood_scores"})


def test_torch_inputs_equal_numpy_inputs():
    rng = np.random.default_rng(5)
    scores, labels = random_case(rng, (2, 16, 16), 2)
    want = ExactAccumulator().update(scores.astype(np.float32), labels).compute()
    for tensor in (torch.from_numpy(scores.astype(np.float32)), torch.from_numpy(scores).to(torch.bfloat16)):
        got = ExactAccumulator().update(tensor, torch.from_numpy(labels)).compute()
        reference = sklearn_reference(tensor.float().numpy(), labels)
        assert got["auroc"] == pytest.approx(reference["auroc"], abs=1e-12)
    assert ExactAccumulator().update(torch.from_numpy(scores.astype(np.float32)),
                                     torch.from_numpy(labels)).compute()["auroc"] == want["auroc"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_give_the_cpu_scores():
    rng = np.random.default_rng(6)
    scores, labels = random_case(rng, (2, 64, 64), 3)
    for dtype in (torch.float32, torch.float16, torch.float64):
        s = torch.from_numpy(scores).to(dtype)
        cpu = ExactAccumulator().update(s, torch.from_numpy(labels))
        gpu = ExactAccumulator().update(s.cuda(), torch.from_numpy(labels).cuda())
        for x, y in zip(cpu.scores, gpu.scores):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype


def test_grid_spec_names_the_exact_grid():
    grid = grid_spec(kind="exact")
    assert grid == {"kind": "exact", "max_pixels": 1 << 28} and grid_spec(max_pixels=5)["max_pixels"] == 5
    acc = make_accumulator(grid, per_image=True)
    assert isinstance(acc, ExactAccumulator) and acc.per_image and grid_of(acc) == grid
    assert describe_grid(grid) == "the exact grid (every distinct score a threshold)"
    assert grid_spec(kind="linear") == grid_spec(400) and grid_spec(kind="float") == grid_spec()
    with pytest.raises(ValueError, match="choose one grid: mantissa_bits belong to another grid than the exact"):
        grid_spec(mantissa_bits=12, kind="exact")
    with pytest.raises(ValueError, match="choose one grid"):
        grid_spec(400, mantissa_bits=12)
    with pytest.raises(ValueError, match="unknown grid kind 'sorted'"):
        grid_spec(kind="sorted")
    assert grid_spec(kind={"kind": "exact", "max_pixels": 7}) == {"kind": "exact", "max_pixels": 7}
    with pytest.raises(ValueError, match="is a whole grid, with no further options"):
        grid_spec(400, kind={"kind": "exact", "max_pixels": 7})
    from segood.leaderboard import make_benchmark

    with pytest.raises(ValueError, match="a state of the exact grid holds every counted pixel's score"):
        make_benchmark({}, "unused.json", grid=grid)


def _all_reduce_worker(rank, world_size, out_dir):
    rng = np.random.default_rng(rank)
    scores, labels = random_case(rng, (2 + rank, 10, 10), 2)
    acc = ExactAccumulator(per_image=True).update(scores.astype(np.float64 if rank else np.float32), labels)
    acc.save(f"{out_dir}/local{rank}.npz")
    acc.all_reduce()
    acc.save(f"{out_dir}/reduced{rank}.npz")


def test_all_reduce_concatenates_the_ranks_scores(tmp_path):
    run_in_group(_all_reduce_worker, str(tmp_path))
    expected = load_accumulator(tmp_path / "local0.npz") + load_accumulator(tmp_path / "local1.npz")
    for r in range(2):
        reduced = load_accumulator(tmp_path / f"reduced{r}.npz")
        for got, want in zip(reduced.scores, expected.scores):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.float64
        assert reduced.n_images == 5 and len(reduced.images) == 5 and reduced.n_ignored == expected.n_ignored
        np.testing.assert_allclose(reduced.per_image_sum, expected.per_image_sum)
