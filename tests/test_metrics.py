"""The metric engine against slow, obviously-correct references (literal loops, scikit-learn)."""

import warnings
import zlib

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from segood.metrics import PixelOODAccumulator, UndefinedMetricWarning, exact_metrics
from segood.metrics import _kernels

from gloo import run_in_group


def literal_counts(scores, labels, thresholds):
    """TP_k, FP_k by the contract's literal comparison, one threshold at a time."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    lab = np.asarray(labels).ravel()
    tp, fp = [], []
    for start in range(0, len(thresholds), 256):  # 256 thresholds at a time, each compared with every pixel
        predicted_ood = s[None, :] >= np.asarray(thresholds)[start : start + 256, None]
        tp.append(np.count_nonzero(predicted_ood & (lab == 1), axis=1))
        fp.append(np.count_nonzero(predicted_ood & (lab == 0), axis=1))
    return np.concatenate(tp), np.concatenate(fp)


def random_labels(rng, shape, p_ood=0.2, p_ignore=0.1):
    u = rng.random(shape)
    return np.where(u < p_ignore, 255, np.where(u < p_ignore + p_ood, 1, 0)).astype(np.uint8)


def runs_of(rng, values, n):
    """n of ``values`` in runs of one value: half the runs of 1 to 7 pixels, half of up to 3000 (the kernels' blocks
    are 1024 pixels: runs cross them, and their blocks take the run-length loop or the plain one)."""
    k = n // 8
    lengths = np.where(rng.random(k) < 0.5, rng.integers(1, 8, k), rng.integers(1, 3000, k))
    return np.repeat(rng.choice(values, k), lengths)[:n]


def on_threshold_scores(rng, n, num_thresholds, score_range, dtype):
    """Scores exactly on thresholds (as representable in dtype), one ulp either side, and the ends."""
    lo, hi = score_range
    t = np.linspace(lo, hi, num_thresholds).astype(dtype)
    picked = rng.choice(t, n)
    up = np.nextafter(picked, np.array(np.inf, dtype))
    down = np.nextafter(picked, np.array(-np.inf, dtype))
    s = rng.choice(np.stack([picked, up, down]).ravel(), n)
    s[:4] = [lo, hi, lo, hi]
    as64 = s.astype(np.float64)
    return s[(as64 >= lo) & (as64 <= hi)]  # drop the neighbours that fall outside the score range


def make_case(name, rng, num_thresholds, score_range):
    n = 20_000
    lo, hi = score_range
    if name == "random_f32":
        return (lo + (hi - lo) * rng.random(n)).astype(np.float32), random_labels(rng, n)
    if name == "random_f64":
        return lo + (hi - lo) * rng.random(n), random_labels(rng, n)
    if name.startswith("on_thresholds"):
        scores = on_threshold_scores(rng, n, num_thresholds, score_range, getattr(np, name[-3:].replace("f", "float")))
        return scores, random_labels(rng, scores.size)
    if name == "runs":  # runs of one score (some longer than a kernel's block, some a pixel), labels in runs apart
        values = on_threshold_scores(rng, 64, num_thresholds, score_range, np.float32)
        return runs_of(rng, values, n), runs_of(rng, np.uint8([0, 1, 255]), n)
    if name == "heavy_ties":
        return rng.choice(np.float32([lo, hi, (lo + hi) / 2, lo + (hi - lo) / 3]), n), random_labels(rng, n)
    if name == "all_ood":
        return rng.random(n).astype(np.float32) * (hi - lo) + lo, np.ones(n, np.uint8)
    if name == "all_id":
        return rng.random(n).astype(np.float32) * (hi - lo) + lo, np.zeros(n, np.uint8)
    if name == "all_ignore":
        return np.full(n, np.nan, np.float32), np.full(n, 255, np.uint8)
    raise KeyError(name)


CASES = ["random_f32", "random_f64", "on_thresholds_f32", "on_thresholds_f64", "runs", "heavy_ties", "all_ood",
         "all_id", "all_ignore"]
# The last two ranges are too narrow for their magnitude to trust arithmetic: every pixel takes the comparing
# path. In the very last, thresholds repeat, so a score equal to lo lies beyond the first bin.
CONFIGS = [(2, (0.0, 1.0)), (7, (0.0, 1.0)), (400, (0.0, 1.0)), (401, (0.1, 0.7)), (4096, (-3.5, 12.25)),
           (65536, (0.0, 1.0)), (300, (1e6, 1e6 + 1e-3)), (300, (1.0, 1.0 + 1e-14))]


@pytest.mark.parametrize("num_thresholds,score_range", CONFIGS)
@pytest.mark.parametrize("case", CASES)
def test_counts_equal_literal_comparison(case, num_thresholds, score_range):
    rng = np.random.default_rng(zlib.crc32(f"{case}{num_thresholds}".encode()))
    scores, labels = make_case(case, rng, num_thresholds, score_range)
    acc = PixelOODAccumulator(num_thresholds, score_range)
    acc.update(scores.reshape(1, 1, -1), labels.reshape(1, 1, -1))
    tp, fp = literal_counts(scores, labels, acc.thresholds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        res = acc.compute()
    np.testing.assert_array_equal(res["tp"], tp)
    np.testing.assert_array_equal(res["fp"], fp)
    np.testing.assert_array_equal(res["fn"], np.count_nonzero(labels == 1) - tp)
    np.testing.assert_array_equal(res["tn"], np.count_nonzero(labels == 0) - fp)
    assert res["n_ignored"] == np.count_nonzero(labels == 255)


def test_exact_guess_modes():
    """float32 scores on usual ranges take the kernel's exact mode, float64 scores its margin mode; the
    literal-comparison tests above cover both, and a float32 range where the proof fails."""
    assert _kernels.exact_guess(0.0, 1.0, 400, "<f4") and _kernels.exact_guess(0.0, 1.0, 65536, "<f4")
    assert _kernels.exact_guess(0.1, 0.7, 401, "<f4")
    assert not _kernels.exact_guess(0.0, 1.0, 400, "<f8")
    assert not _kernels.exact_guess(-3.5, 12.25, 4096, "<f4")


def test_every_float32_in_a_range_lands_in_its_literal_bin():
    """Exhaustive: all 25 M float32 values in [0.1, 0.7] (exact mode), against numpy's searchsorted."""
    lo, hi, num_t = 0.1, 0.7, 401
    bits = np.arange(np.float32(lo).view(np.int32) - 2, np.float32(hi).view(np.int32) + 3, dtype=np.int32)
    scores = bits.view(np.float32)
    as64 = scores.astype(np.float64)
    scores = scores[(as64 >= lo) & (as64 <= hi)]
    labels = (bits[: scores.size] & 1).astype(np.uint8)
    thresholds = np.linspace(lo, hi, num_t)
    hist, problems = _kernels.histogram_numpy(scores, labels, thresholds, False, 2)
    literal = np.searchsorted(thresholds, scores.astype(np.float64), side="right") - 1
    np.testing.assert_array_equal(hist, np.stack([np.bincount(literal[labels == v], minlength=num_t) for v in (0, 1)]))
    assert not problems.any()


