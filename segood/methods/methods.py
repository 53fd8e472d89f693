"""The seven pixel-level OOD methods of the seed paper (Table 1, Appendix A) and today's three baselines (max
logit, energy, standardized max logit) as scorers on a segood network.

Every ``score(model, x)`` takes ImageNet-normalised images (N, 3, H, W) on the model's device and returns
``(scores, classes)``: OOD scores (N, H, W), higher = more OOD (in [0, 1] where ``score_range`` says so,
unbounded where it is None), and predicted classes (N, H, W).
A method declares how it must run (:class:`Needs`); :func:`segood.methods.schedule.score_batch` runs a batch
of methods from those declarations, so that an evaluation runs each network once per image: single-pass
methods score the shared forward pass (``from_output``), Monte-Carlo methods a shared set of samples
(``from_samples``), perturbing methods a pass of their own.

Input perturbation (ODIN, Mahalanobis, confidence) needs OOD data to choose ε; ε = 0, the default, means the
method never sees OOD data before evaluation. ε is in pixel units ([0, 1] images): the step is divided by
the normalisation's std per channel, as in the ODIN reference code.
"""

import inspect
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from segood.labels import NUM_CLASSES
from segood.methods import functional as fn
from segood.models.network import device_of, evaluation_mode
from segood.registry import Registry

ODIN_TEMPERATURES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
ODIN_EPSILONS = tuple(float(e) for e in np.linspace(0.0, 0.004, 21))

#: Every OOD method by name, in the order the reports list them; ``@register_method`` adds one.
METHODS = Registry("method")
register_method = METHODS.register


def served_heads(model):
    """The heads a network serves: a segood network its own; a wrapped external model what it declares."""
    declared = getattr(model, "served_heads", None)
    return declared if declared is not None else {getattr(getattr(model, "config", None), "head", None)}


@dataclass(frozen=True)
class Needs:
    """How a method must run; :func:`segood.methods.schedule.score_batch` schedules methods from this alone.

    head: the head the network must serve (None: any). forward: scored from the shared forward pass
    (``from_output``). samples: Monte-Carlo dropout samples of the shared features (``from_samples``).
    fit: needs ``fit(model, loader)`` on training data first. perturbs: runs its own pass on an input perturbed
    against ``objective`` (a gradient and a second forward), then scores that pass with ``from_output``.
    """

    head: str | None = None
    forward: bool = False
    samples: int = 0
    fit: bool = False
    perturbs: bool = False


