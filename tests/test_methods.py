"""The seven methods: formulas on hand-built tensors, scorers on tiny real networks, fair tuning."""

import math

import numpy as np
import pytest
import torch

from segood.data.h5 import H5SegmentationDataset, set_identity
from segood.methods import (MASK_HEADS, METHODS, ClassFeatureStats, entropy, get_method, max_softmax, method_for_grid,
                            mutual_info, odin, odin_spread, varsum)
from segood.methods import functional
from segood.methods.functional import mahalanobis_min_distance, whiten_means
from segood.methods.methods import MonteCarlo, Needs, list_methods, register_method
from segood.methods.schedule import score_batch
from segood.methods.tuning import same_source_tuning, tune
from segood.metrics import FloatOrderAccumulator, grid_spec, make_accumulator
from segood.models import build_model, predict, preprocess

from networks import tiny_network

C = 19


def logits_mix(alpha):
    """Logits whose softmax is (1 - alpha) one-hot + alpha uniform, shape (1, C, 1, 1)."""
    p = torch.full((C,), alpha / C)
    p[3] += 1 - alpha
    return torch.log(p.clamp_min(1e-30)).view(1, C, 1, 1)


def test_single_pass_formulas_bounds_and_monotonicity():
    confident, uniform = logits_mix(0.0), torch.zeros(1, C, 1, 1)
    for score in (lambda z: max_softmax(z.softmax(1)), lambda z: entropy(z.softmax(1)), lambda z: odin(z, 1.0)):
        assert score(confident).item() == pytest.approx(0.0, abs=1e-6)
        values = [score(logits_mix(a)).item() for a in np.linspace(0, 1, 11)]
        assert all(b > a for a, b in zip(values, values[1:]))  # more uniform, more OOD
        assert all(0.0 <= v <= 1.0 for v in values)
    assert max_softmax(uniform.softmax(1)).item() == pytest.approx(1 - 1 / C)
    assert entropy(uniform.softmax(1)).item() == pytest.approx(1.0)
    z = torch.randn(2, C, 5, 7) * 3
    torch.testing.assert_close(odin(z, 1.0), max_softmax(z.softmax(1)))
    assert (odin(z, 1000.0) >= odin(z, 1.0) - 1e-6).all()  # a higher temperature flattens the softmax


def test_monte_carlo_formulas():
    p = torch.randn(1, 2, C, 3, 3).softmax(dim=2).expand(6, 2, C, 3, 3)  # six identical samples
    assert varsum(p).abs().max() < 1e-6 and mutual_info(p).abs().max() < 1e-6
    one_hot = torch.eye(2).view(2, 1, 2, 1, 1)  # two samples that disagree completely, C = 2
    assert varsum(one_hot).item() == pytest.approx(1.0) and mutual_info(one_hot).item() == pytest.approx(1.0)
    random = torch.randn(8, 2, C, 4, 4).softmax(dim=2)
    for score in (varsum(random), mutual_info(random)):
        assert (score >= 0).all() and (score <= 1).all() and score.max() > 0


def test_streaming_class_statistics_equal_a_one_shot_numpy_fit():
    rng = np.random.default_rng(0)
    d, h, w = 3, 2, 2
    feats = rng.normal(size=(12, d, h, w))
    labels = rng.integers(0, 2, (12, h, w))
    stats = ClassFeatureStats(2)
    for k in range(0, 12, 5):  # uneven batches
        stats.update(torch.from_numpy(feats[k : k + 5]), torch.from_numpy(labels[k : k + 5]))
    means, whiten, present = stats.finalize(ridge=0.0)
    f = feats.transpose(0, 2, 3, 1)
    for c in range(2):
        mu = np.stack([[f[labels[:, i, j] == c, i, j].mean(0) for j in range(w)] for i in range(h)])
        np.testing.assert_allclose(means[c].numpy(), mu, atol=1e-12)
        centred = np.concatenate([f[labels[:, i, j] == c, i, j] - mu[i, j] for i in range(h) for j in range(w)])
        cov = centred.T @ centred / len(centred)
        inv = whiten[c].numpy().T @ whiten[c].numpy()  # L^-T L^-1 = Sigma^-1
        np.testing.assert_allclose(inv, np.linalg.inv(cov), rtol=1e-9)
    assert present.all()


