"""CalibrationAccumulator against a naive per-pixel reference, its CPU kernel against its torch operations; merge,
split and save invariance."""

import numpy as np
import pytest
import torch

from segood.metrics.calibration import CalibrationAccumulator


def naive(probs, target, num_bins=15):
    """The literal definitions, pixel by pixel: ECE over bins (k/B, (k+1)/B] (the first closed at 0), Brier."""
    probs, target = np.asarray(probs, np.float64), np.asarray(target)
    members = [[] for _ in range(num_bins)]
    brier, n = 0.0, 0
    for i in range(probs.shape[0]):
        for y in range(probs.shape[2]):
            for x in range(probs.shape[3]):
                t = int(target[i, y, x])
                if t == 255:
                    continue
                p = probs[i, :, y, x]
                confidence = float(np.float32(p.max()))
                predicted = int(np.argmax(p))  # the first maximum
                k = next(k for k in range(num_bins) if confidence <= (k + 1) / num_bins or k == num_bins - 1)
                members[k].append((confidence, predicted == t))
                brier += sum((p[c] - (c == t)) ** 2 for c in range(len(p)))
                n += 1
    ece = sum(len(m) / n * abs(np.mean([h for _, h in m]) - np.mean([c for c, _ in m])) for m in members if m)
    return ece, brier / n


def random_case(seed, n=2, c=5, h=6, w=7, sharp=3.0):
    rng = np.random.default_rng(seed)
    probs = torch.softmax(torch.from_numpy(rng.normal(0, sharp, (n, c, h, w))).float(), dim=1)
    target = rng.integers(0, c, (n, h, w))
    target[rng.random((n, h, w)) < 0.2] = 255
    return probs, torch.from_numpy(target)


@pytest.mark.parametrize("seed", range(4))
def test_ece_and_brier_equal_the_naive_reference(seed):
    probs, target = random_case(seed)
    got = CalibrationAccumulator().update(probs, target).compute()
    ece, brier = naive(probs.numpy(), target.numpy())
    assert got["ece"] == pytest.approx(ece, abs=1e-6) and got["brier"] == pytest.approx(brier, abs=1e-6)
    assert got["n_pixels"] == int((target != 255).sum())


@pytest.mark.parametrize("seed", range(3))
def test_the_cpu_kernel_counts_what_the_torch_operations_count(seed):
    probs, target = random_case(seed, n=3, c=19, h=9, w=40, sharp=1.0 + seed)
    probs[0, :, 0, :5] = torch.tensor([1.0] + [0.0] * 18)[:, None]  # confidence 1, on the last bin's edge
    probs[1, :3, 1, :4] = 0.5  # ties: the first class wins
    probs[2, :, 2, 0] = 1 / 15  # every class equal, at a bin edge (as float32 rounds it)
    for target_of in (lambda t: t, lambda t: t.to(torch.uint8)):  # (the runner's classes are uint8)
        host = CalibrationAccumulator().update(probs, target_of(target))
        device = CalibrationAccumulator()._update_torch(probs, target)
        for key in ("count", "correct", "confidence"):
            np.testing.assert_array_equal(getattr(host, key), getattr(device, key))
        assert host.brier == pytest.approx(device.brier, rel=1e-12)
    strided = probs.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)  # not C-contiguous
    np.testing.assert_array_equal(CalibrationAccumulator().update(strided, target).confidence, host.confidence)
    ignored_nan = probs.clone()
    y, x = (int(v[0]) for v in torch.nonzero(target[1] == 255, as_tuple=True))
    ignored_nan[1, 7, y, x] = float("nan")  # one class's NaN where no pixel counts: still refused
    for update in (CalibrationAccumulator().update, CalibrationAccumulator()._update_torch):
        with pytest.raises(ValueError, match="NaN or infinite"):
            update(ignored_nan, target)
        with pytest.raises(ValueError, match="target classes must be in 0..18 or 255"):
            update(probs, torch.where(target == 255, 255, 19))