class Method:
    """Base: ``head`` is the head the network must have (None: any); ``params`` what the method was run with.

    Recipe (``docs/extending.md``): subclass, set ``name`` (and ``head``), implement ``from_output(output)``
    (or subclass :class:`MonteCarlo` and implement ``from_samples(logits)``), and decorate the class with
    ``@register_method``.
    """

    name = ""
    head = None
    #: the direction of ``input perturbation``: True steps up ``objective``'s gradient, False down
    ascend = False
    #: the range of the scores (None: unbounded, for the float-order grid only)
    score_range = (0.0, 1.0)
    #: methods scored from the same forward pass that share work opt in with one function, set on each class:
    #: ``from_output_together(methods, output) -> [scores]``, called once with every method of a batch naming it
    from_output_together = None

    def __init__(self, **params):
        self.params = params

    @property
    def needs(self):
        """:class:`Needs`: by default one shared forward pass, or a perturbed pass when ``epsilon`` > 0."""
        perturbs = bool(self.params.get("epsilon"))
        return Needs(head=self.head, forward=not perturbs, perturbs=perturbs)

    @property
    def ready(self):
        """False while a method that needs a fit has none."""
        return True

    def check(self, model):
        """Refuse a network without this method's head (ValueError that says which head to build)."""
        if self.head is not None and self.head not in served_heads(model):
            from segood.models.external import ExternalModel

            if self.head == "dimreduce" and type(model) is ExternalModel:  # a network of the user's own
                top = ", ".join(repr(name) for name, _ in model.module.named_children())
                raise ValueError(f"{self.name} needs features: name the layer of this network that gives them, "
                                 f"feature_layer=NAME (--feature-layer NAME), a name of its named_modules() (its "
                                 f"top-level ones: {top or 'none'})")
            raise ValueError(f"{self.name} needs a network with the {self.head!r} head; this one serves "
                             f"{sorted(map(str, served_heads(model)))}. Build it with build_model(..., "
                             f"head={self.head!r}) (segood train --head {self.head}) and train it, or choose "
                             "another method")

    def describe(self):
        """Name, parameters and whether OOD data shaped it (tuning provenance lives in params['tuning']); for a
        method defined outside segood, its class too (a run resumed with another class under the name is
        refused)."""
        eps = self.params.get("epsilon", 0.0)
        cls = type(self)
        own = cls.__module__.partition(".")[0] == "segood"
        return {"name": self.name, "params": dict(self.params), "uses_ood_data": bool(eps) or "tuning" in self.params,
                **({} if own else {"class": f"{cls.__module__}.{cls.__qualname__}"})}

    def from_output(self, output):
        """(N, H, W) scores from a forward pass (:class:`~segood.models.SegOutput`), higher = more OOD, within
        :attr:`score_range` (unbounded where it is None)."""
        raise NotImplementedError(f"{type(self).__name__} is not scored from a forward pass")

    def objective(self, output):
        """The scalar whose input gradient perturbs the input (``needs.perturbs``)."""
        raise NotImplementedError(f"{type(self).__name__} has no input perturbation")

    def __call__(self, model, images, *, seeds=None):
        """Score maps (N, H, W), higher = more OOD, of uint8 RGB ``images`` (N, 3, H, W) or one (3, H, W), as sets
        store frames, from a segood network or any ``nn.Module`` returning logits: wrapped and normalised as
        :func:`segood.evaluate` does (:func:`~segood.models.external.as_network`,
        :func:`~segood.models.network.preprocess`), on the model's device. ``seeds``: as :meth:`score`'s."""
        from segood.models.external import as_network
        from segood.models.network import preprocess

        images = torch.as_tensor(images)
        if images.dtype != torch.uint8 or images.ndim not in (3, 4) or images.shape[-3] != 3:
            raise ValueError(f"expected uint8 RGB images (N, 3, H, W) or (3, H, W) as sets store frames, got "
                             f"{images.dtype} of shape {tuple(images.shape)}; for ImageNet-normalised float input "
                             "call method.score(model, x)")
        network = as_network(model)
        scores = self.score(network, preprocess(images.to(device_of(network)).reshape(-1, *images.shape[-3:])),
                            seeds=seeds)[0]
        return scores[0] if images.ndim == 3 else scores

    def score(self, model, x, *, seeds=None):
        """(scores (N, H, W), predicted classes (N, H, W)) of ImageNet-normalised images x (N, 3, H, W), from a segood
        network or any ``nn.Module`` returning logits (wrapped as :meth:`__call__` wraps it), in eval mode (each of
        its modules back in its own mode after). ``seeds``: one per frame, for the Monte-Carlo methods' dropout
        masks (``segood.methods.schedule.frame_seeds(0, set_name, indices)``: those ``segood evaluate`` draws);
        None: torch's global generator."""
        from segood.methods.schedule import score_batch
        from segood.models.external import as_network

        with evaluation_mode(as_network(model)) as network:
            batch = score_batch(network, x, [self], mc_seeds=seeds)
        return batch.scores[0], batch.classes


class Fitted(Method):
    """Base of the methods fitted on training data (``fit(model, loader)``); their statistics are plain arrays
    named by ``STATE_KEYS`` (``state_arrays`` / ``load_state``: ``numpy.savez``-able, loaded without pickle)."""

    STATE_KEYS = ()

    def __init__(self, **params):
        super().__init__(**params)
        self.state = None

    @property
    def needs(self):
        return replace(super().needs, fit=True)

    @property
    def ready(self):
        return self.state is not None

    def state_arrays(self):
        """The fitted statistics as plain numpy arrays."""
        return {k: v.cpu().numpy() for k, v in self.state.items()}

    def load_state(self, arrays):
        missing = [k for k in self.STATE_KEYS if k not in arrays]
        if missing:
            raise ValueError(f"{self.name} state lacks {missing}")
        self.state = {k: torch.as_tensor(np.asarray(arrays[k])) for k in self.STATE_KEYS}
        return self