def test_mahalanobis_recovers_gaussian_classes():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [10.0, 0.0]])
    labels = rng.integers(0, 2, (400, 1, 1))
    feats = centres[labels[:, 0, 0]] + rng.normal(size=(400, 2)) * [1.0, 0.3]
    stats = ClassFeatureStats(2)
    stats.update(torch.from_numpy(feats[:, :, None, None]), torch.from_numpy(labels))
    means, whiten, present = stats.finalize()
    probe = torch.tensor([[0.0, 0.0], [10.0, 0.0], [5.0, 0.0], [0.0, 3.0], [0.0, 30.0]])[:, :, None, None].double()
    m = mahalanobis_min_distance(probe, whiten, whiten_means(means, whiten), present)[:, 0, 0]
    assert m[0] < 0.2 and m[1] < 0.2  # at a class centre
    assert m[3] == pytest.approx(10.0, rel=0.15)  # 3 units along the axis with std 0.3
    assert m[0] < m[2] < m[3] < m[4]  # further from every class, higher
    unlabelled = ClassFeatureStats(2)
    unlabelled.update(torch.from_numpy(feats[:, :, None, None]), torch.full((400, 1, 1), 255))
    with pytest.raises(ValueError, match="no class has more labelled feature-map pixels than the 2 feature channels: 0 in all"):
        unlabelled.finalize()


@pytest.mark.parametrize("band_elements", [1 << 19, 5 * 2 * C * 7])  # one band; bands of 1 row
def test_monte_carlo_scores_equal_the_probability_forms(band_elements, monkeypatch):
    monkeypatch.setattr(predict, "_BAND_ELEMENTS", band_elements)
    torch.manual_seed(1)
    logits = torch.randn(5, 2, C, 4, 7) * 3  # T = 5 samples
    probs = logits.softmax(dim=2)
    out = functional.monte_carlo_scores(logits)
    torch.testing.assert_close(out["varsum"], varsum(probs))
    torch.testing.assert_close(out["mutual_info"], mutual_info(probs))
    assert torch.equal(out["classes"], probs.mean(dim=0).argmax(dim=1))
    assert set(functional.monte_carlo_scores(logits, ("varsum",))) == {"varsum"}


def reference_min_distance(features, means, whiten, present):
    """The obviously-correct form: for each location and class, sqrt((f - mu)^T Sigma^-1 (f - mu)), then min."""
    f = features.permute(0, 2, 3, 1).numpy()  # (N, h, w, D)
    inverse = [w.T @ w for w in whiten.numpy()]  # whiten^T whiten = L^-T L^-1 = Sigma^-1
    out = np.full(f.shape[:3], np.inf)
    for n, i, j in np.ndindex(*f.shape[:3]):
        for c in range(len(inverse)):
            if present[c, i, j]:
                diff = f[n, i, j] - means[c, i, j].numpy()
                out[n, i, j] = min(out[n, i, j], np.sqrt(diff @ inverse[c] @ diff))
    return out


@pytest.mark.parametrize("distance_elements", [1 << 19, 3 * 4 * 5])  # one step; steps of one location
def test_mahalanobis_distance_equals_the_definition(distance_elements, monkeypatch):
    monkeypatch.setattr(functional, "_DISTANCE_ELEMENTS", {"cpu": distance_elements})
    rng = np.random.default_rng(2)
    n, d, h, w, c = 3, 5, 4, 3, 4
    features = torch.from_numpy(rng.normal(size=(n, d, h, w)))
    means = torch.from_numpy(rng.normal(size=(c, h, w, d)))
    whiten = torch.from_numpy(np.tril(rng.normal(size=(c, d, d))) + 3 * np.eye(d))
    present = torch.from_numpy(rng.random((c, h, w)) < 0.7)
    present[:, 0, 0] = False  # no class seen there: inf
    got = mahalanobis_min_distance(features, whiten, whiten_means(means, whiten), present)
    np.testing.assert_allclose(got.numpy(), reference_min_distance(features, means, whiten, present), rtol=1e-12)
    assert torch.isinf(got[:, 0, 0]).all()


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets()


def loader(path, batch_size=2):
    return torch.utils.data.DataLoader(H5SegmentationDataset(path), batch_size=batch_size)


@pytest.mark.parametrize("name", sorted(n for n in METHODS if METHODS[n].head not in MASK_HEADS))
def test_every_method_scores_a_real_network_in_range(name, sets):  # (mask-level ones: test_model_adapters.py)
    method = get_method(name)
    head = method.head or "plain"
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head=head).eval()
    if method.needs.fit:
        method.fit(model, loader(sets / "cs.h5"))
        restored = get_method(name).load_state(method.state_arrays())
    batch = next(iter(loader(sets / "perlin_mixed.h5", 4)))
    x = preprocess(batch["image"])
    scores, classes = method.score(model, x)
    assert scores.shape == classes.shape == (4, 64, 64)
    lo, hi = method.score_range or (-float("inf"), float("inf"))  # unbounded: mahalanobis, the baselines
    assert torch.isfinite(scores).all() and scores.min() >= lo and scores.max() <= hi and classes.max() < C
    if method.needs.fit:
        torch.testing.assert_close(restored.score(model, x)[0], scores)
    acc = make_accumulator().update(scores, batch["ood_mask"])
    assert 0 <= acc.compute()["auroc"] <= 1


