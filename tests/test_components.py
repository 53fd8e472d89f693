"""Component-level metrics against a naive reference written from the definition (scipy-free: a flood fill),
on hand-drawn cases and random ones."""

import json

import numpy as np
import pytest

from segood.labels import IGNORE, OOD
from segood.metrics import FloatOrderAccumulator
from segood.metrics.components import TAUS, ComponentAccumulator, best_f1_threshold, frame_components


def naive_components(mask):
    """8-connected components of a bool mask by flood fill: a list of boolean masks."""
    seen = np.zeros(mask.shape, bool)
    out = []
    h, w = mask.shape
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        component = np.zeros(mask.shape, bool)
        stack = [(y0, x0)]
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            component[y, x] = True
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not seen[yy, xx]:
                        seen[yy, xx] = True
                        stack.append((yy, xx))
        out.append(component)
    return out


def naive_frame(prediction, ood_mask, min_pred, min_gt):
    """The definition in the official order: predicted components (ignore removed, small ones dropped) first, then
    the small ground-truth components become ignore, then sIoU and PPV on what is left."""
    valid = ood_mask != IGNORE
    predicted = [c for c in naive_components(prediction & valid) if c.sum() >= min_pred]
    truth = naive_components(ood_mask == OOD)
    for k in truth:
        if k.sum() < min_gt:
            valid &= ~k
    truth = [k for k in truth if k.sum() >= min_gt]
    predicted = [c & valid for c in predicted if (c & valid).any()]
    ood = np.zeros(ood_mask.shape, bool)
    for k in truth:
        ood |= k
    siou = []
    for k in truth:
        touching = [c for c in predicted if (c & k).any()]
        if not touching:
            siou.append(0.0)
            continue
        union_pred = np.any(touching, axis=0)
        others = union_pred & ood & ~k
        siou.append((k & union_pred).sum() / ((k | union_pred) & ~others).sum())
    ppv = [(c & ood).sum() / c.sum() for c in predicted]
    return np.array(siou), np.array(ppv)


def check(prediction, ood_mask, min_pred=1, min_gt=1):
    got = frame_components(prediction, ood_mask, min_pred=min_pred, min_gt=min_gt)
    want = naive_frame(prediction, ood_mask, min_pred, min_gt)
    for g, w in zip(got, want):  # component order may differ: compare sorted values
        np.testing.assert_allclose(np.sort(g), np.sort(w), rtol=1e-12)
    return got


def test_hand_drawn_cases():
    truth = np.zeros((20, 30), np.uint8)
    truth[2:6, 2:6] = OOD  # A: 16 px
    truth[2:6, 10:14] = OOD  # B: 16 px
    truth[14:18, 20:28] = OOD  # C: 32 px, nothing predicts it
    truth[0, 29] = OOD  # a 1-px component: ignore with min_gt 2
    truth[10, :] = IGNORE
    prediction = np.zeros(truth.shape, bool)
    prediction[3:5, 4:12] = True  # one predicted component touching A and B
    prediction[12:14, 0:3] = True  # one touching nothing
    prediction[9:12, 25:28] = True  # crosses the ignore row: split in two by it
    siou, ppv = check(prediction, truth, min_gt=2)
    # A: |A ∩ K| = 4, K = 16 px of which 4 in B (= A(k)): (16 + 16 - 4 - 4) = 24 -> 4/24
    assert sorted(siou.tolist()) == pytest.approx(sorted([4 / 24, 4 / 24, 0.0]))
    assert sorted(ppv.tolist()) == pytest.approx(sorted([8 / 16, 0.0, 0.0, 0.0]))
    siou, ppv = check(prediction, truth, min_pred=7, min_gt=2)  # only the 16-px component survives
    assert ppv.tolist() == [0.5]