class MonteCarlo(Method):
    """Base of the dropout methods: T samples of the stochastic head on the shared features
    (``model.mc_logits``); a subclass implements ``from_samples(logits (T, N, C, H, W)) -> (N, H, W)``.

    Methods that can share work on the same samples opt in with one function, ``from_samples_together(methods,
    logits) -> [scores]``, set on each of their classes: the scheduler hands it every method of one sample count
    that names it, and scores the others one by one.
    """

    head = "dropout"
    from_samples_together = None

    def __init__(self, samples=8, **params):
        if isinstance(samples, bool) or int(samples) < 2:
            raise ValueError(f"{self.name} needs at least 2 Monte-Carlo samples (their spread is the score), got "
                             f"{samples!r}")
        super().__init__(samples=int(samples), **params)

    @property
    def needs(self):
        return Needs(head=self.head, samples=self.params["samples"])

    def from_samples(self, logits):
        raise NotImplementedError(f"{type(self).__name__} must implement from_samples(logits)")


def _dropout_uncertainties(methods, logits):
    """VarSum and mutual information of the same samples in one banded pass (:func:`fn.monte_carlo_scores`)."""
    out = fn.monte_carlo_scores(logits, tuple(dict.fromkeys(m.quantity for m in methods)))
    return [out[m.quantity] for m in methods]


def _logit_scores_together(methods, output):
    """The methods that are a formula of the logits, from one read of them (:func:`fn.logit_scores`)."""
    return fn.logit_scores(output.logits, [m.logit_form for m in methods])


class LogitMethod(Method):
    """Base of the methods that are a formula of the logits alone, (form, temperature) of
    :data:`segood.methods.functional.LOGIT_FORMS`: scored together from one read of the logits where the device
    can (:func:`~segood.methods.functional.logit_scores`), each alone otherwise."""

    from_output_together = staticmethod(_logit_scores_together)

    def __init_subclass__(cls, **keywords):
        super().__init_subclass__(**keywords)
        if cls.from_output is not LogitMethod.from_output:  # a formula of its own (or a mixin's): scored alone
            cls.from_output_together = None

    form = None  # its key in LOGIT_FORMS (a subclass under another name keeps its parent's)

    @property
    def logit_form(self):
        return self.form, self.params.get("temperature", 1.0)

    def from_output(self, output):
        name, temperature = self.logit_form
        return fn.LOGIT_FORMS[name](output.logits, temperature)


@register_method
class MaxSoftmax(LogitMethod):
    """1 - max softmax (Hendrycks & Gimpel 2017). Any head."""

    name = "max_softmax"
    form = "max_softmax"


@register_method
class Odin(LogitMethod):
    """ODIN (Liang et al. 2018): temperature T and input perturbation ε (the seed paper's eq. 4-6),
    x~ = x - ε sign(-∇_x Σ_pixels log S_ŷ(x; T)): the step that raises the max softmax, which moves ID inputs
    more than OOD ones. Any head. Grid: T in ODIN_TEMPERATURES, ε in ODIN_EPSILONS.

    ``form`` chooses how the score is written; both order pixels alike (exact metrics agree), higher = more OOD:
    "spread" (the default), :func:`~segood.methods.functional.odin_spread`, every real number, at full float
    precision at any T; "softmax", the paper's 1 - max softmax at T (:func:`~segood.methods.functional.odin`), in
    [0, 1], which crowds near 1 - 1/C at a large T (so binned metrics cannot resolve it; docs/grids.md). The
    linear grid needs [0, 1]: ODIN named on that grid takes the "softmax" form (:func:`method_for_grid`)."""

    name = "odin"
    ascend = True
    FORMS = ("spread", "softmax")

    def __init__(self, temperature=1000.0, epsilon=0.0, form="spread", **params):
        if not float(temperature) > 0:
            raise ValueError(f"the ODIN temperature must be positive, got {temperature}")
        if form not in self.FORMS:
            raise ValueError(f"ODIN's form must be one of {', '.join(self.FORMS)}, got {form!r}")
        super().__init__(temperature=float(temperature), epsilon=float(epsilon), form=form, **params)

    @property
    def score_range(self):
        return (0.0, 1.0) if self.params["form"] == "softmax" else None

    @property
    def logit_form(self):
        return "odin" if self.params["form"] == "softmax" else "odin_spread", self.params["temperature"]

    def objective(self, output):  # Σ_pixels log S_ŷ(x; T)
        return (output.logits / self.params["temperature"]).log_softmax(dim=1).amax(dim=1).sum()


