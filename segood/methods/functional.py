"""Pure per-pixel OOD score formulas, (N, H, W), higher = more OOD: the paper's in [0, 1] by a stated bound (never
by an ad-hoc constant); today's baselines (max logit, energy, standardized max logit) unbounded. No network in here: tensors in, tensors out. The
logit forms and ``predicted_classes`` run without autograd (they write into preallocated outputs)."""

import math

import torch
import torch.nn.functional as F

from segood.models.predict import bands, predicted_classes


def max_softmax(probs: torch.Tensor) -> torch.Tensor:
    """1 - max_c p_c (Hendrycks & Gimpel 2017, "A baseline for detecting misclassified and OOD examples").

    Args:
        probs: (N, C, H, W) softmax probabilities. Bound: 1 - max_c p_c <= 1 - 1/C <= 1.
    """
    return 1.0 - probs.amax(dim=1)


@torch.no_grad()
def _exp_sums_at(logits, temperatures):
    """(max_c z, {T: (S_T, W_T)}) for each T of ``temperatures`` ({T: weighted}), with u = (z - max_c z) / T:
    S_T = Σ_c exp(u_c) and W_T = Σ_c exp(u_c) u_c if weighted else None, each (N, H, W): the one exp pass the
    logit forms need, for every temperature at once, band by band, never materialising the softmax. Each T's
    sums are the bits of a pass for it alone (the same operations on the same band)."""
    n, c, h, w = logits.shape
    top = logits.new_empty(n, h, w)
    sums = {t: (logits.new_empty(n, h, w), logits.new_empty(n, h, w) if weighted else None)
            for t, weighted in temperatures.items()}
    for rows in bands(logits):
        z = logits[:, :, rows]
        highest = z.amax(dim=1, keepdim=True)
        top[:, rows] = highest[:, 0]
        for t, (total, weighted_sum) in sums.items():
            u = z - highest
            if t != 1.0:
                u /= t
            if weighted_sum is not None:
                u.clamp_(min=torch.finfo(u.dtype).min)  # a -inf logit: exp 0 times a finite u, not 0 * -inf = NaN
            e = torch.exp(u)
            torch.sum(e, dim=1, out=total[:, rows])
            if weighted_sum is not None:
                torch.sum(e.mul_(u), dim=1, out=weighted_sum[:, rows])
    return top, sums


def max_softmax_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """:func:`max_softmax` straight from logits (N, C, H, W): max_c p_c = 1 / Σ_c exp(z_c - max z)."""
    return _shared_logit_scores(logits, [("max_softmax", 1.0)])[0]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """:func:`entropy` from logits: with u = z - max z and S = Σ exp(u), H = log S - Σ_c exp(u_c) u_c / S."""
    return _shared_logit_scores(logits, [("entropy", 1.0)])[0]