@pytest.mark.parametrize("num_thresholds", [2, 5, 50, 400])
@pytest.mark.parametrize("shape", ["crowded", "ties", "separable"])
def test_binning_bounds_contain_the_exact_metrics(shape, num_thresholds):
    """Exact mode lies within the bounds compute() derives from the binned counts alone."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}{num_thresholds}".encode()))
    labels = (rng.random(30_000) < 0.2).astype(np.uint8)
    if shape == "crowded":  # VarSum-like: nearly everything in the first bins
        scores = np.minimum(rng.exponential(np.where(labels == 1, 0.01, 0.001)), 1.0).astype(np.float32)
    elif shape == "ties":
        scores = rng.choice(np.float32([0.0, 0.1, 0.5, 0.51, 1.0]), labels.size)
    else:
        scores = np.where(labels == 1, 0.9, 0.1).astype(np.float32)
    binned = PixelOODAccumulator(num_thresholds).update(scores, labels).compute()
    exact = exact_metrics(scores, labels)
    tolerance = 1e-12
    for name, (lo, hi) in binned["bounds"].items():
        assert lo - tolerance <= exact[name] <= hi + tolerance, name
    if shape == "separable" and num_thresholds >= 5:  # no bin holds both classes: nothing left to chance
        assert binned["bounds"]["auroc"][0] == binned["bounds"]["auroc"][1] == exact["auroc"]
        assert binned["bounds"]["fpr95"][0] == binned["fpr95"] == exact["fpr95"]


def test_naive_multiply_and_floor_would_be_wrong_here():
    """The adversarial data really are adversarial: floor((s - lo) * (T - 1) / (hi - lo)) misbins some."""
    rng = np.random.default_rng(0)
    lo, hi, num_t = 0.1, 0.7, 401
    s = on_threshold_scores(rng, 20_000, num_t, (lo, hi), np.float64)
    t = np.linspace(lo, hi, num_t)
    naive = np.floor((s - lo) * (num_t - 1) / (hi - lo)).astype(int)
    literal = np.searchsorted(t, s, side="right") - 1
    assert np.any(naive != literal)


@pytest.mark.parametrize("case", ["random_f32", "on_thresholds_f32", "heavy_ties", "all_ignore"])
def test_torch_histogram_equals_numba(case):
    """The device path (torch ops) gives the very same counts; run here on CPU tensors."""
    rng = np.random.default_rng(1)
    scores, labels = make_case(case, rng, 400, (0.0, 1.0))
    t = np.linspace(0.0, 1.0, 400)
    h_np, p_np = _kernels.histogram_numpy(scores, labels, t, False, 3)
    h_t, p_t = _kernels.histogram_torch(torch.from_numpy(scores), torch.from_numpy(labels), t, False, 5000)
    np.testing.assert_array_equal(h_np, h_t)
    np.testing.assert_array_equal(p_np, p_t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_path_equals_cpu_path():
    rng = np.random.default_rng(2)
    scores, labels = make_case("on_thresholds_f32", rng, 400, (0.0, 1.0))
    cpu = PixelOODAccumulator().update(scores, labels)
    gpu = PixelOODAccumulator().update(torch.from_numpy(scores).cuda(), torch.from_numpy(labels).cuda())
    np.testing.assert_array_equal(cpu.hist, gpu.hist)
    assert cpu.compute()["auroc"] == gpu.compute()["auroc"]


def test_cpu_torch_tensor_input():
    rng = np.random.default_rng(3)
    scores, labels = make_case("random_f32", rng, 400, (0.0, 1.0))
    a = PixelOODAccumulator().update(scores, labels)
    b = PixelOODAccumulator().update(torch.from_numpy(scores).to(torch.bfloat16), torch.from_numpy(labels))
    c = PixelOODAccumulator().update(torch.from_numpy(scores).requires_grad_(), torch.from_numpy(labels).long())
    np.testing.assert_array_equal(a.hist, c.hist)
    assert b.hist.sum() == a.hist.sum()


# -- exact mode against scikit-learn --------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_exact_metrics_equal_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = 5_000
    labels = random_labels(rng, n, p_ood=0.1 + 0.15 * seed)
    scores = np.round(rng.random(n) + 0.3 * (labels == 1), 2 if seed % 2 else 6)  # ties when rounded to 2
    ex = exact_metrics(scores, labels)
    keep = labels != 255
    y, s = labels[keep], scores[keep]
    assert ex["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-9)
    assert ex["auprc"] == pytest.approx(average_precision_score(y, s), abs=1e-9)
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    assert ex["fpr95"] == pytest.approx(fpr[tpr >= 0.95].min(), abs=1e-12)
    iou = [np.sum((s >= t) & (y == 1)) / np.sum((s >= t) | (y == 1)) for t in np.unique(s)]
    assert ex["max_iou"] == pytest.approx(max(iou), abs=1e-12)
    assert (ex["n_id"], ex["n_ood"], ex["n_ignored"]) == (np.sum(y == 0), np.sum(y == 1), np.sum(~keep))


def test_binned_equals_exact_when_scores_sit_on_the_grid():
    rng = np.random.default_rng(4)
    num_t = 1001
    labels = random_labels(rng, 50_000)
    scores = np.linspace(0, 1, num_t)[np.clip(rng.normal(400 + 200 * (labels == 1), 150).astype(int), 0, 1000)]
    binned = PixelOODAccumulator(num_t).update(scores, labels).compute()
    exact = exact_metrics(scores, labels)
    for name in ("auroc", "auprc", "fpr95", "max_iou", "max_iou_threshold"):
        assert binned[name] == pytest.approx(exact[name], abs=1e-12), name


def test_binned_converges_to_exact():
    rng = np.random.default_rng(5)
    labels = random_labels(rng, 200_000)
    scores = 1 / (1 + np.exp(-rng.normal(-1 + 2 * (labels == 1), 1.0))).astype(np.float32)
    exact = exact_metrics(scores, labels)
    errors = []
    for num_t in (100, 2_000, 1 << 17):
        binned = PixelOODAccumulator(num_t).update(scores, labels).compute()
        errors.append(max(abs(binned[m] - exact[m]) for m in ("auroc", "auprc", "fpr95", "max_iou")))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4


# -- invariances ------------------------------------------------------------------------------------

@pytest.fixture
def batch():
    rng = np.random.default_rng(6)
    labels = random_labels(rng, (6, 40, 50))
    scores = np.clip(rng.normal(0.3 + 0.4 * (labels == 1), 0.2), 0, 1).astype(np.float32)
    return scores, labels


def test_invariant_under_batch_split_shuffle_merge_and_state_round_trip(batch, tmp_path):
    scores, labels = batch
    whole = PixelOODAccumulator(per_image=True).update(scores, labels)

    split = PixelOODAccumulator(per_image=True)
    for i in range(len(scores)):
        split.update(scores[i : i + 1], labels[i : i + 1])
    np.testing.assert_array_equal(whole.hist, split.hist)

    perm = np.random.default_rng(7).permutation(scores.size)
    shuffled = PixelOODAccumulator().update(scores.ravel()[perm], labels.ravel()[perm])
    np.testing.assert_array_equal(whole.hist, shuffled.hist)

    shards = [PixelOODAccumulator(per_image=True).update(scores[i::3], labels[i::3]) for i in range(3)]
    forward = shards[0] + shards[1] + shards[2]
    backward = PixelOODAccumulator(per_image=True).merge(shards[2]).merge(shards[1]).merge(shards[0])
    for merged in (forward, backward):
        np.testing.assert_array_equal(whole.hist, merged.hist)
        assert merged.n_ignored == whole.n_ignored and merged.n_images == whole.n_images == 6

    restored = PixelOODAccumulator.from_state_dict(whole.state_dict())
    whole.save(tmp_path / "acc.npz")
    loaded = PixelOODAccumulator.load(tmp_path / "acc.npz")
    expected = whole.compute()
    for other in (restored, loaded, forward):
        got = other.compute()
        for name in ("auroc", "auprc", "fpr95", "max_iou", "n_id", "n_ood", "n_ignored"):
            assert got[name] == expected[name]
        for name, value in expected["per_image_mean"].items():
            assert got["per_image_mean"][name] == pytest.approx(value, abs=1e-15)


def test_per_image_mean_averages_images_where_defined(batch):
    scores, labels = batch
    labels = labels.copy()
    labels[0] = 0  # no OOD pixel: per-image metrics undefined for image 0
    acc = PixelOODAccumulator(per_image=True).update(scores, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        per_image = acc.compute()["per_image_mean"]
    singles = [PixelOODAccumulator().update(s, lab).compute() for s, lab in zip(scores[1:], labels[1:])]
    assert per_image["n_images"] == 5 and per_image["n_images_total"] == 6
    for name in ("auroc", "auprc", "fpr95", "max_iou"):
        assert per_image[name] == pytest.approx(np.mean([r[name] for r in singles]), abs=1e-12)


def test_all_reduce_is_a_no_op_without_a_process_group(batch):
    scores, labels = batch
    acc = PixelOODAccumulator().update(scores, labels)
    before = acc.hist.copy()
    acc.all_reduce()
    np.testing.assert_array_equal(acc.hist, before)


def _all_reduce_worker(rank, world_size, out_dir):
    rng = np.random.default_rng(rank)
    labels = random_labels(rng, (2, 30, 30))
    scores = rng.random((2, 30, 30)).astype(np.float32)
    acc = PixelOODAccumulator(per_image=True).update(scores, labels)
    acc.save(f"{out_dir}/local{rank}.npz")
    acc.all_reduce()
    acc.save(f"{out_dir}/reduced{rank}.npz")


def test_all_reduce_sums_over_ranks(tmp_path):
    run_in_group(_all_reduce_worker, str(tmp_path))
    local = [PixelOODAccumulator.load(tmp_path / f"local{r}.npz") for r in range(2)]
    expected = local[0] + local[1]
    for r in range(2):
        reduced = PixelOODAccumulator.load(tmp_path / f"reduced{r}.npz")
        np.testing.assert_array_equal(reduced.hist, expected.hist)
        assert reduced.n_images == 4 and reduced.n_ignored == expected.n_ignored


# -- bad input ------------------------------------------------------------------------------------

def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"shape \(4, 5\).*shape \(5, 4\)"):
        PixelOODAccumulator().update(np.zeros((4, 5)), np.zeros((5, 4), np.uint8))
    with pytest.raises(ValueError, match="match pixel for pixel"):
        exact_metrics(np.zeros(3), np.zeros(4, np.uint8))


def test_labels_outside_convention_are_named():
    labels = np.array([0, 1, 3, 7, 255, 3], np.uint8)
    with pytest.raises(ValueError, match=r"\{3, 7\}.*labelIds"):
        PixelOODAccumulator().update(np.full(6, 0.5), labels)
    with pytest.raises(ValueError, match=r"\{-1\}"):
        PixelOODAccumulator().update(np.full(2, 0.5), np.array([0, -1]))
    with pytest.raises(TypeError, match="integer OOD mask"):
        PixelOODAccumulator().update(np.full(2, 0.5), np.array([0.0, 1.0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# 1.001 and 1.0000001: above the range by less than one of 400 bins
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1.5, -0.25, 1.001, 1.0000001])
def test_bad_scores_are_counted_and_state_is_untouched(bad, dtype):
    acc = PixelOODAccumulator().update(np.array([0.2, 0.8]), np.array([0, 1], np.uint8))
    before = acc.state_dict()
    scores = np.array([0.1, bad, 0.9, bad, bad], dtype)
    with pytest.raises(ValueError, match=r"2 of 4 counted pixels .*clip=True"):
        acc.update(scores, np.array([0, 1, 1, 0, 255], np.uint8))  # the ignored pixel's score is not read
    for key, value in before.items():
        np.testing.assert_array_equal(acc.state_dict()[key], value)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # the kernel's exact and margin modes
def test_clip_opts_into_clipping_but_never_for_nan(dtype):
    scores = np.array([-0.5, 0.3, 1.7, np.inf, -np.inf], dtype)
    labels = np.array([0, 1, 1, 0, 1], np.uint8)
    clipped = PixelOODAccumulator(10).update(scores, labels, clip=True)
    reference = PixelOODAccumulator(10).update(np.clip(scores, 0, 1), labels)
    np.testing.assert_array_equal(clipped.hist, reference.hist)
    with pytest.raises(ValueError, match=r"^1 of 1 counted pixels have NaN scores; clipping \(clip=True, --clip\) "
                                         "cannot fix NaN$"):
        PixelOODAccumulator().update(np.array([np.nan]), np.array([1], np.uint8), clip=True)
    with pytest.raises(ValueError, match=r"^1 of 2 counted pixels .* \(1 out of range, 0 NaN; min 0\.3\S*, max "
                                         r"1\.7\S*\)\. Rescale the scores, set score_range=\(lo, hi\) \(--score-range LO HI\) to "
                                         r"match them, or pass clip=True \(--clip\) to clip finite scores into the "
                                         r"range\.$"):
        PixelOODAccumulator().update(scores[1:3], labels[1:3])


@pytest.mark.parametrize("lo,hi,num_t,score", [
    (0.0, 1.0, 400, 1.5), (0.0, 1.0, 400, -3.0),
    (-3.0, 1e-9, 400, float(np.nextafter(np.float32(1e-9), np.float32(1)))),  # hi no float32: guess lands low
    (0.1, float(np.nextafter(np.nextafter(np.nextafter(np.nextafter(0.1, 1), 1), 1), 1)), 20, 0.0),  # no float32
])                                                                            # in range; thresholds repeat at lo
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clipped_scores_land_in_the_bin_of_the_clipped_value(lo, hi, num_t, score, dtype):
    thresholds = np.linspace(lo, hi, num_t)
    scores = np.array([score, score], dtype)
    labels = np.array([0, 1], np.uint8)
    hist, problems = _kernels.histogram_numpy(scores, labels, thresholds, True, 1)
    literal = np.searchsorted(thresholds, np.clip(scores.astype(np.float64), lo, hi), side="right") - 1
    assert not problems.any()
    assert hist[0].nonzero()[0].tolist() == [literal[0]] and hist[1].nonzero()[0].tolist() == [literal[1]]


@pytest.mark.parametrize("score_range", [(-1e308, 1e308), (0.0, 1000 * 5e-324)])
def test_score_ranges_without_an_ordered_float64_grid_are_refused(score_range):
    with pytest.raises(ValueError, match="overflow or are out of order"):
        PixelOODAccumulator(400, score_range)


def test_merge_refuses_different_thresholds():
    with pytest.raises(ValueError, match="different configurations"):
        PixelOODAccumulator(400).merge(PixelOODAccumulator(401))
    with pytest.raises(ValueError, match="different configurations"):
        PixelOODAccumulator(400) + PixelOODAccumulator(400, (0.0, 2.0))


def test_empty_state_and_bad_config():
    with pytest.raises(ValueError, match="empty"):
        PixelOODAccumulator().compute()
    with pytest.raises(ValueError, match="at least 2"):
        PixelOODAccumulator(1)
    with pytest.raises(ValueError, match="lo < hi"):
        PixelOODAccumulator(400, (1.0, 0.0))
    with pytest.raises(ValueError, match="lacks"):
        PixelOODAccumulator.from_state_dict({"hist": np.zeros((2, 400), np.int64)})
    state = PixelOODAccumulator().state_dict()
    state["hist"] = -state["hist"] - 1
    with pytest.raises(ValueError, match="non-negative"):
        PixelOODAccumulator.from_state_dict(state)


@pytest.mark.parametrize("labels,missing", [(np.zeros(5, np.uint8), "OOD"), (np.ones(5, np.uint8), "ID")])
def test_undefined_metrics_are_nan_with_a_reason(labels, missing):
    acc = PixelOODAccumulator().update(np.linspace(0, 1, 5), labels)
    with pytest.warns(UndefinedMetricWarning, match=f"no {missing}"):
        res = acc.compute()
    assert all(np.isnan(res[m]) for m in ("auroc", "auprc", "fpr95", "max_iou"))
    with pytest.warns(UndefinedMetricWarning):
        assert np.isnan(exact_metrics(np.linspace(0, 1, 5), labels)["auroc"])


def random_hists(seed, trials):
    """(trial, hist (2, B)) of random ID / OOD counts with ties, empty bins and counts up to 1e5, each set holding
    ID and OOD pixels."""
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        size = int(rng.integers(1, 80))
        hist = rng.integers(0, 5, (2, size)) * (rng.random((2, size)) < 0.6)
        if trial % 3 == 0:
            hist = rng.integers(0, 100000, (2, size))
        if trial % 7 == 0:
            hist[:, ::2] = 0  # empty bins
        if hist[0].sum() and hist[1].sum():
            yield trial, hist


def test_the_one_pass_bounds_equal_the_refined_curves_metrics():
    """The built-in metrics' bounds kernel against the generic path (each metric of the two refined curves)."""
    from segood.metrics.functional import metric_bounds, refined_bounds

    for trial, hist in random_hists(0, 200):
        fast, reference = metric_bounds(hist), refined_bounds(hist)
        for name, (lo, hi) in reference.items():
            assert fast[name] == pytest.approx((lo, hi), abs=1e-12), (trial, name)