@pytest.mark.parametrize("name", ["mahalanobis", "confidence", "varsum", "mutual_info"])
def test_methods_refuse_a_network_without_their_head(name):
    model = build_model("pspnet", "resnet18", head="plain").eval()
    head = get_method(name).head
    with pytest.raises(ValueError, match=rf"needs a network with the {head!r} head; this one serves \['plain'\]. "
                                         rf"Build it with build_model\(\.\.\., head={head!r}\) \(segood train "
                                         rf"--head {head}\) and train it, or choose another method$"):
        get_method(name).score(model, torch.zeros(1, 3, 32, 32))


class MeanMaxProb(MonteCarlo):
    """A dropout method of its own (not one of the built-in banded ones): 1 - max of the mean softmax."""

    name = "mean_max_prob"

    def from_samples(self, logits):
        return 1 - logits.softmax(dim=2).mean(dim=0).amax(dim=1)


def test_score_batch_schedules_from_the_declared_needs(sets):
    """One call for a batch of methods gives what each method's own passes give: the shared forward pass,
    one set of dropout samples (the largest count, its prefixes for the smaller ones), perturbed passes."""
    model = tiny_network("dropout")
    x = preprocess(next(iter(loader(sets / "perlin_mixed.h5", 2)))["image"])
    methods = [get_method("entropy"), get_method("varsum", samples=4), get_method("mutual_info", samples=2),
               MeanMaxProb(samples=4), get_method("odin", temperature=10, epsilon=0.002)]
    assert [m.needs for m in methods] == [Needs(forward=True), Needs("dropout", samples=4),
                                          Needs("dropout", samples=2), Needs("dropout", samples=4),
                                          Needs(perturbs=True)]
    batch = score_batch(model, x, methods, mc_seeds=[7, 8])
    with torch.no_grad():
        output = model(x)
        samples = model.mc_logits(x, samples=4, seeds=[7, 8])
    torch.testing.assert_close(batch.classes, output.logits.argmax(1))
    torch.testing.assert_close(batch.scores[0], functional.entropy_from_logits(output.logits))
    torch.testing.assert_close(batch.scores[1], varsum(samples.softmax(2)))
    torch.testing.assert_close(batch.scores[2], mutual_info(samples[:2].softmax(2)))
    torch.testing.assert_close(batch.scores[3], 1 - samples.softmax(2).mean(0).amax(1))
    torch.testing.assert_close(batch.scores[4], methods[4].score(model, x)[0])
    assert set(batch.seconds) == {"forward", "score/entropy", "score/varsum", "score/mutual_info",
                                  "score/mean_max_prob", "score/odin"}
    plain = get_method("odin", temperature=10).score(model, x)[0]
    assert not torch.allclose(batch.scores[4], plain)  # the perturbed pass really ran
    assert get_method("mahalanobis").needs == Needs("dimreduce", forward=True, fit=True)
    with pytest.raises(ValueError, match="needs its training statistics"):
        score_batch(build_model("pspnet", "resnet18", head="dimreduce").eval(), x, [get_method("mahalanobis")])


def test_unknown_method_lists_the_names():
    with pytest.raises(KeyError, match="max_softmax"):
        get_method("softmax_max")