def test_a_component_exactly_at_tau_reaches_it():
    """sIoU >= tau is a true positive and PPV < tau a false positive: a component at exactly 0.5 is a true positive
    (sIoU) and no false positive (PPV) at tau = 0.5; F1 at 0.25, 0.50, 0.75 and F1* by hand."""
    truth = np.zeros((12, 16), np.uint8)
    prediction = np.zeros(truth.shape, bool)
    truth[1, 1:5], prediction[1, 1:3] = OOD, True  # A: 2 of its 4 pixels found: sIoU 1/2, PPV 1
    truth[5, 1:3], prediction[5, 1:5] = OOD, True  # B: found with 2 ID pixels: sIoU 1/2, PPV 1/2
    truth[9, 1:7], prediction[9, 1:14] = OOD, True  # C: found with 7 ID pixels: sIoU 6/13, PPV 6/13
    siou, ppv = check(prediction, truth)
    assert sorted(siou.tolist()) == pytest.approx([6 / 13, 0.5, 0.5])
    assert sorted(ppv.tolist()) == pytest.approx([6 / 13, 0.5, 1.0])
    got = ComponentAccumulator(0.5, min_pred=1, min_gt=1).update(prediction.astype(float), truth).compute()
    assert got["taus"][5] == 0.5
    assert got["tp"] == [3] * 5 + [2] + [0] * 5
    assert got["fn"] == [0] * 5 + [1] + [3] * 5
    assert got["fp"] == [0] * 5 + [1] + [2] * 5
    assert (got["f1_25"], got["f1_50"], got["f1_75"]) == (1.0, pytest.approx(2 / 3), 0.0)
    assert got["f1_star"] == pytest.approx((5 + 2 / 3) / 11)
    assert got["siou"] == pytest.approx((1 + 6 / 13) / 3) and got["ppv"] == pytest.approx((1.5 + 6 / 13) / 3)


def test_the_background_is_never_a_small_ground_truth_component():
    """A frame nearly all OOD: its 3 ID pixels (fewer than min_gt) are background, not a small ground-truth
    component, so they stay counted."""
    truth = np.full((6, 6), OOD, np.uint8)
    truth[0, :3] = 0
    siou, ppv = check(np.ones(truth.shape, bool), truth, min_gt=10)
    assert siou.tolist() == pytest.approx([33 / 36]) and ppv.tolist() == pytest.approx([33 / 36])


def test_a_blob_joined_through_a_small_ground_truth_component_stays_one_component():
    """The official order: predicted components are formed before the small ground-truth components become ignore.

    Row 2 of a 5 x 11 frame is predicted at columns 0-9 (10 px). Ground truth: G = row 2, columns 0-2 (3 px, kept
    with min_gt 3) and S = row 2, columns 4-5 (2 px < min_gt: ignore). The blob's left part (columns 0-3) and right
    part (columns 6-9) touch only through S.
    - Formed first (ignore removed only), the blob is one component of 10 px >= min_pred 5: kept. Then S becomes
      ignore, leaving the component's 8 px of columns 0-3 and 6-9, of which G's 3 are OOD: PPV = 3 / 8 = 0.375.
    - sIoU(G) = |G ∩ K| / |(G ∪ K) \\ A(G)| = 3 / (3 + 8 - 3 - 0) = 3 / 8 = 0.375 (no other ground-truth component).
    - tau = 0.25, 0.30, 0.35: sIoU >= tau (TP 1, FN 0) and PPV >= tau (FP 0): F1 = 1. tau = 0.40 ... 0.75 (8 values):
      TP 0, FN 1, FP 1: F1 = 0. F1* = 3 / 11.
    Voiding S first (the old order) would split the blob into two 4-px components, both dropped: no prediction,
    sIoU 0 and F1 = 0 at every tau.
    """
    truth = np.zeros((5, 11), np.uint8)
    truth[2, 0:3] = OOD
    truth[2, 4:6] = OOD
    scores = np.zeros(truth.shape)
    scores[2, 0:10] = 1.0
    siou, ppv = frame_components(scores >= 0.5, truth, min_pred=5, min_gt=3)
    assert siou.tolist() == [0.375] and ppv.tolist() == [0.375]
    result = ComponentAccumulator(0.5, min_pred=5, min_gt=3).update(scores, truth).compute()
    assert (result["siou"], result["ppv"]) == (0.375, 0.375)
    assert (result["f1_25"], result["f1_50"], result["f1_75"]) == (1.0, 0.0, 0.0)
    assert result["f1_star"] == pytest.approx(3 / 11, abs=1e-15)
    assert (result["n_gt_components"], result["n_pred_components"]) == (1, 1)