def odin(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """1 - max_c softmax(logits / T)_c (Liang et al. 2018, "Enhancing the reliability of OOD image detection",
    without the input perturbation, which :class:`segood.methods.Odin` adds). T = 1 is max softmax exactly."""
    return _shared_logit_scores(logits, [("odin", temperature)])[0]


def _check_temperature(temperature, name):
    if not temperature > 0:
        raise ValueError(f"the {name} temperature must be positive, got {temperature}")


@torch.no_grad()
def odin_spread(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """ODIN's score with full float precision at any temperature (Liang et al. 2018, "Enhancing the reliability of
    OOD image detection", without the input perturbation): with u = (z - max_c z) / T and S = Σ_c exp(u_c) =
    1 / max_c softmax(z / T)_c, the score 1 / (C - S) - 1 / (S - 1).

    Higher = more OOD; range: every real number, -> -inf as the softmax at T becomes one-hot (S -> 1), -> +inf as
    it becomes uniform (S -> C), 0 at S = (C + 1) / 2; kept finite (|score| <= 1 / the smallest normal number of
    the dtype, where S - 1 or C - S is 0 in floating point).

    It orders pixels as :func:`odin` (1 - 1/S) does: both rise with S. But 1 - 1/S keeps only the digits of S that
    survive next to its bounds, and the pixels crowd at a bound: near C at a large T (at T = 1000 every S lies
    within about 1% of C), near 1 for confident pixels at a small T. Here S - 1 = Σ of exp(u_c) over the classes
    but one maximum, and C - S = -Σ_c expm1(u_c): sums of terms of one sign, each at full relative precision
    however close S comes to either bound, and their reciprocals carry that precision into the score, so binned
    metrics resolve what the order holds. Computed in float32 at least (float64 logits in float64).

    Args:
        logits: (N, C, H, W). temperature: T > 0.
    """
    _check_temperature(temperature, "ODIN")
    n, c, h, w = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    tiny = torch.finfo(dtype).tiny
    out = logits.new_empty(n, h, w, dtype=dtype)
    for rows in bands(logits):
        z = logits[:, :, rows].to(dtype)
        u = z - z.amax(dim=1, keepdim=True)  # a fresh tensor: changed in place below
        if temperature != 1.0:
            u /= float(temperature)
        at_max = u == 0
        exp = torch.exp(u)
        # C - S = -sum_c expm1(u_c), and expm1(u) = tanh(u / 2) (exp(u) + 1) exactly: each term within 3 ulp
        # relatively (expm1: 1), from a vectorised tanh instead of torch's scalar expm1 on the CPU (5x its time)
        to_uniform = exp.add(1.0).mul_(u.mul_(0.5).tanh_()).sum(dim=1).neg_()
        below = exp.masked_fill_(at_max, 0.0).sum(dim=1)  # S - 1: every term but the maxima, then
        above_one = below.add_(at_max.sum(dim=1).to(dtype).sub_(1.0))  # the maxima but one (1 each)
        out[:, rows] = to_uniform.clamp_(min=tiny).reciprocal_().sub_(above_one.clamp_(min=tiny).reciprocal_())
    return out


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of the softmax divided by its bound log C (Mukhoti & Gal 2018, "Evaluating Bayesian
    deep learning methods for semantic segmentation"), in [0, 1]; 0 log 0 is taken as 0.

    Args:
        probs: (N, C, H, W) softmax probabilities.
    """
    return _entropy(probs, dim=1) / math.log(probs.shape[1])


def varsum(probs: torch.Tensor) -> torch.Tensor:
    """Sum over classes of the variance over T Monte-Carlo samples (Kendall et al. 2015, "Bayesian SegNet"),
    divided by its bound 1 - 1/C (sum_c Var[p_c] = E[sum p_c^2] - sum E[p_c]^2 <= 1 - 1/C).

    Args:
        probs: (T, N, C, H, W) softmax probabilities of T dropout samples.
    """
    num_classes = probs.shape[2]
    variance = probs.var(dim=0, unbiased=False).sum(dim=1)
    return (variance / (1.0 - 1.0 / num_classes)).clamp(0.0, 1.0)


def mutual_info(probs: torch.Tensor) -> torch.Tensor:
    """Mutual information H(mean_t p_t) - mean_t H(p_t) (Mukhoti & Gal 2018; the seed paper's eq. 25-27),
    divided by its bound log C, in [0, 1].

    Args:
        probs: (T, N, C, H, W) softmax probabilities of T dropout samples.
    """
    predictive = _entropy(probs.mean(dim=0), dim=1)
    aleatoric = _entropy(probs, dim=2).mean(dim=0)
    return ((predictive - aleatoric) / math.log(probs.shape[2])).clamp(0.0, 1.0)


@torch.no_grad()
def monte_carlo_scores(logits, names=("varsum", "mutual_info", "classes")):
    """{name: (N, H, W) array for each of ``names``: ``varsum``, ``mutual_info``, ``classes`` (argmax of the
    mean softmax)} from (T, N, C, H, W) logits of T dropout samples. Equal to :func:`varsum` and
    :func:`mutual_info` of the softmax, computed band by band so that the (T, N, C, H, W) probabilities are
    never materialised whole; entropies take log p_t from ``log_softmax``."""
    unknown = set(names) - {"varsum", "mutual_info", "classes"}
    if unknown:
        raise ValueError(f"monte_carlo_scores computes varsum, mutual_info and classes, not {sorted(unknown)}")
    t, n, c, h, w = logits.shape
    out = {name: logits.new_empty(n, h, w, dtype=torch.int64 if name == "classes" else None) for name in names}
    for rows in bands(logits):
        log_p = torch.log_softmax(logits[..., rows, :], dim=2).clamp_(min=torch.finfo(logits.dtype).min)  # as above
        p = log_p.exp()
        mean = p.mean(dim=0)
        if "classes" in names:
            out["classes"][:, rows] = predicted_classes(mean)
        if "mutual_info" in names:
            aleatoric = (p * log_p).sum(dim=2).mean(dim=0).neg_()
            out["mutual_info"][:, rows] = ((_entropy(mean, dim=1) - aleatoric) / math.log(c)).clamp_(0.0, 1.0)
        if "varsum" in names:
            out["varsum"][:, rows] = ((p - mean).square_().mean(dim=0).sum(dim=1) / (1.0 - 1.0 / c)).clamp_(0.0, 1.0)
    return out


def confidence_score(confidence: torch.Tensor) -> torch.Tensor:
    """1 - c for the learned confidence c in (0, 1) (DeVries & Taylor 2018, "Learning confidence for OOD
    detection in neural networks").

    Args:
        confidence: (N, 1, H, W).
    """
    return 1.0 - confidence[:, 0]


# Elements of the Mahalanobis distance's (N, step, C, D) temporaries per step: on the CPU small enough to stay in
# cache; on a GPU large (1 GiB of float64), since there each step costs kernel launches (at 2^19, a 1024 x 2048
# frame took 38 steps and 9 ms on an H100).
_DISTANCE_ELEMENTS = {"cpu": 1 << 19, "cuda": 1 << 27}


def whiten_means(means, whiten):
    """(C, h, w, D) whitened class means W_c μ_ci, for :func:`mahalanobis_min_distance` (computed once per fit).

    Args:
        means: (C, h, w, D) per-location class means. whiten: (C, D, D) inverse Cholesky factors.
    """
    return torch.einsum("cij,chwj->chwi", whiten, means)


def mahalanobis_min_distance(features, whiten, whitened_means, present):
    """M(x)_i = min_c sqrt((f_i - mu_ci)^T Sigma_c^-1 (f_i - mu_ci)) (Lee et al. 2018, "A simple unified
    framework for detecting OOD samples"; the seed paper's eq. 9-10).

    With whiten_c = L_c^-1 for the Cholesky factor L_c of Sigma_c, the squared distance is
    ||whiten_c f_i - whiten_c mu_ci||^2: one matrix product whitens every feature for every class at once, and
    the whitened means come precomputed (:func:`whiten_means`). Differentiable (for input perturbation).

    Args:
        features: (N, D, h, w). whiten: (C, D, D). whitened_means: (C, h, w, D).
        present: (C, h, w) bool: class c seen at location i in training (elsewhere its distance is inf).

    Returns:
        (N, h, w) minimum distance; inf where no class was seen at the location.
    """
    n, d, h, w = features.shape
    c = whiten.shape[0]
    f = features.permute(0, 2, 3, 1).reshape(n, h * w, d)
    stacked = whiten.reshape(c * d, d).T  # (D, C D): column block c is whiten_c^T
    centres = whitened_means.permute(1, 2, 0, 3).reshape(h * w, c, d)
    absent = ~present.permute(1, 2, 0).reshape(h * w, c)
    step = max(1, _DISTANCE_ELEMENTS.get(features.device.type, 1 << 19) // (n * c * d))
    best = []
    for start in range(0, h * w, step):
        part = slice(start, start + step)
        d2 = ((f[:, part] @ stacked).view(n, -1, c, d) - centres[part]).square().sum(dim=-1)  # (N, step, C)
        best.append(d2.masked_fill(absent[part], float("inf")).amin(dim=-1))
    return torch.cat(best, dim=1).sqrt().view(n, h, w)


def mahalanobis_score(distance, mean, std):
    """sigmoid((M - mu) / s) with mu, s the mean and std of M over the training set (the seed paper's eq. 12)."""
    return torch.sigmoid((distance - mean) / std)


def _entropy(probs, dim):
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=dim)


@torch.no_grad()
def max_logit(logits: torch.Tensor) -> torch.Tensor:
    """-max_c f_c (Hendrycks et al. 2022, "Scaling out-of-distribution detection for real-world settings").
    Unbounded: the float-order grid bins it as it is."""
    return _channel_max(logits).neg_()


def _channel_max(logits: torch.Tensor) -> torch.Tensor:
    """max_c z_c, (N, H, W), as ``logits.amax(dim=1)``: the same values (a maximum rounds nothing; NaN wins; a zero
    maximum's sign may differ, +0 and -0 being one value), on the CPU as a running maximum over the channels,
    30-40% faster there than ``amax`` over a dimension that is not the innermost (a 19-class 2x512x1024 batch:
    5.7 -> 4.0 ms on one thread, 4.0 -> 2.4 on two)."""
    if logits.device.type != "cpu" or not logits.shape[1]:
        return logits.amax(dim=1)
    top = logits[:, 0].clone()
    for c in range(1, logits.shape[1]):
        torch.maximum(top, logits[:, c], out=top)
    return top


@torch.no_grad()
def energy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """-T logsumexp(f / T) (Liu et al. 2020, "Energy-based out-of-distribution detection"). Unbounded.

    Computed as -(max_c f_c + T log Σ_c exp((f_c - max f) / T)), T > 0, from the exponential sums the other logit
    forms use (band by band on the CPU: no full-size temporaries, whose fresh memory cost more than the
    arithmetic); where the largest logit is ±inf, -(that logit), as ``torch.logsumexp`` has it. The same as
    ``torch.logsumexp`` up to float32 rounding."""
    return _shared_logit_scores(logits, [("energy", temperature)])[0]


LOGIT_FORMS = {"max_softmax": lambda z, t: max_softmax_from_logits(z), "entropy": lambda z, t: entropy_from_logits(z),
               "odin": odin, "odin_spread": odin_spread, "max_logit": lambda z, t: max_logit(z), "energy": energy}
LOGIT_BLOCK = 1024  # pixels per program of the fused kernel
_TEMPERED = ("odin", "odin_spread", "energy")  # the forms whose temperature counts


@torch.no_grad()
def logit_scores(logits, forms):
    """[(N, H, W) scores] of each (form, temperature) of ``forms`` (forms: the keys of :data:`LOGIT_FORMS`; the
    temperature counts for odin, odin_spread and energy) from (N, C, H, W) logits.

    On CUDA, float32 logits are read once for all of them (twice per temperature other than 1): a fused kernel
    (``segood.methods._logits_triton``) writes per pixel the maximum logit and the exponential sums every form
    is made of, and each form is a few operations on those maps. It computes what each form's own function
    computes, summed in another order (so up to float32 rounding). Elsewhere, and where Triton cannot run, each
    form as its own function computes it, from one band-by-band pass for the exponential sums of every
    temperature the forms need: :func:`_shared_logit_scores`."""
    from segood import _triton

    unknown = sorted({name for name, _ in forms} - set(LOGIT_FORMS))
    if unknown:
        raise ValueError(f"unknown logit forms {unknown}; known: {', '.join(LOGIT_FORMS)}")
    if logits.is_cuda and logits.dtype == torch.float32 and logits.shape[1] > 1 and _triton.available():
        scores = _triton.attempt(lambda: _fused_logit_scores(logits, forms), "logit kernel",
                                 "each method scores the logits with torch operations", logits.device)
        if scores is not None:
            return scores
    return _shared_logit_scores(logits, forms)


def _shared_logit_scores(logits, forms):
    """:func:`logit_scores` with the exponential sums of max softmax, entropy, ODIN and energy, at every
    temperature they ask for, from one pass over the logits (:func:`_exp_sums_at`). Each of these forms' own
    function is this for itself alone: the same operations on the same bands, so the same bits. Max logit and
    ODIN's spread form keep a pass of their own."""
    temperatures = {}  # {T: whether entropy's weighted sum is needed}
    for name, t in forms:
        if name == "entropy" and logits.shape[1] < 2:
            raise ValueError(f"entropy is normalised by log C, the most a distribution over C classes can have: it "
                             f"needs at least 2 classes, and these logits have {logits.shape[1]}")
        if name in ("max_softmax", "entropy"):
            temperatures[1.0] = temperatures.get(1.0, False) or name == "entropy"
        elif name in ("odin", "energy"):
            _check_temperature(t, "ODIN" if name == "odin" else "energy")
            temperatures.setdefault(float(t), False)
    if not temperatures:
        return [LOGIT_FORMS[name](logits, t) for name, t in forms]
    top, sums = _exp_sums_at(logits, temperatures)
    scores = []
    for name, t in forms:
        if name in ("max_softmax", "odin"):  # 1 - max_c softmax(z / T)_c = 1 - 1 / S_T
            scores.append(1.0 - 1.0 / sums[float(t) if name == "odin" else 1.0][0])
        elif name == "entropy":
            total, weighted_sum = sums[1.0]
            h = torch.log(total) - weighted_sum / total
            scores.append((h / math.log(logits.shape[1])).clamp(0.0, 1.0))
        elif name == "energy":  # -(max z + T log S_T); -max z where it is ±inf (the sums are NaN there)
            energy_t = torch.log(sums[float(t)][0]).mul_(float(t)).add_(top).neg_()
            scores.append(energy_t.where(~top.isinf(), -top))
        else:
            scores.append(LOGIT_FORMS[name](logits, t))
    return scores


def _fused_logit_scores(logits, forms, *, kernel=None):
    """:func:`logit_scores` through the fused kernel (``kernel``: its module, for tests in Triton's interpreter)."""
    if kernel is None:
        from segood.methods import _logits_triton as kernel
    n, c, h, w = logits.shape
    logits = logits.contiguous()
    stats = {}  # temperature -> (5, N, H, W): max z, S, W, S_T - 1, C - S_T (the first three at T = 1)
    for t in dict.fromkeys(t for name, t in forms if name in _TEMPERED) or [1.0]:
        if not t > 0:
            raise ValueError(f"the temperature must be positive, got {t}")
        out = logits.new_empty(5, n, h, w)
        if n * h * w:
            kernel.stats[(n * -(-(h * w) // LOGIT_BLOCK),)](logits, out, n, c, h * w, float(t), BLOCK=LOGIT_BLOCK)
        stats[t] = out
    tiny = torch.finfo(torch.float32).tiny
    scores = []
    for name, t in forms:
        top, total, weighted, above_one, to_uniform = stats[t] if name in _TEMPERED else next(iter(stats.values()))
        if name == "max_softmax":
            score = 1.0 - 1.0 / total
        elif name == "entropy":
            score = ((torch.log(total) - weighted / total) / math.log(c)).clamp_(0.0, 1.0)
        elif name == "max_logit":
            score = -top
        elif name == "odin":
            score = 1.0 - 1.0 / (above_one + 1.0)
        elif name == "odin_spread":
            score = to_uniform.clamp(min=tiny).reciprocal_().sub_(above_one.clamp(min=tiny).reciprocal_())
        else:  # energy: -T logsumexp(z / T) = -(max z + T log S_T)
            score = torch.log1p(above_one).mul_(t).add_(top).neg_().where(~top.isinf(), -top)  # (as energy())
        scores.append(score)
    return scores


def standardized_max_logit(logits, means, stds):
    """-(max_c f_c - mu_k) / sigma_k with k the predicted class (Jung et al. 2021, "Standardized max logits").
    ``means``, ``stds``: (C,) statistics of the max logit over training pixels predicted as each class."""
    top, classes = logits.max(dim=1)
    return (top - means[classes]).div_(stds[classes]).neg_(), classes


def _box3(x, combine):
    """``combine`` (torch.add, torch.maximum) over each 3x3 window of (N, 1, H, W) ``x``, replicate padding: the
    rows', then the columns' shifted views (a one-channel conv2d or max_pool2d takes several times as long on the
    CPU)."""
    p = F.pad(x, (1, 1, 1, 1), mode="replicate")
    rows = combine(combine(p[..., :-2], p[..., 1:-1]), p[..., 2:])
    return combine(combine(rows[..., :-2, :], rows[..., 1:-1, :]), rows[..., 2:, :])


def class_boundaries(classes):
    """(N, 1, H, W) float: 1 where a 3x3 window holds more than one predicted class (dilation != erosion)."""
    c = classes[:, None].float()
    return (_box3(c, torch.maximum) != -_box3(-c, torch.maximum)).float()


def dilate_diamond(mask, radius):
    """Dilation of a (N, 1, H, W) 0/1 mask by a diamond of ``radius`` (``radius`` steps of a 3x3 cross)."""
    for _ in range(radius):
        p = F.pad(mask, (1, 1, 1, 1))
        mask = torch.maximum(torch.maximum(torch.maximum(p[..., 1:-1, :-2], p[..., 1:-1, 2:]), mask),
                             torch.maximum(p[..., :-2, 1:-1], p[..., 2:, 1:-1]))
    return mask


def boundary_suppression(scores, classes, width=4, iterations=4):
    """SML's boundary suppression (Jung et al. 2021, §3.3): in ``iterations`` steps over class boundaries
    dilated by ``width - 1, width - 2, ..., 0``, a boundary pixel takes the mean of the non-boundary pixels of
    its 3x3 window (replicate padding), where there is one. scores (N, H, W), classes (N, H, W)."""
    boundary = class_boundaries(classes)
    out = scores[:, None].float()
    step = width // iterations
    for i in range(iterations):
        region = dilate_diamond(boundary, 0 if i == iterations - 1 else width - step * i - 1)
        keep = 1.0 - region
        total = _box3(out * keep, torch.add)
        count = _box3(keep, torch.add)
        average = torch.where(count > 0, total / count.clamp_min(1.0), out)
        out = torch.where(region > 0, average, out)
    return out[:, 0]


def dilated_smoothing(scores, size=7, sigma=1.0, dilation=6):
    """SML's dilated smoothing: a ``size`` x ``size`` Gaussian (``sigma``) with dilation ``dilation``,
    replicate padding. scores (N, H, W)."""
    axis = torch.arange(size, dtype=torch.float64, device=scores.device) - (size - 1) / 2
    kernel = torch.exp(-(axis[:, None] ** 2 + axis[None, :] ** 2) / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).float().view(1, 1, size, size)
    pad = dilation * (size // 2)
    x = F.pad(scores[:, None].float(), (pad, pad, pad, pad), mode="replicate")
    return F.conv2d(x, kernel, dilation=dilation)[:, 0]