def test_the_one_pass_metrics_equal_their_definitions():
    """The built-in metrics' numba pass (metrics_from_counts) against their definitions on arrays, on random
    curves with ties, empty bins and counts up to 1e5, and the same times 2^30 (where the ROC area's integer
    terms sum beyond 2^53 and its sum is compensated)."""
    from segood.metrics.functional import Curve, METRICS, metrics_from_counts

    rng = np.random.default_rng(1)
    for trial, hist in random_hists(1, 300):
        fp, tp = (np.cumsum(row[::-1])[::-1] << (30 if trial % 2 else 0) for row in hist)
        thresholds = np.sort(rng.random(tp.size)) + np.arange(tp.size)
        curve = Curve(thresholds, tp, fp, int(tp[0]), int(fp[0]))
        got = metrics_from_counts(thresholds, tp, fp, int(tp[0]), int(fp[0]))
        for name, metric in METRICS.items():
            assert got[name] == pytest.approx(metric.from_curve(curve), rel=1e-13, abs=1e-15), (trial, name)
        iou = tp / (tp[0] + fp)
        assert got["max_iou_threshold"] == thresholds[np.argmax(iou)]


def test_the_roc_area_is_its_exact_fraction_rounded():
    """AUROC of the one-pass metrics against the exact fraction S / 2NP (S: the trapezoids' integer sum, in Python
    integers): equal where every partial sum stays below 2^53 (plain float sums are exact there), within one ulp
    above it (counts times 2^30, and 50,000 bins of up to 2^34 pixels: the compensated sum)."""
    import itertools

    from segood.metrics._kernels import builtin_metrics

    long = np.random.default_rng(4).integers(0, 1 << 34, (2, 50_000))  # (a long sum: where compensation counts)
    for trial, hist in [*random_hists(3, 200), ("long", long)]:
        for shift in (0, 30) if trial != "long" else (0,):
            id_, ood = ([int(v) << shift for v in row] for row in hist)
            tp, fp = ([*itertools.accumulate(row[::-1])][::-1] + [0] for row in (ood, id_))  # pixels >= t_k
            area = sum(id_[k] * (tp[k] + tp[k + 1]) for k in range(len(id_)))
            exact = area / (2 * fp[0] * tp[0])  # (Python's int / int: the fraction, rounded once)
            got = builtin_metrics(np.array(tp[:-1]), np.array(fp[:-1]), tp[0], fp[0], False)[0]
            whole = 2 * fp[0] * tp[0] < 1 << 53
            assert got == exact if whole else abs(got - exact) <= np.spacing(exact), (trial, shift, got, exact)


