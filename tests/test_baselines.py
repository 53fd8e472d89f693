"""Today's baselines (max logit, energy, standardized max logit with its post-processing) against their
definitions, written out as slow loops; and their unbounded scores through evaluate on the float-order grid."""

import numpy as np
import pytest
import torch

from segood.data.h5 import H5SegmentationDataset
from segood.evaluation import evaluate
from segood.methods import functional as fn
from segood.methods import get_method
from segood.models import preprocess

from networks import tiny_network


def test_max_logit_and_energy_equal_their_definitions():
    torch.manual_seed(0)
    logits = torch.randn(2, 19, 5, 7, dtype=torch.float64) * 6
    f = logits.numpy()
    np.testing.assert_allclose(fn.max_logit(logits).numpy(), -f.max(axis=1))
    for t in (1.0, 2.5):
        z = f / t
        top = z.max(axis=1, keepdims=True)
        lse = (top + np.log(np.exp(z - top).sum(axis=1, keepdims=True)))[:, 0]
        np.testing.assert_allclose(fn.energy(logits, t).numpy(), -t * lse, rtol=1e-12)
    with pytest.raises(ValueError, match="temperature must be positive"):
        get_method("energy", temperature=0)


def naive_boundary_suppression(scores, classes, width=4, iterations=4):
    """The definition, pixel by pixel: boundaries where a 3x3 window (clamped at the border) holds two classes;
    each step dilates them by a diamond of width - 1 - i (0 at the last) and gives each pixel of the region the
    mean of the non-region pixels of its 3x3 window (replicating the border), where there is one."""
    h, w = scores.shape

    def window(y, x):
        return [(min(max(y + dy, 0), h - 1), min(max(x + dx, 0), w - 1)) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]

    boundary = np.array([[len({classes[p] for p in window(y, x)}) > 1 for x in range(w)] for y in range(h)])
    out = scores.astype(np.float64).copy()
    for i in range(iterations):
        radius = 0 if i == iterations - 1 else width - (width // iterations) * i - 1
        region = np.array([[any(boundary[yy, xx] for yy in range(max(0, y - radius), min(h, y + radius + 1))
                                for xx in range(max(0, x - radius), min(w, x + radius + 1))
                                if abs(yy - y) + abs(xx - x) <= radius) for x in range(w)] for y in range(h)])
        new = out.copy()
        for y in range(h):
            for x in range(w):
                if region[y, x]:
                    values = [out[p] for p in window(y, x) if not region[p]]
                    if values:
                        new[y, x] = np.mean(values)
        out = new
    return out


def test_boundary_suppression_equals_the_definition():
    rng = np.random.default_rng(0)
    classes = np.zeros((14, 17), np.int64)
    classes[:, 9:] = 1
    classes[3:7, 2:5] = 2
    scores = rng.normal(size=classes.shape)
    got = fn.boundary_suppression(torch.from_numpy(scores)[None].float(), torch.from_numpy(classes)[None])[0]
    np.testing.assert_allclose(got.numpy(), naive_boundary_suppression(scores, classes), rtol=1e-5, atol=1e-5)


def test_dilated_smoothing_equals_the_definition():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(9, 11))
    size, sigma, dilation = 7, 1.0, 2
    axis = np.arange(size) - 3
    kernel = np.exp(-(axis[:, None] ** 2 + axis[None, :] ** 2) / (2 * sigma**2))
    kernel /= kernel.sum()
    want = np.zeros_like(scores)
    for y in range(9):
        for x in range(11):
            want[y, x] = sum(kernel[k, m] * scores[min(max(y + (k - 3) * dilation, 0), 8),
                                                   min(max(x + (m - 3) * dilation, 0), 10)]
                             for k in range(size) for m in range(size))
    got = fn.dilated_smoothing(torch.from_numpy(scores)[None].float(), size, sigma, dilation)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets(seed=5)