@register_method
class Mahalanobis(Fitted):
    """Mahalanobis distance to per-location class means under one covariance per class (Lee et al. 2018,
    as adapted by the seed paper, eq. 7-12), on the 32-d features of the ``dimreduce`` head.

    ``fit(model, loader)`` streams the training set twice in float64 with memory independent of its size:
    pass 1 sums features, their outer products and counts per class (and location), giving μ_ci and
    Σ_c = (Σ f f^T - Σ_i n_ci μ_ci μ_ci^T) / N_c; pass 2 gives the mean μ and std s of M over the training set.
    Score: the distance M itself, bilinearly resized to the input (unbounded: the float-order grid bins it as it
    is); ``squash=True`` gives the paper's sigmoid((M - μ) / s) in [0, 1], for its linear grid (the same ranking
    up to float32 saturation ties). Optional perturbation x~ = x - ε sign(∇_x Σ M)
    moves the input towards the nearest class mean (Lee et al.'s direction; the seed's eq. 11 prints one more
    minus sign).
    """

    name = "mahalanobis"
    head = "dimreduce"
    STATE_KEYS = ("means", "whiten", "present", "m_mean", "m_std")

    def __init__(self, epsilon=0.0, ridge=1e-6, squash=False, **params):
        super().__init__(epsilon=float(epsilon), ridge=float(ridge), **({"squash": True} if squash else {}), **params)
        self._scoring = None  # (device, whiten, whitened means, present), derived from the state

    @torch.no_grad()
    def fit(self, model, loader, *, progress=False):
        """Fit on batches of dicts with ``image`` (N, 3, H, W) uint8 and ``semantic`` (N, H, W) trainIds.

        ``loader`` is read twice, so it must be re-iterable (a DataLoader or a list, not a generator). The
        class-conditional Gaussians are those of the training labels, the 19 Cityscapes trainIds: the one method
        that needs the model's classes to be them (a ValueError otherwise).
        """
        from tqdm import tqdm

        from segood.models.external import as_network
        from segood.models.network import preprocess

        with evaluation_mode(as_network(model)) as model:  # (any nn.Module: its features from its feature_layer)
            self.check(model)
            if iter(loader) is loader:
                raise TypeError("mahalanobis.fit reads the loader twice: pass a DataLoader or a list, not an iterator")
            device = device_of(model)
            stats = ClassFeatureStats(NUM_CLASSES)
            for batch in tqdm(loader, desc="mahalanobis fit 1/2", disable=not progress):
                x = preprocess(batch["image"].to(device))
                if stats.sums is None:
                    _require_cityscapes_classes(model, x, self.name)
                features = model.penultimate(x)
                stats.update(features, batch["semantic"].to(device))
            means, whiten, present = stats.finalize(self.params["ridge"])
            self.state = {"means": means, "whiten": whiten, "present": present,
                          "m_mean": torch.zeros((), dtype=torch.float64), "m_std": torch.ones((), dtype=torch.float64)}
            self._scoring = None
            total = total_sq = count = 0.0  # pass 2: mean and std of M over the training set
            for batch in tqdm(loader, desc="mahalanobis fit 2/2", disable=not progress):
                m = self._distance(model.penultimate(preprocess(batch["image"].to(device))))
                m = m[torch.isfinite(m)]
                total, total_sq, count = total + m.sum().item(), total_sq + m.square().sum().item(), count + m.numel()
            mean = total / count
            self.state["m_mean"] = torch.tensor(mean, dtype=torch.float64)
            self.state["m_std"] = torch.tensor(max(total_sq / count - mean * mean, 1e-24) ** 0.5, dtype=torch.float64)
        return self

    def _distance(self, features):
        """(N, h, w) minimum distance of penultimate features (N, D, h, w), in float64."""
        fitted = tuple(self.state["present"].shape[1:])
        if tuple(features.shape[-2:]) != fitted:
            raise ValueError(f"{self.name} models per-location class means of {fitted[0]}×{fitted[1]} feature maps (its "
                             f"fit set's frame size); these frames give {features.shape[-2]}×{features.shape[-1]}: fit "
                             "it on frames of this size, or convert the set at the fit set's size (--size H W)")
        if self._scoring is None or self._scoring[0] != features.device:
            s = {k: self.state[k].to(features.device) for k in ("means", "whiten", "present")}
            self._scoring = (features.device, s["whiten"], fn.whiten_means(s["means"], s["whiten"]), s["present"])
        return fn.mahalanobis_min_distance(features.to(torch.float64), *self._scoring[1:])

    def from_output(self, output):
        m = self._distance(output.features)  # inf where no class was seen
        if self.params.get("squash"):  # sigmoid gives 1 at inf
            v = fn.mahalanobis_score(m, self.state["m_mean"].to(m.device), self.state["m_std"].to(m.device))
        else:  # a finite stand-in for inf, far above every distance, so that interpolation never makes NaN
            v = m.clamp_max(UNSEEN_DISTANCE)
        v = F.interpolate(v[:, None].float(), size=output.logits.shape[-2:], mode="bilinear", align_corners=False)
        return v[:, 0].clamp(0.0, 1.0) if self.params.get("squash") else v[:, 0]

    @property
    def score_range(self):
        return (0.0, 1.0) if self.params.get("squash") else None

    def objective(self, output):
        return self._distance(output.features).clamp_max(1e30).sum()

    def load_state(self, arrays):
        super().load_state(arrays)
        self._scoring = None
        return self