def test_a_predicted_component_inside_a_small_ground_truth_component_is_no_component():
    truth = np.zeros((12, 12), np.uint8)
    truth[2:4, 2:4] = OOD  # 4 px < min_gt 5: ignore
    truth[8:11, 8:11] = OOD  # 9 px: counted
    prediction = np.zeros(truth.shape, bool)
    prediction[2:4, 2:4] = True  # 4 px >= min_pred 2, but every pixel of it becomes ignore
    siou, ppv = check(prediction, truth, min_pred=2, min_gt=5)
    assert siou.tolist() == [0.0] and ppv.size == 0


@pytest.mark.parametrize("seed", range(12))
def test_random_frames_equal_the_naive_reference(seed):
    rng = np.random.default_rng(seed)
    truth = np.zeros((40, 50), np.uint8)
    for _ in range(rng.integers(1, 6)):
        y, x, h, w = rng.integers(0, 35), rng.integers(0, 45), rng.integers(1, 12), rng.integers(1, 12)
        truth[y : y + h, x : x + w] = OOD
    truth[rng.random(truth.shape) < 0.05] = IGNORE
    scores = rng.random(truth.shape) + 0.6 * (truth == OOD)
    for min_pred, min_gt in ((1, 1), (5, 3), (20, 10)):
        check(scores > 0.9, truth, min_pred, min_gt)


def test_accumulator_pools_counts_over_frames():
    rng = np.random.default_rng(1)
    frames = []
    for _ in range(3):
        truth = np.zeros((40, 50), np.uint8)
        truth[5:15, 5:20] = OOD
        truth[25:35, 30:45] = OOD
        scores = rng.random(truth.shape) * 0.5 + 0.5 * (truth == OOD)
        frames.append((scores, truth))
    acc = ComponentAccumulator(0.6, min_pred=5, min_gt=5)
    siou_all, ppv_all = [], []
    for scores, truth in frames:
        acc.update(scores, truth)
        siou, ppv = naive_frame(scores >= 0.6, truth, 5, 5)
        siou_all += siou.tolist()
        ppv_all += ppv.tolist()
    result = acc.compute()
    tp = [sum(s >= t for s in siou_all) for t in TAUS]
    fn = [sum(s < t for s in siou_all) for t in TAUS]
    fp = [sum(p < t for p in ppv_all) for t in TAUS]
    assert (result["tp"], result["fn"], result["fp"]) == (tp, fn, fp)
    f1 = [2 * a / (2 * a + b + c) for a, b, c in zip(tp, fn, fp)]
    assert result["f1_star"] == pytest.approx(np.mean(f1)) and result["f1_50"] == pytest.approx(f1[5])
    assert result["siou"] == pytest.approx(np.mean(siou_all)) and result["ppv"] == pytest.approx(np.mean(ppv_all))
    assert result["threshold_source"] == "committed" and result["n_frames"] == 3
    obstacle = ComponentAccumulator(0.5, "obstacle")
    assert (obstacle.min_pred, obstacle.min_gt) == (50, 10) and np.isnan(obstacle.compute()["f1_star"])