def test_sml_statistics_and_score_equal_their_definitions(sets):
    model = tiny_network()
    data = H5SegmentationDataset(sets / "cs.h5")
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    sml = get_method("sml").fit(model, loader)
    with torch.no_grad():
        logits = torch.cat([model(preprocess(b["image"])).logits for b in loader]).double()
    top, classes = logits.max(dim=1)
    for c in range(19):
        chosen = top[classes == c].numpy()
        if chosen.size > 1:
            assert sml.state["means"][c].item() == pytest.approx(chosen.mean(), rel=1e-9)
            assert sml.state["stds"][c].item() == pytest.approx(chosen.std(), rel=1e-6)
        else:
            assert (sml.state["means"][c].item(), sml.state["stds"][c].item()) == (0.0, 1.0)
    odd = [{"image": b["image"][..., :60, :60]} for b in loader]  # sides the network's stride (8) does not divide
    fitted = get_method("sml").fit(model, odd)
    with torch.no_grad():  # scored as score_batch scores: zero-padded at the bottom and right to 64, cropped back
        logits = torch.cat([model(torch.nn.functional.pad(preprocess(b["image"]), (0, 4, 0, 4))).logits[
            ..., :60, :60] for b in odd]).double()
    top, classes = logits.max(dim=1)
    present = [c for c in range(19) if (classes == c).sum() > 1]
    assert present and all(fitted.state["means"][c].item() == pytest.approx(top[classes == c].mean().item(), rel=1e-9)
                           for c in present)
    x = preprocess(data[0]["image"][None])
    with torch.no_grad():
        z = model(x).logits
    t, k = z.max(dim=1)
    want = -(t.double() - sml.state["means"][k]) / sml.state["stds"][k]
    torch.testing.assert_close(sml.score(model, x)[0].double(), want, rtol=1e-5, atol=1e-5)
    post = get_method("sml", boundary_suppression=True, smoothing=True).load_state(sml.state_arrays())
    torch.testing.assert_close(post.score(model, x)[0], fn.dilated_smoothing(fn.boundary_suppression(
        want.float(), k)), rtol=1e-4, atol=1e-4)


class FixedLogits(torch.nn.Module):
    """Returns the same logits for every input (a parameter only to give it a device)."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.unused = logits, torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.logits.expand(len(x), -1, -1, -1)


def test_sml_statistics_of_classes_predicted_on_two_pixels_one_and_none():
    """Max logits 1 and 5 of class 0 (mean 3, std 2 over the pixels), 7 of class 1 on one pixel (mean 0, std 1:
    no spread to measure), class 2 never predicted (0, 1), 4 and 4 of class 3 (mean 4, all tied: std 1)."""
    logits = torch.full((1, 4, 1, 5), -10.0)
    for pixel, (c, value) in enumerate([(0, 1.0), (0, 5.0), (1, 7.0), (3, 4.0), (3, 4.0)]):
        logits[0, c, 0, pixel] = value
    sml = get_method("sml").fit(FixedLogits(logits), [{"image": torch.zeros(1, 3, 1, 5)}])
    assert sml.state["means"].tolist() == [3.0, 0.0, 0.0, 4.0]
    assert sml.state["stds"].tolist() == [2.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="feature_layer"):  # (an AttributeError deep in the fit before)
        get_method("mahalanobis").fit(FixedLogits(logits), [{"image": torch.zeros(1, 3, 1, 5)}])


def test_unbounded_baselines_through_evaluate(sets, tmp_path):
    model = tiny_network()
    doc = evaluate(model, [sets / "perlin_mixed.h5"], ["max_logit", "energy", "sml"], tmp_path / "run",
                   fit_set=sets / "cs.h5", progress=False, figures=True)
    for name in ("max_logit", "energy", "sml"):
        assert 0 <= doc["results"][name]["perlin_mixed"]["pooled"]["auroc"] <= 1
    assert (tmp_path / "run" / "figures" / "examples_perlin_mixed.png").stat().st_size > 0
    with pytest.raises(ValueError, match="max_logit scores are unbounded; the linear grid bins scores in"):
        evaluate(model, [sets / "perlin_mixed.h5"], ["max_logit"], tmp_path / "linear", num_thresholds=400,
                 progress=False)