@register_method
class Confidence(Method):
    """1 - learned confidence (DeVries & Taylor 2018); needs the ``confidence`` head. Optional perturbation
    x~ = x - ε sign(∇_x L_c), L_c = mean(-log c) (the seed paper's eq. 19), which raises the confidence."""

    name = "confidence"
    head = "confidence"

    def __init__(self, epsilon=0.0, **params):
        super().__init__(epsilon=float(epsilon), **params)

    def from_output(self, output):
        return fn.confidence_score(output.confidence)

    def objective(self, output):
        return -torch.log(output.confidence.clamp_min(1e-12)).mean()


@register_method
class Entropy(LogitMethod):
    """Softmax entropy / log C (Mukhoti & Gal 2018). Any head."""

    name = "entropy"
    form = "entropy"


@register_method
class VarSum(MonteCarlo):
    """Sum of per-class variances over T dropout samples / (1 - 1/C) (Kendall et al. 2015); in [0, 1]."""

    name = quantity = "varsum"
    from_samples_together = staticmethod(_dropout_uncertainties)

    def from_samples(self, logits):
        return fn.monte_carlo_scores(logits, ("varsum",))["varsum"]


@register_method
class MutualInfo(MonteCarlo):
    """Mutual information of T dropout samples / log C (Mukhoti & Gal 2018, eq. 25-27); in [0, 1]."""

    name = quantity = "mutual_info"
    from_samples_together = staticmethod(_dropout_uncertainties)

    def from_samples(self, logits):
        return fn.monte_carlo_scores(logits, ("mutual_info",))["mutual_info"]


@register_method
class MaxLogit(LogitMethod):
    """-max_c f_c (Hendrycks et al. 2022). Any head; unbounded (the float-order grid)."""

    name = "max_logit"
    form = "max_logit"
    score_range = None


@register_method
class Energy(LogitMethod):
    """Energy -T logsumexp(f / T) (Liu et al. 2020). Any head; unbounded."""

    name = "energy"
    form = "energy"
    score_range = None

    def __init__(self, temperature=1.0, **params):
        if not float(temperature) > 0:
            raise ValueError(f"the energy temperature must be positive, got {temperature}")
        super().__init__(temperature=float(temperature), **params)