def test_edges_and_ties():
    # confidences exactly on bin edges (k/15 falls in bin k-1), ties between classes (the first one wins), 1.0
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5], [2 / 3, 1 / 3], [0.2, 0.8]]).T.reshape(1, 2, 1, 4)
    target = torch.tensor([[[0, 1, 0, 1]]])
    got = CalibrationAccumulator().update(probs, target).compute()
    ece, brier = naive(probs.numpy(), target.numpy())
    assert got["ece"] == pytest.approx(ece, abs=1e-7) and got["brier"] == pytest.approx(brier, abs=1e-7)
    assert got["bins"]["count"][14] == 1 and got["bins"]["count"][7] == 1 and sum(got["bins"]["count"]) == 4
    assert got["bins"]["accuracy"][7] == 0.0  # the tie at 0.5 predicts class 0, the target is 1


def test_confidences_on_the_bin_edges_of_four_bins():
    """With 4 bins, 0.5 and 0.75 are exact bin edges (k/B falls in bin k - 1); of 15 bins no float32 confidence
    but 1.0 sits on an edge, so the edge cases need another bin count."""
    probs = torch.tensor([[0.5, 0.5], [0.75, 0.25], [0.25, 0.75], [1.0, 0.0]]).T.reshape(1, 2, 1, 4)
    target = torch.tensor([[[0, 0, 1, 1]]])
    for update in (CalibrationAccumulator(4).update, CalibrationAccumulator(4)._update_torch):
        got = update(probs, target).compute()
        assert got["bins"]["count"] == [0, 1, 2, 1]
        # bin 1: confidence 0.5, right; bin 2: 0.75, both right; bin 3: 1.0, wrong
        assert got["ece"] == pytest.approx(0.5 / 4 + 0.25 * 2 / 4 + 1.0 / 4, abs=1e-12)
        assert got["brier"] == pytest.approx((0.5 + 0.125 + 0.125 + 2.0) / 4, abs=1e-12)


def test_perfectly_confident_and_right_is_zero_and_all_ignored_is_undefined():
    probs = torch.zeros(1, 3, 2, 2)
    probs[:, 1] = 1
    assert CalibrationAccumulator().update(probs, torch.ones(1, 2, 2, dtype=torch.long)).compute()["ece"] == 0.0
    empty = CalibrationAccumulator().update(probs, torch.full((1, 2, 2), 255)).compute()
    assert np.isnan(empty["ece"]) and np.isnan(empty["brier"]) and empty["n_pixels"] == 0


def test_split_merge_and_saved_state_equal_one_pass(tmp_path):
    probs, target = random_case(7, n=4)
    whole = CalibrationAccumulator().update(probs, target)
    parts = [CalibrationAccumulator().update(probs[i : i + 1], target[i : i + 1]) for i in range(4)]
    merged = parts[0]
    for part in parts[1:]:
        merged.merge(part)
    for key in ("count", "correct"):
        assert (getattr(merged, key) == getattr(whole, key)).all()
    assert merged.compute()["ece"] == pytest.approx(whole.compute()["ece"], abs=1e-12)
    assert merged.compute()["brier"] == pytest.approx(whole.compute()["brier"], abs=1e-12)
    whole.save(tmp_path / "cal.npz")
    loaded = CalibrationAccumulator.load(tmp_path / "cal.npz")
    assert loaded.compute()["ece"] == whole.compute()["ece"] and loaded.compute()["brier"] == whole.compute()["brier"]
    with np.load(tmp_path / "cal.npz", allow_pickle=False) as f:
        assert {k: f[k].dtype.kind for k in f.files} == {"format": "U", "count": "i", "correct": "i",
                                                        "confidence": "f", "brier": "f"}


def test_bad_inputs_and_states_are_clear_errors():
    probs, target = random_case(0)
    with pytest.raises(ValueError, match=r"probs must be \(N, C, H, W\)"):
        CalibrationAccumulator().update(probs[0], target)
    with pytest.raises(ValueError, match="target classes must be in 0..4 or 255"):
        CalibrationAccumulator().update(probs, torch.full_like(target, 7))
    with pytest.raises(ValueError, match="NaN"):
        CalibrationAccumulator().update(probs * float("nan"), target)
    state = CalibrationAccumulator().update(probs, target).state_dict()
    with pytest.raises(ValueError, match="impossible"):
        CalibrationAccumulator.from_state_dict({**state, "correct": state["count"] + 1})
    with pytest.raises(ValueError, match="lacks 'brier'"):
        CalibrationAccumulator.from_state_dict({k: v for k, v in state.items() if k != "brier"})
    with pytest.raises(ValueError, match="15 bins"):
        CalibrationAccumulator().merge(CalibrationAccumulator(10))