def test_bounds_of_a_registered_metric_hold_its_value():
    """A metric registered anew (here AUROC and AUPRC as copies of the built-ins) takes the generic refined-curve
    bounds; those hold the reported value too, as the kernel's do."""
    import dataclasses

    from segood.metrics.functional import METRICS, metrics_from_counts, register_metric

    built_in = {name: METRICS[name] for name in ("auroc", "auprc")}
    try:
        for metric in built_in.values():
            register_metric(dataclasses.replace(metric), replace=True)
        for trial, hist in random_hists(2, 300):
            fp, tp = (np.cumsum(row[::-1])[::-1] for row in hist)
            got = metrics_from_counts(np.arange(tp.size, dtype=float), tp, fp, tp[0], fp[0], bounds=True)
            for name in METRICS:
                lo, hi = got["bounds"][name]
                assert lo <= got[name] <= hi, (trial, name, lo, got[name], hi)
    finally:
        for metric in built_in.values():
            register_metric(metric, replace=True)


def test_the_roc_polyline_ends_at_one_one_when_the_lowest_threshold_leaves_pixels_out():
    """metrics_from_counts with P and N above TP_0 and FP_0 (counts whose lowest threshold does not predict every
    pixel OOD): the ROC polyline still runs on from the last point to (1, 1), and that segment is area too."""
    from segood.metrics.functional import METRICS, Curve, metrics_from_counts

    thresholds, tp, fp = np.array([0.0, 1.0]), np.array([2, 1]), np.array([1, 0])
    # (0, 0) -> (0, 1/4) -> (1/2, 1/2) -> (1, 1): 0 + 3/16 + 3/8
    assert metrics_from_counts(thresholds, tp, fp, 4, 2)["auroc"] == 0.5625
    assert METRICS["auroc"].from_curve(Curve(thresholds, tp, fp, 4, 2)) == 0.5625