@register_method
class StandardizedMaxLogit(Fitted):
    """Standardized max logit (Jung et al. 2021): -(max_c f_c - mu_k) / sigma_k for the predicted class k, with
    mu_k, sigma_k the mean and std of the max logit over training pixels predicted as k (``fit``). Optional, as
    in its paper: ``boundary_suppression`` (class boundaries take their non-boundary neighbours' mean, width 4
    in 4 steps) and ``smoothing`` (a 7x7 Gaussian, sigma 1, dilation 6). Any head; unbounded."""

    name = "sml"
    score_range = None
    STATE_KEYS = ("means", "stds")

    def __init__(self, boundary_suppression=False, smoothing=False, **params):
        super().__init__(**({"boundary_suppression": True} if boundary_suppression else {}),
                         **({"smoothing": True} if smoothing else {}), **params)

    @torch.no_grad()
    def fit(self, model, loader, *, progress=False):
        """Per-class mean and std of the max logit over the pixels of ``loader`` (batches with ``image``)
        predicted as each class, in float64 (std over the pixels, not their sample estimate); a class predicted on
        fewer than two pixels (no spread to measure) gets mean 0 and std 1, one whose max logits all tie std 1."""
        from tqdm import tqdm

        from segood.models.external import as_network
        from segood.models.network import frame_output, preprocess

        with evaluation_mode(as_network(model)) as model:  # (any nn.Module returning logits, as score() takes it)
            self.check(model)
            device = device_of(model)
            sums = None
            for batch in tqdm(loader, desc="sml fit", disable=not progress):
                x = preprocess(batch["image"].to(device))
                logits = frame_output(model, x).logits  # as scored: at the frame's size
                top, classes = logits.max(dim=1)
                c = logits.shape[1]
                if sums is None:
                    sums = torch.zeros(3, c, dtype=torch.float64, device=device)
                top, classes = top.double().flatten(), classes.flatten()
                sums[0] += torch.bincount(classes, minlength=c)
                sums[1] += torch.bincount(classes, weights=top, minlength=c)
                sums[2] += torch.bincount(classes, weights=top * top, minlength=c)
        if sums is None:
            raise ValueError("sml.fit: the loader was empty")
        count = sums[0].clamp_min(1)
        means = sums[1] / count
        stds = (sums[2] / count - means**2).clamp_min(0).sqrt()
        seen = sums[0] > 1
        self.state = {"means": torch.where(seen, means, 0.0).cpu(),
                      "stds": torch.where(seen & (stds > 0), stds, 1.0).cpu()}
        return self

    def from_output(self, output):
        means, stds = (self.state[k].to(output.logits.device, output.logits.dtype) for k in self.STATE_KEYS)
        scores, classes = fn.standardized_max_logit(output.logits, means, stds)
        if self.params.get("boundary_suppression"):
            scores = fn.boundary_suppression(scores, classes)
        if self.params.get("smoothing"):
            scores = fn.dilated_smoothing(scores)
        return scores


def _require_cityscapes_classes(model, x, method):
    """Refuse a model whose classes are not the 19 Cityscapes trainIds the training labels give."""
    classes = getattr(getattr(model, "config", None), "num_classes", None)
    if classes is None:
        with torch.no_grad():
            classes = model(x).logits.shape[1]
    if classes != NUM_CLASSES:
        raise ValueError(f"{method} models the features of each class of the training labels (the {NUM_CLASSES} "
                         f"Cityscapes trainIds); this model predicts {classes} classes. Use a model trained on "
                         "those classes, or a method that needs no class mapping (max_softmax, entropy, odin, "
                         "max_logit, energy, sml)")


class ClassFeatureStats:
    """Streaming float64 statistics of features per class: per-location means μ_ci and one covariance Σ_c per
    class (the seed paper's eq. 7-8). Memory: O(C h w D + C D^2), whatever the number of images."""

    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.sums = self.counts = self.outer = None

    def update(self, features, semantic):
        """features: (N, D, h, w); semantic: (N, H, W) trainIds (255 = none), resized to (h, w) with nearest."""
        feats = features.detach().to(torch.float64).permute(0, 2, 3, 1)  # (N, h, w, D)
        labels = F.interpolate(semantic[:, None].float(), size=feats.shape[1:3], mode="nearest")[:, 0].long()
        _, h, w, d = feats.shape
        if self.sums is None:
            self.sums = feats.new_zeros(self.num_classes, h, w, d)
            self.counts = feats.new_zeros(self.num_classes, h, w)
            self.outer = feats.new_zeros(self.num_classes, d, d)
        for c in labels.unique().tolist():
            if c < self.num_classes:
                mask = labels == c
                self.sums[c] += (feats * mask[..., None]).sum(dim=0)
                self.counts[c] += mask.sum(dim=0)
                selected = feats[mask]
                self.outer[c] += selected.T @ selected

    def finalize(self, ridge=1e-6):
        """(means (C, h, w, D), whiten (C, D, D) = inverse Cholesky factors, present (C, h, w) bool).

        Σ_c = (Σ f f^T - Σ_i n_ci μ_ci μ_ci^T) / N_c plus ``ridge`` times its mean variance on the diagonal
        (grown tenfold until Σ_c is positive definite, for classes seen only once per location).
        A class with at most D pixels gets no covariance and is never the nearest.
        """
        if self.sums is None:
            raise ValueError("no features seen: the loader was empty")
        present = self.counts > 0
        means = self.sums / self.counts.clamp_min(1)[..., None]
        totals = self.counts.sum(dim=(1, 2))
        d = self.outer.shape[-1]
        eye = torch.eye(d, dtype=torch.float64, device=self.outer.device)
        whiten = torch.zeros_like(self.outer)
        for c in range(self.num_classes):
            if totals[c] <= d:
                present[c] = False
                continue
            cov = (self.outer[c] - torch.einsum("hw,hwi,hwj->ij", self.counts[c], means[c], means[c])) / totals[c]
            jitter = ridge * max(cov.diagonal().mean().item(), 1e-12)
            for _ in range(12):  # few samples per location can leave Σ_c singular: grow the ridge until PD
                chol, info = torch.linalg.cholesky_ex(cov + jitter * eye)
                if info == 0:
                    break
                jitter *= 10
            whiten[c] = torch.linalg.solve_triangular(chol, eye, upper=False)
        if not present.any():
            raise ValueError(f"no class has more labelled feature-map pixels than the {d} feature channels: "
                             f"{int(totals.sum())} in all. Fit on more frames with semantic labels, such as Cityscapes "
                             "train (a noise set labels none), or on a feature layer of fewer channels")
        return means, whiten, present