def test_a_component_state_carries_its_settings(tmp_path):
    """copy(), save() / load() and merge keep the threshold, its source and the size filters; states of other
    settings do not merge (a committed threshold's counts and an oracle's are not one result)."""
    rng = np.random.default_rng(2)
    truth = np.zeros((2, 30, 40), np.uint8)
    truth[:, 5:15, 5:20] = OOD
    scores = rng.random(truth.shape) * 0.5 + 0.5 * (truth == OOD)
    acc = ComponentAccumulator(0.6, "obstacle", min_gt=3, threshold_source="oracle").update(scores[0], truth[0])
    acc.save(tmp_path / "c.npz")
    for restored in (acc.copy(), ComponentAccumulator.load(tmp_path / "c.npz")):
        assert restored.compute() == acc.compute()
        assert restored.compute()["threshold_source"] == "oracle" and (restored.min_pred, restored.min_gt) == (50, 3)
    other = ComponentAccumulator(0.6, "obstacle", min_gt=3, threshold_source="oracle").update(scores[1], truth[1])
    assert acc.copy().merge(other).compute() == ComponentAccumulator(
        0.6, "obstacle", min_gt=3, threshold_source="oracle").update(scores, truth).compute()
    with pytest.raises(ValueError, match="different thresholds or size filters"):
        acc.merge(ComponentAccumulator(0.5, "obstacle", min_gt=3, threshold_source="oracle"))
    with pytest.raises(ValueError, match="'threshold_source' is oracle vs committed"):
        acc.merge(ComponentAccumulator(0.6, "obstacle", min_gt=3))
    with pytest.raises(ValueError, match="unknown state format"):
        ComponentAccumulator.from_state_dict({**acc.state_dict(), "format": np.array("other/1")})


def test_best_f1_threshold_is_the_pixel_f1_maximiser():
    rng = np.random.default_rng(2)
    labels = (rng.random(5000) < 0.2).astype(np.uint8)
    scores = rng.random(5000) + 0.5 * labels
    result = FloatOrderAccumulator(14).update(scores, labels).compute()
    t = best_f1_threshold(result)
    candidates = np.unique(scores)

    def f1(threshold):
        predicted = scores >= threshold
        tp = np.sum(predicted & (labels == 1))
        return 2 * tp / (2 * tp + np.sum(predicted & (labels == 0)) + np.sum(~predicted & (labels == 1)))

    assert f1(t) >= max(f1(c) for c in candidates) - 1e-3  # binning at 2^-14 relative
    with pytest.raises(ValueError, match="unknown preset"):
        ComponentAccumulator(0.5, "road")


def test_component_metrics_in_an_evaluation_equal_the_accumulator(noise_sets, tmp_path):
    import torch

    from segood.data.h5 import H5SegmentationDataset
    from segood.evaluation import Evaluation, evaluate
    from segood.models import build_model, preprocess

    sets = noise_sets(kinds=("perlin",), seed=2, side=64)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    components = {"preset": "obstacle", "thresholds": {"entropy": 0.001}, "source": "committed"}
    doc = evaluate(model, [sets / "perlin_mixed.h5"], ["entropy", "max_softmax"], tmp_path / "run",
                   components=components, batch_size=2, progress=False, figures=False)
    got = doc["results"]["entropy"]["perlin_mixed"]["components"]
    reference = ComponentAccumulator(0.001, "obstacle")
    for item in H5SegmentationDataset(sets / "perlin_mixed.h5"):
        from segood.methods import get_method

        reference.update(get_method("entropy").score(model, preprocess(item["image"][None]))[0], item["ood_mask"][None])
    want = reference.compute()
    assert got["tp"] == want["tp"] and got["fp"] == want["fp"] and got["n_frames"] == reference.n_frames == 4
    assert "components" not in doc["results"]["max_softmax"]["perlin_mixed"]  # no threshold given for it
    assert "## Component-level metrics (SMIYC" in (tmp_path / "run" / "results.md").read_text()
    restored = Evaluation.load(tmp_path / "run" / "state.npz")  # saved and reloaded with the run
    assert restored.comp[("entropy", "perlin_mixed")].compute()["tp"] == want["tp"]
    with pytest.raises(ValueError, match="components must be"):
        evaluate(model, [sets / "perlin_mixed.h5"], ["entropy"], tmp_path / "bad", components={"preset": "road",
                                                                                             "thresholds": {}})