def test_a_monte_carlo_method_registers_itself_beside_the_built_in_ones(sets, tmp_path):
    """A toy dropout method (no ``from_samples_together``) decorated with ``@register_method``: evaluate schedules
    it from its declared needs beside varsum and mutual_info (which share their hook), on the same samples."""
    from segood.evaluation import evaluate

    @register_method
    class SampleSpread(MonteCarlo):
        """Spread of the max softmax over the samples (a test's toy)."""

        name = "sample_spread"

        def from_samples(self, logits):
            return logits.softmax(dim=2).amax(dim=2).std(dim=0)

    try:
        assert "sample_spread" in list_methods(head="dropout") and "sample_spread" not in list_methods(head=None)
        model = tiny_network("dropout")
        x = preprocess(next(iter(loader(sets / "perlin_mixed.h5", 2)))["image"])
        methods = [get_method("sample_spread", samples=4), get_method("varsum", samples=4),
                   get_method("mutual_info", samples=4)]
        batch = score_batch(model, x, methods, mc_seeds=[3, 4])
        with torch.no_grad():
            samples = model.mc_logits(x, samples=4, seeds=[3, 4])
        torch.testing.assert_close(batch.scores[0], samples.softmax(2).amax(2).std(0))
        torch.testing.assert_close(batch.scores[1], varsum(samples.softmax(2)))
        torch.testing.assert_close(batch.scores[2], mutual_info(samples.softmax(2)))
        doc = evaluate(model, [sets / "perlin_mixed.h5"], ["sample_spread", "varsum"], tmp_path, progress=False,
                       figures=False, bootstrap=None)
        assert doc["results"]["sample_spread"]["perlin_mixed"]["pooled"]["auroc"] is not None
    finally:
        METHODS.pop("sample_spread")


def test_registries_refuse_a_second_definition_under_one_name():
    from segood.data.registry import ADAPTERS, list_adapters
    from segood.metrics import METRICS, list_metrics

    with pytest.raises(ValueError, match="a method named 'max_logit' is registered already .*replace=True"):
        METHODS["max_logit"] = MeanMaxProb
    with pytest.raises(ValueError, match="a method named 'entropy' is registered already"):
        register_method(MeanMaxProb, name="entropy")
    original = METHODS["entropy"]
    try:
        assert register_method(MeanMaxProb, name="entropy", replace=True) is MeanMaxProb
        assert type(get_method("entropy")) is MeanMaxProb
    finally:
        register_method(original, replace=True)
    assert list(METHODS)[:7] == ["max_softmax", "odin", "mahalanobis", "confidence", "entropy", "varsum",
                                 "mutual_info"]  # the paper's order, then today's baselines
    assert list_methods(fit=True) == ["mahalanobis", "sml"]
    with pytest.raises(TypeError, match="list_methods filters on the fields of Needs"):
        list_methods(colour="red")
    with pytest.raises(KeyError, match="unknown dataset adapter 'sunn'; choose one of .*'sun'"):
        ADAPTERS["sunn"]
    with pytest.raises(ValueError, match="a dataset adapter named 'sun' is registered already"):
        ADAPTERS["sun"] = ADAPTERS["idd"]
    assert "smiyc_anomaly" in list_adapters()
    with pytest.raises(ValueError, match="a metric named 'auroc' is registered already"):
        METRICS["auroc"] = METRICS["auprc"]
    assert list_metrics(higher_is_better=False) == ["fpr95"]


def test_odin_t1_eps0_is_max_softmax_and_perturbation_direction():
    model = tiny_network()
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(get_method("odin", temperature=1, epsilon=0, form="softmax").score(model, x)[0],
                               get_method("max_softmax").score(model, x)[0])
    spread = get_method("odin", temperature=1, epsilon=0).score(model, x)[0].double().flatten()  # the default form
    softmax = get_method("max_softmax").score(model, x)[0].double().flatten()
    assert (torch.diff(softmax[torch.argsort(spread)]) >= -1e-6).all()  # the same order, up to float32 rounding
    plain = get_method("odin", temperature=10, epsilon=0, form="softmax").score(model, x)[0]
    perturbed = get_method("odin", temperature=10, epsilon=0.004, form="softmax").score(model, x)[0]
    assert perturbed.mean() < plain.mean()  # the step raises the max softmax: the input looks more ID
    conf_model = tiny_network("confidence")
    plain = get_method("confidence").score(conf_model, x)[0]
    perturbed = get_method("confidence", epsilon=0.004).score(conf_model, x)[0]
    assert perturbed.mean() < plain.mean()  # the step raises the confidence