UNSEEN_DISTANCE = 1e30  # Mahalanobis distance where no class was seen in training


#: parameters that give a method, named on the linear grid, the [0, 1] form of its score (the same order)
LINEAR_FORMS = {"odin": {"form": "softmax"}}


def method_for_grid(name: str, grid: dict) -> Method:
    """The method ``name`` with default parameters, in the form ``grid`` can bin: on the linear grid, the
    [0, 1] form of its score where it has one of the same order (:data:`LINEAR_FORMS`: ODIN's paper form)."""
    return get_method(name, **(LINEAR_FORMS.get(name, {}) if grid["kind"] == "linear" else {}))


def fits_grid(method, grid):
    """Whether the grid can bin the method's scores: the linear grid needs them in its range."""
    if grid["kind"] != "linear":
        return True
    lo, hi = grid["score_range"]
    return method.score_range is not None and lo <= method.score_range[0] and method.score_range[1] <= hi


def check_grid(method, grid):
    """Refuse a method whose scores the grid cannot bin (:func:`fits_grid`)."""
    if not fits_grid(method, grid):
        lo, hi = grid["score_range"]
        raise ValueError(f"{method.name} scores are {'unbounded' if method.score_range is None else method.score_range}"
                         f"; the linear grid bins scores in [{lo:g}, {hi:g}] only. Use the float-order grid (the "
                         "default: drop --num-thresholds / num_thresholds), or the method's [0, 1] form if it has "
                         "one (mahalanobis: squash=True, the paper's sigmoid; odin: form='softmax', the paper's "
                         "1 - max softmax at T)")


def get_method(name: str, **params) -> Method:
    """A method by name, with ``params``; KeyError listing the valid names, ValueError where its class does not take
    these parameters (a registered method is built by name: every argument of its ``__init__`` has a default)."""
    cls = METHODS[name]
    try:
        inspect.signature(cls).bind(**params)
    except TypeError as err:
        fix = (f"give every argument of {cls.__qualname__}.__init__ a default" if "missing" in str(err) else
               f"let {cls.__qualname__}.__init__ take **params and pass them on to Method.__init__ (tuning records "
               "its point as params['tuning'])")
        raise ValueError(f"method {name!r} cannot be built from its name and {params or 'no parameters'} ({err}); "
                         f"a registered method is built by name (--methods, methods='all', tuning): {fix}") from None
    return cls(**params)


def list_methods(**needs) -> list[str]:
    """Names of the registered methods whose default :class:`Needs` match every field given, e.g.
    ``list_methods(head="dropout")``, ``list_methods(fit=False)``."""
    unknown = set(needs) - {f for f in Needs.__dataclass_fields__}
    if unknown:
        raise TypeError(f"list_methods filters on the fields of Needs ({', '.join(Needs.__dataclass_fields__)}), "
                        f"not {sorted(unknown)}")
    return [name for name, cls in METHODS.items()
            if all(getattr(cls().needs, key) == value for key, value in needs.items())]