def test_component_metrics_from_the_command_line(noise_sets, tmp_path, capsys):
    import json

    import torch

    from segood.cli import main
    from segood.models import build_model, save_checkpoint

    sets = noise_sets(kinds=("perlin",), seed=2, side=64)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", build_model("pspnet", "resnet18"))
    (tmp_path / "t.json").write_text(json.dumps({"entropy": {"perlin_mixed": 0.001}}))
    base = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets / "perlin_mixed.h5"),
            "--methods", "entropy", "-v", "--components", "obstacle"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 2
    assert "the component metrics need a threshold per method: commit it on a tuning set of the run (--commit-on SET" \
        in capsys.readouterr().err
    assert main([*base, "--component-thresholds", str(tmp_path / "t.json"), "--oracle-thresholds",
                 "--out", str(tmp_path / "b")]) == 0
    assert "thresholds ORACLE: tuned on the test set itself)" in capsys.readouterr().out
    for given, error in [('{"entropyy": 0.001}', "name none of the run's methods ['entropy'] on its sets"),
                         ('{"entropy": NaN}', "a component threshold must be a number"),
                         ('{"entropy": "0.1"}', "a component threshold must be a number")]:
        (tmp_path / "t.json").write_text(given)  # (a misspelt method had no component metrics, silently)
        assert main([*base, "--component-thresholds", str(tmp_path / "t.json"), "--out", str(tmp_path / "c")]) == 2
        assert error in capsys.readouterr().err
    (tmp_path / "t.json").write_text('{"entropy": 0.001, "energy": 0.5}')  # a file of more methods than the run's
    with pytest.warns(UserWarning, match="component thresholds of energy left unused"):
        assert main([*base, "--component-thresholds", str(tmp_path / "t.json"), "--out", str(tmp_path / "d")]) == 0


def test_combined_runs_keep_their_component_metrics(noise_sets, tmp_path):
    import torch

    from segood.evaluation import combine_runs, evaluate
    from segood.models import build_model

    sets = noise_sets(kinds=("perlin",), seed=2, side=64)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    runs = []
    for method in ("entropy", "max_softmax"):
        runs.append(tmp_path / method)
        evaluate(model, [sets / "perlin_mixed.h5"], [method], runs[-1], progress=False, figures=False,
                 components={"preset": "obstacle", "thresholds": {method: 0.001}})
    doc = combine_runs(runs, tmp_path / "combined", figures=False)
    assert all("components" in doc["results"][m]["perlin_mixed"] for m in ("entropy", "max_softmax"))
    for run, method in zip(runs, ("entropy", "max_softmax")):  # each method's network time: its own run's
        alone = json.loads((run / "results.json").read_text())["timings"]["per_method"][method]
        assert doc["timings"]["per_method"][method]["inference_ms_per_image"] == alone["inference_ms_per_image"]


def test_the_threshold_is_compared_in_float64_as_the_pixel_metrics_compare():
    """A float32 score one float64 step below the threshold is not predicted OOD (in float32 the two are equal)."""
    score = np.float32(0.3)
    threshold = float(np.nextafter(np.float64(score), 1.0))
    assert np.float32(threshold) == score  # the comparison in float32 would predict every pixel
    labels = np.zeros((40, 40), np.uint8)
    labels[10:30, 10:30] = OOD
    acc = ComponentAccumulator(threshold, min_pred=1, min_gt=1)
    acc.update(np.full((40, 40), score, np.float32), labels)
    assert acc.compute()["n_pred_components"] == 0
    acc = ComponentAccumulator(float(score), min_pred=1, min_gt=1)
    acc.update(np.full((40, 40), score, np.float32), labels)
    assert acc.compute()["n_pred_components"] == 1