def random_logits(seed, n=3000, ties=False):
    """(n, C, 1, 1) float64 logits: ID-like (one class far ahead) and OOD-like (flatter) pixels; with ``ties``, n
    pixels drawn from 60 vectors of small integers (equal maxima, equal pixels)."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        pool = torch.randint(0, 4, (60, C, 1, 1), generator=g).double()
        return pool[torch.randint(0, 60, (n,), generator=g)]
    z = torch.randn(n, C, 1, 1, generator=g, dtype=torch.float64) * 3
    z[: n // 2, 3] += 12 * torch.rand(n // 2, 1, 1, generator=g, dtype=torch.float64)
    return z


@pytest.mark.parametrize("temperature", [1.0, 2.0, 10.0, 1000.0])
@pytest.mark.parametrize("ties", [False, True])
def test_odin_spread_orders_pixels_as_the_max_softmax_at_t(temperature, ties):
    """In float64: sorted by the plain 1 - max softmax(z / T), the spread score rises wherever the reference does
    by more than rounding; equal pixels score equal."""
    z = random_logits(int(temperature) + ties, ties=ties)
    reference = (1 - (z / temperature).softmax(1).amax(1)).flatten()
    spread = odin_spread(z, temperature).flatten()
    assert spread.dtype == torch.float64 and torch.isfinite(spread).all()
    order = torch.argsort(reference, stable=True)
    steps_ref, steps = torch.diff(reference[order]), torch.diff(spread[order])
    assert (steps[steps_ref > 1e-12] > 0).all()
    if ties:  # equal up to rounding where the reference ties (also the same logits in another class order) ...
        assert (steps_ref == 0).sum() > 2000 and (steps[steps_ref == 0].abs() <= 1e-12 * spread.abs().max()).all()
        _, group = torch.unique(z.flatten(1), dim=0, return_inverse=True)  # ... and exactly equal for equal pixels
        first = torch.zeros(int(group.max()) + 1, dtype=spread.dtype).scatter_(0, group, spread)
        assert torch.equal(first[group], spread)
    torch.testing.assert_close(odin_spread(z.float(), temperature).double().flatten(), spread, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1000.0, 1e9])
def test_odin_spread_equals_its_definition_with_expm1(temperature):
    """The score's C - S term comes from tanh (expm1(u) = tanh(u / 2) (exp(u) + 1)): against the definition summed
    with expm1, in float64 to 1e-12 relatively (no ties: S - 1 is the sum over the classes but the maximum), and in
    float32 to the float64 value within a few float32 steps."""
    z = random_logits(7)
    u = (z - z.amax(1, keepdim=True)) / temperature
    definition = (1 / -torch.expm1(u).sum(1) - 1 / torch.exp(u).masked_fill(u == 0, 0.0).sum(1)).flatten()
    torch.testing.assert_close(odin_spread(z, temperature).flatten(), definition, rtol=1e-12, atol=0)
    scale = definition.abs().max().item()  # (the score crosses 0, where relative errors mean nothing)
    torch.testing.assert_close(odin_spread(z.float(), temperature).double().flatten(), definition, rtol=2e-6,
                               atol=2e-7 * scale)


def test_odin_spread_direction_range_and_bounds():
    values = [odin_spread(logits_mix(a).double(), 1.0).item() for a in np.linspace(0.05, 0.95, 10)]
    assert all(b > a for a, b in zip(values, values[1:]))  # more uniform, more OOD
    for dtype in (torch.float32, torch.float64):
        tiny = torch.finfo(dtype).tiny
        one_hot = torch.full((1, C, 1, 1), -float("inf"), dtype=dtype)
        one_hot[:, 3] = 0.0
        uniform = torch.zeros(1, C, 1, 1, dtype=dtype)
        assert odin_spread(one_hot, 1.0).item() == pytest.approx(-1 / tiny)  # S - 1 = 0: the finite extreme
        assert odin_spread(uniform, 1.0).item() == pytest.approx(1 / tiny)  # C - S = 0
        middle = torch.log(torch.tensor([2.0] + [1.0] * (C - 1), dtype=dtype)).view(1, C, 1, 1)
        assert odin_spread(middle, 1.0).item() == pytest.approx(0.0, abs=1e-5)  # S = (C + 1) / 2
    assert odin_spread(torch.randn(1, C, 2, 2, dtype=torch.float16), 10.0).dtype == torch.float32
    with pytest.raises(ValueError, match="temperature must be positive"):
        odin_spread(uniform, 0.0)
    with pytest.raises(ValueError, match="form must be one of spread, softmax"):
        get_method("odin", form="log")


def test_odin_spread_makes_the_float_order_bounds_collapse_at_t1000():
    """At T = 1000 the paper's form crowds every pixel near 1 - 1/C: even the finest float-order grid leaves wide
    AUROC bounds. The spread form, the same order, pins them down."""
    z = random_logits(7, n=40_000).float()
    labels = np.zeros(z.shape[0], np.uint8)
    labels[z.shape[0] // 2 :] = 1  # the flatter half is OOD
    widths = {}
    for name, form in (("before", odin), ("after", odin_spread)):
        result = FloatOrderAccumulator(14).update(form(z, 1000.0).flatten(), labels).compute()
        lo, hi = result["bounds"]["auroc"]
        widths[name] = hi - lo
    assert widths["before"] > 1e-2 and widths["after"] < 1e-3, widths
    exact = [make_accumulator(grid_spec(kind="exact")).update(f(z.double(), 1000.0).flatten(), labels).compute()
             for f in (odin, odin_spread)]
    assert exact[0]["auroc"] == pytest.approx(exact[1]["auroc"], abs=1e-12)  # in float64 both orders agree


def test_odin_on_the_linear_grid_takes_the_paper_form():
    linear, default = grid_spec(400), grid_spec()
    assert method_for_grid("odin", linear).params["form"] == "softmax" and method_for_grid("odin", linear).score_range \
        == (0.0, 1.0)
    assert method_for_grid("odin", default).params["form"] == "spread" and get_method("odin").score_range is None
    assert method_for_grid("entropy", linear).params == {}
    from segood.methods.methods import check_grid

    check_grid(method_for_grid("odin", linear), linear)
    with pytest.raises(ValueError, match="odin: form='softmax'"):
        check_grid(get_method("odin"), linear)


def test_tuning_picks_the_best_point_and_records_provenance(sets):
    model = tiny_network()
    grid = {"temperature": [1, 10, 1000], "epsilon": [0.0, 0.002]}
    result = tune("odin", model, loader(sets / "perlin_mixed.h5"), grid, metric="auroc", progress=False)
    assert len(result.table) == 6
    for row in result.table:  # every grid point scored as an independent evaluation would
        method = get_method("odin", temperature=row["temperature"], epsilon=row["epsilon"])
        acc = make_accumulator()
        for batch in loader(sets / "perlin_mixed.h5"):
            acc.update(method.score(model, preprocess(batch["image"]))[0], batch["ood_mask"])
        assert row["auroc"] == pytest.approx(acc.compute()["auroc"], abs=1e-12)
    best = max(result.table, key=lambda r: r["auroc"])
    assert result.best == {"temperature": best["temperature"], "epsilon": best["epsilon"]}
    tuned = result.method()
    assert tuned.params["tuning"]["set"]["ood_sources"] == ["perlin_noise"] and tuned.describe()["uses_ood_data"]
    assert same_source_tuning(tuned.params, set_identity(sets / "perlin_mixed.h5"))
    assert not same_source_tuning(tuned.params, set_identity(sets / "normal_mixed.h5"))
    assert not same_source_tuning(get_method("odin").params, set_identity(sets / "perlin_mixed.h5"))
    assert math.isfinite(result.provenance["value"])
    batches = list(loader(sets / "perlin_mixed.h5"))  # a loader whose dataset does not say which set it is
    with pytest.raises(ValueError, match="tuning_set"):
        tune("odin", model, batches, {"temperature": [1]}, progress=False)


@pytest.mark.parametrize("band_elements", [1 << 19, 2 * C * 7])  # one band; bands of 2 rows, a partial last
def test_logit_forms_equal_the_probability_forms(band_elements, monkeypatch):
    from segood.methods import functional
    from segood.methods.functional import entropy_from_logits, max_softmax_from_logits
    from segood.models.predict import classes_by_rank, predicted_classes

    monkeypatch.setattr(predict, "_BAND_ELEMENTS", band_elements)
    torch.manual_seed(0)
    z = torch.randn(2, C, 9, 7) * 4
    torch.testing.assert_close(max_softmax_from_logits(z), max_softmax(z.softmax(1)))
    torch.testing.assert_close(entropy_from_logits(z), entropy(z.softmax(1)))
    for t in (1.0, 2.0, 1000.0):
        torch.testing.assert_close(odin(z, t), max_softmax((z / t).softmax(1)))
    ties = torch.randint(0, 3, (2, C, 9, 7)).float()  # many equal maxima: the first one wins, as in argmax
    many = torch.randn(1, 300, 8, 8)  # more classes than a uint8 rank holds
    impossible = z.clone()
    impossible[:, 3] = -float("inf")  # a class the network rules out: p = 0, 0 log 0 = 0
    torch.testing.assert_close(entropy_from_logits(impossible), entropy(impossible.softmax(1)))
    samples = torch.stack([impossible, impossible.flip(0)])
    torch.testing.assert_close(functional.monte_carlo_scores(samples)["mutual_info"], mutual_info(samples.softmax(2)))
    with pytest.raises(ValueError, match="temperature must be positive"):
        get_method("odin", temperature=0)
    for logits in (z, ties, many, z.double(), z.half(), ties[:1].expand(3, -1, -1, -1), z.permute(0, 1, 3, 2)):
        classes = predicted_classes(logits)  # (numba for float32 and float64 on CPU, else classes_by_rank)
        assert classes.dtype == torch.int64 and torch.equal(classes, logits.float().argmax(1))
        assert torch.equal(classes_by_rank(logits), classes)
        for step in (2, 3, 10):  # every step-th pixel each way (9 x 7 pixels: a partial last row and column)
            assert torch.equal(predicted_classes(logits, step), classes[:, ::step, ::step])
    holes = z.clone()
    holes[0, 0, 0, 0] = holes[1, C - 1, 2, 3] = holes[1, 4, 5, 6] = float("nan")  # NaN: class C - 1, in both
    expected = holes.nan_to_num(nan=-1.0).argmax(1)
    expected[0, 0, 0] = expected[1, 2, 3] = expected[1, 5, 6] = C - 1
    assert torch.equal(predicted_classes(holes), expected) and torch.equal(classes_by_rank(holes), expected)
    holes[1, 3, 4, 2] = float("nan")  # (a pixel that every second pixel each way keeps: (1, 4, 2))
    expected[1, 4, 2] = C - 1
    assert torch.equal(predicted_classes(holes, 2), expected[:, ::2, ::2])  # (and (0, 0, 0))
    assert torch.equal(predicted_classes(holes.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2), 2),
                       expected[:, ::2, ::2])  # (a non-contiguous layout, read where it is)


@pytest.mark.parametrize("samples", [0, 1, -1])
def test_monte_carlo_methods_need_two_samples(samples):
    """One sample has no spread (its scores were all zero); none left the score unset."""
    for name in ("varsum", "mutual_info"):
        with pytest.raises(ValueError, match=f"{name} needs at least 2 Monte-Carlo samples"):
            get_method(name, samples=samples)


def test_entropy_of_one_class_and_window_sizes_of_one_number_are_refused():
    """(Entropy over one class divided by log 1 gave NaN maps; an int window a TypeError.)"""
    from segood.models.inference import check_inference

    with pytest.raises(ValueError, match="entropy .* needs at least 2 classes, and these logits have 1"):
        get_method("entropy")(torch.nn.Conv2d(3, 1, 1), torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="crop must be two positive sides"):
        check_inference("slide", crop=64)
    with pytest.raises(ValueError, match=r"size=.H, W. \(--infer-size H W\) is the resize mode's network size, two "):
        check_inference("resize", size=64)


def test_methods_scored_in_one_pass_share_its_time():
    """(The whole fused pass was charged to the first of its methods, the others to nothing.)"""
    from segood.models.external import as_network

    names = ("max_softmax", "entropy", "energy")
    batch = score_batch(as_network(torch.nn.Conv2d(3, 19, 1)), torch.randn(1, 3, 32, 32), [get_method(n) for n in names])
    shares = [batch.seconds[f"score/{n}"] for n in names]
    assert shares[0] > 0 and shares == [shares[0]] * 3


def test_varsum_and_mutual_info_of_two_samples_equal_hand_computed_values():
    """One pixel, C = 2, two samples p = (0.8, 0.2) and (0.4, 0.6) (mean (0.6, 0.4)), away from the bounds the
    clamp holds. VarSum: per class the variance over the samples, divided by T (not T - 1; not the std), 0.04 + 0.04,
    over 1 - 1/2: 0.16. Mutual information: H(0.6, 0.4) - (H(0.8, 0.2) + H(0.4, 0.6)) / 2 = 0.0863046217 nats (the
    mean over both samples' entropies), over log 2: 0.1245112498. Both forms, from probabilities and logits."""
    p = torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64).view(2, 1, 2, 1, 1)
    entropy_nats = lambda a, b: -(a * math.log(a) + b * math.log(b))  # noqa: E731
    information = entropy_nats(0.6, 0.4) - (entropy_nats(0.8, 0.2) + entropy_nats(0.4, 0.6)) / 2
    assert information / math.log(2) == pytest.approx(0.1245112498, abs=1e-10)
    out = functional.monte_carlo_scores(p.log())
    for got in (varsum(p), out["varsum"]):
        assert got.item() == pytest.approx(0.16, rel=1e-12)
    for got in (mutual_info(p), out["mutual_info"]):
        assert got.item() == pytest.approx(0.1245112498, abs=1e-10)
    assert out["classes"].item() == 0


def test_mahalanobis_training_statistics_and_squashed_score_equal_their_definitions(sets):
    """Pass 2 of the fit: the mean and the (population) std of the finite minimum distances M over the training
    pixels; the squashed score sigmoid((M - mean) / std) (the seed paper's eq. 12) and the plain one M, each resized
    to the frame bilinearly (align_corners False)."""
    assert functional.mahalanobis_score(torch.tensor([1.0, 2.0, 3.0]), 2.0, 0.5).tolist() == pytest.approx(
        [1 / (1 + math.exp(2)), 0.5, 1 / (1 + math.exp(-2))])
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head="dimreduce").eval()
    method = get_method("mahalanobis").fit(model, loader(sets / "cs.h5"))
    state = method.state
    centres = whiten_means(state["means"], state["whiten"])
    with torch.no_grad():
        m = torch.cat([mahalanobis_min_distance(model.penultimate(preprocess(b["image"])).double(), state["whiten"],
                                                centres, state["present"]) for b in loader(sets / "cs.h5")])
    finite = m[torch.isfinite(m)].numpy()
    assert 0 < finite.size < m.numel()  # some training locations saw no class: M = inf there, left out
    assert state["m_mean"].item() == pytest.approx(finite.mean(), rel=1e-9)
    assert state["m_std"].item() == pytest.approx(finite.std(), rel=1e-9)
    x = preprocess(next(iter(loader(sets / "perlin_mixed.h5")))["image"])
    with torch.no_grad():
        distance = mahalanobis_min_distance(model.penultimate(x).double(), state["whiten"], centres, state["present"])
    squashed = torch.sigmoid((distance - finite.mean()) / finite.std())
    for params, low in (({}, distance.clamp_max(1e30)), ({"squash": True}, squashed)):  # (inf: a finite stand-in)
        want = torch.nn.functional.interpolate(low[:, None].float(), size=x.shape[-2:], mode="bilinear",
                                               align_corners=False)[:, 0]
        got = get_method("mahalanobis", **params).load_state(method.state_arrays()).score(model, x)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_input_perturbation_is_each_papers_step_in_pixel_units(sets):
    """x~ = x - ε sign(-∇_x Σ log S_ŷ(x; T)) for ODIN (Liang et al.: the step that raises the max softmax at T, T
    inside the log-softmax), x - ε sign(∇_x mean(-log c)) for confidence (DeVries & Taylor), x - ε sign(∇_x Σ M) for
    Mahalanobis (Lee et al.: towards the nearest class mean); ε in pixel units, so divided by the std per channel.
    Each method with ε scores as itself without ε on that x~."""
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    x = preprocess(next(iter(loader(sets / "perlin_mixed.h5")))["image"])
    mahalanobis = get_method("mahalanobis").fit(tiny_network("dimreduce"), loader(sets / "cs.h5"))
    state = mahalanobis.state
    centres = whiten_means(state["means"], state["whiten"])
    cases = [
        (tiny_network(), "odin", {"temperature": 10.0, "form": "softmax"},
         lambda model, v: (model(v).logits / 10.0).log_softmax(dim=1).amax(dim=1).sum().neg()),
        (tiny_network("confidence"), "confidence", {},
         lambda model, v: -torch.log(model(v).confidence.clamp_min(1e-12)).mean()),
        (tiny_network("dimreduce"), "mahalanobis", {},
         lambda model, v: mahalanobis_min_distance(model.penultimate(v).double(), state["whiten"], centres,
                                                   state["present"]).clamp_max(1e30).sum()),
    ]
    for model, name, params, objective in cases:
        v = x.clone().requires_grad_(True)
        objective(model, v).backward()
        x_tilde = (x - 0.004 * v.grad.sign() / std).detach()

        def scored(image, epsilon):
            method = get_method(name, epsilon=epsilon, **params)
            return (method.load_state(mahalanobis.state_arrays()) if name == "mahalanobis" else method).score(
                model, image)[0]

        weight = next(model.parameters())
        weight.grad = torch.full_like(weight, 7.0)  # (a caller's gradients: the step takes the input's only)
        torch.testing.assert_close(scored(x, 0.004), scored(x_tilde, 0.0), msg=name)
        assert not torch.allclose(scored(x, 0.004), scored(x, 0.0)), name  # the step moves the scores
        assert torch.equal(weight.grad, torch.full_like(weight, 7.0)), name


def test_tuning_by_a_lower_is_better_metric_picks_the_lowest(sets):
    """FPR at 95% TPR is better lower: the tuned point is the grid's lowest, not its highest."""
    result = tune("odin", tiny_network(), loader(sets / "normal_mixed.h5"), {"temperature": [1, 2, 5, 1000]},
                  metric="fpr95", progress=False)
    values = [row["fpr95"] for row in result.table]
    assert min(values) < max(values)  # (the direction decides)
    assert result.provenance["value"] == min(values)
    assert result.best == {"temperature": result.table[values.index(min(values))]["temperature"]}
