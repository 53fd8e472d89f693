"""One scoring function for a batch of methods, scheduled from what each declares (:class:`Needs`).

The network's forward pass runs once and feeds every method scored from it (the logit methods from one read of the
logits, :func:`segood.methods.functional.logit_scores`); one set of Monte-Carlo dropout
samples (as many as the most demanding method asks for) feeds every dropout method, those of one sample
count in one banded pass; a method that perturbs its input gets its own gradient and forward pass.
Evaluation, tuning and the benchmarks all score through :func:`score_batch`. Logits that come out at another
resolution than the input (heads before their final resize) are resized to it first
(:func:`segood.models.network.resize_output`), so every method scores frame-sized outputs.
"""

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from segood._threads import for_network
from segood.models.network import IMAGENET_STD, pad_to_multiple, preprocess, resize_output
from segood.models.predict import predicted_classes
from segood.registry import check_name

AMP_DTYPES = {None: None, "fp16": torch.float16, "bf16": torch.bfloat16}  # segood's names -> autocast's dtypes


@dataclass
class ScoredBatch:
    """output: the plain forward pass (:class:`~segood.models.SegOutput`, logits at the input's size; None for a
    :class:`~segood.methods.scorer.Scorer`); scores: one (N, H, W) tensor per method, in the order given; clock:
    the time per stage (:attr:`seconds`); resized: whether the model's logits came out at another size and were
    resized. :attr:`classes`, the predicted classes (N, H, W) or None, are computed when first asked for (an
    argmax over every logit map costs as much as scoring a method)."""

    output: object
    scores: list
    clock: "_Clock"
    resized: bool = False

    @functools.cached_property
    def classes(self):
        return None if self.output is None else predicted_classes(self.output.logits)

    @property
    def seconds(self):
        """{stage: seconds} for ``forward`` and ``score/<method name>``."""
        return self.clock.seconds()


def refuse_unrecordable(methods):
    """Refuse methods a run cannot record: one name twice (a run's tables and files are named by it; tuning scores
    several points of one method together), or a parameter JSON cannot hold (run.json records them)."""
    names = [method.name for method in methods]
    for name in names:
        check_name("method", name)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} named twice: give each method once (its tables and files are named by "
                         "it)")
    for method in methods:
        for key, value in method.params.items():
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise ValueError(f"method {method.name}'s parameter {key}={value!r} ({type(value).__name__}) cannot "
                                 "be recorded in run.json: give it as a finite number, string, boolean, None, or a "
                                 "list or dict of these") from None


def unfitted_methods(model, methods, fit_set):
    """The methods that need a fit and have none, once every method's head is checked (fit them with
    :func:`fit_methods` when everything else is checked too); a ValueError where some do and there is no
    ``fit_set``, a converted training set, to fit them on."""
    for method in methods:
        method.check(model)
    unfitted = [m for m in methods if not m.ready]
    if unfitted and fit_set is None:
        raise ValueError(f"{unfitted[0].name} needs its training statistics: pass --fit-set (fit_set), a converted "
                         "training set")
    return unfitted


def fit_methods(model, methods, fit_set, *, batch_size=2, progress=False):
    """Fit each of ``methods`` on the converted training set ``fit_set``."""
    from segood.data.h5 import H5SegmentationDataset, frame_loader

    for method in methods:
        method.fit(model, frame_loader(H5SegmentationDataset(fit_set), batch_size), progress=progress)


def check_methods(model, methods):
    """Refuse a network without a method's head, or a method that needs a fit and has none."""
    for method in methods:
        method.check(model)
        if not method.ready:
            raise ValueError(f"{method.name} needs its training statistics: fit it on a training set first "
                             "(segood evaluate --fit-set)")


def frame_seeds(seed, key, frames):
    """The Monte-Carlo seed of each of the ``frames`` (indices or frame ids) of the set ``key`` (its name in a
    run): the first 63 bits of sha256 of (seed, key, frame), the same for a frame whatever batch, shard or order of
    sets it comes in."""
    return [int.from_bytes(hashlib.sha256(f"{seed}/{key}/{frame}".encode()).digest()[:8], "little") >> 1
            for frame in frames]


def score_batch(model, x, methods, *, mc_seeds=None, amp=None):
    """Score ``methods`` on ImageNet-normalised images ``x`` (N, 3, H, W) on the model's device.

    Frames of any size: where the network needs sides divisible by its stride (``model.input_multiple``),
    ``x`` is padded at the bottom and right with zeros (the mean colour) and every output cropped back, so the
    padding is never scored (it does enter the gradient of a perturbing method's objective).
    ``mc_seeds``: one seed per frame (:func:`frame_seeds`) for its dropout masks, so that a frame draws the same
    samples in any batch: a resumed, sharded or re-batched run those of any other (None: torch's global
    generator). Logits (and confidence) at another resolution than ``x`` are
    resized to it bilinearly, with the model's ``align_corners`` (False where it declares none), before any
    method sees them, in the perturbing methods' objectives too. ``amp`` ("fp16", "bf16"): the forward passes
    and Monte-Carlo samples under autocast in that precision, their outputs widened to float32 before scoring.
    Returns a :class:`ScoredBatch`.
    """
    frame = tuple(x.shape[-2:])
    x = pad_to_multiple(x, getattr(model, "input_multiple", 1))
    check_methods(model, methods)
    needs = [m.needs for m in methods]
    scores = [None] * len(methods)
    clock = _Clock(x.device)
    size, align_corners = tuple(x.shape[-2:]), getattr(model, "align_corners", False)

    def at_input(output):
        return resize_output(output, size, align_corners=align_corners)

    @contextlib.contextmanager
    def network():  # (every thread on the CPU; under autocast with amp)
        with for_network(x.device), (torch.autocast(x.device.type, dtype=AMP_DTYPES[amp]) if amp
                                     else contextlib.nullcontext()):
            yield

    with torch.no_grad():
        with network():
            raw = model(x)
        raw = _tensors(raw, _widened) if amp else raw
        resized = tuple(raw.logits.shape[-2:]) != size
        output = at_input(raw)
        clock.lap("forward")
        _score_shared(methods, [k for k, n in enumerate(needs) if n.forward], "from_output_together",
                      lambda m, out: m.from_output(out), output, scores, clock)
        sampled = [k for k, n in enumerate(needs) if n.samples]
        if sampled:
            with network():
                logits = model.mc_logits(x, samples=max(needs[k].samples for k in sampled), features=output.features,
                                         seeds=mc_seeds)
            logits = _widened(logits)
            if tuple(logits.shape[-2:]) != size:
                logits = F.interpolate(logits.flatten(0, 1), size=size, mode="bilinear",
                                       align_corners=align_corners).unflatten(0, logits.shape[:2])
            for count in sorted({needs[k].samples for k in sampled}):
                _score_shared(methods, [k for k in sampled if needs[k].samples == count], "from_samples_together",
                              lambda m, samples: m.from_samples(samples), logits[:count], scores, clock)
    for k, method in enumerate(methods):
        if needs[k].perturbs:
            x_tilde = perturb(model, x, lambda out, m=method: m.objective(at_input(out)), method.params["epsilon"],
                              ascend=method.ascend)
            with torch.no_grad():
                with for_network(x.device):
                    output_tilde = model(x_tilde)
                scores[k] = method.from_output(at_input(output_tilde))
            clock.lap(f"score/{method.name}")
    if size != frame:
        output, scores = _crop((output, scores), size, frame)
    return ScoredBatch(output, scores, clock, resized)


def compiled(model, backend="inductor"):
    """A shallow copy of the network ``model`` whose forward pass is ``torch.compile``d with ``backend``: it shares
    the parameters and every other pass (Monte-Carlo samples, features) with ``model``, which is left as it is."""
    if not isinstance(model, torch.nn.Module) or getattr(model, "scores_frames", False):
        raise ValueError(f"compile needs a network (an nn.Module); {type(model).__name__} is not one")
    check_compile_backend(backend)
    twin = copy.copy(model)  # (its dicts of parameters and submodules are the model's own)
    twin.forward = torch.compile(model.forward, backend=backend)
    return twin


def check_compile_backend(backend):
    """Refuse a name that is not one of ``torch.compile``'s backends."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(f"compile: unknown torch.compile backend {backend!r}; known here: {', '.join(known)}")


def score_frames(model, images, methods, *, mc_seeds=None, amp=None, out=None):
    """Score uint8 RGB frames ``images`` (N, 3, H, W) on the model's device: a
    :class:`~segood.methods.scorer.Scorer` (``methods`` is ``[model]``) gets them contiguous (a device's batches
    from the readers are channels last), a network their ImageNet-normalised copy (:func:`score_batch`, with
    ``amp``), written into ``out`` where given (see :func:`~segood.models.network.preprocess`). Returns a
    :class:`ScoredBatch`."""
    if not getattr(model, "scores_frames", False):  # (a Scorer: it returns the anomaly scores itself)
        return score_batch(model, preprocess(images, out), methods, mc_seeds=mc_seeds, amp=amp)
    check_methods(model, methods)
    clock = _Clock(images.device)
    with for_network(images.device):
        scores = model(images.contiguous())
    clock.lap(f"score/{model.name}")
    return ScoredBatch(None, [scores], clock)


def perturb(model, x, objective, epsilon, *, ascend):
    """x~ = x ± ε sign(∇_x objective), with ε in pixel units (divided by the normalisation std per channel).

    ``ascend``: step up the objective's gradient (ODIN: raise log S_ŷ), else down (confidence: lower -log c;
    Mahalanobis: lower the distance). Either way the step makes the input look more ID to the model.
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad(), for_network(x.device):  # (the input's gradient only: the weights' .grad untouched)
        gradient, = torch.autograd.grad(objective(model(x)), x)
    std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    step = epsilon * gradient.sign() / std
    return (x + step if ascend else x - step).detach()


def _score_shared(methods, indices, hook_name, alone, value, scores, clock):
    """Put into ``scores[k]`` the scores of ``methods[k]`` for k in ``indices``, from ``value`` (the forward
    pass, or Monte-Carlo samples): the methods whose class sets the hook ``hook_name`` share one call of it per
    hook, the others are scored ``alone(method, value)``; a clock lap per call."""
    together = {}
    for k in indices:
        hook = getattr(type(methods[k]), hook_name, None)
        if hook is None:
            before = _versions(value)
            scores[k] = alone(methods[k], value)
            if _versions(value) != before:  # (the methods after it would score what it left)
                raise ValueError(f"method {methods[k].name} changed the network's outputs in place (such as "
                                 "output.logits /= T): every method scores the same outputs, so compute on new "
                                 "tensors (output.logits / T)")
            clock.lap(f"score/{methods[k].name}")
        else:
            together.setdefault(hook, []).append(k)
    for hook, group in together.items():
        for k, score in zip(group, hook([methods[k] for k in group], value)):
            scores[k] = score
        clock.lap(tuple(f"score/{methods[k].name}" for k in group))  # (one fused pass: its time shared)


def _versions(value):
    """The version counters of the tensors in ``value``: an in-place change of any of them moves its counter."""
    counters = []
    _tensors(value, lambda tensor: counters.append(tensor._version))
    return counters


def _tensors(value, change):
    """``value`` with ``change`` applied to every tensor in it (nested in lists, tuples and dataclasses)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v, change) for v in value)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _tensors(getattr(value, f.name), change)
                                             for f in dataclasses.fields(value)})
    return change(value) if isinstance(value, torch.Tensor) else value


def _widened(tensor):
    """A half-precision tensor (from autocast) as float32; any other as it is."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _crop(value, padded, size):
    """Every tensor in ``value`` at the ``padded`` input's resolution, cropped to the frame's ``size`` = (H, W); every
    other tensor (features, query outputs) is left as it is."""
    def crop(tensor):
        if tensor.ndim >= 2 and tuple(tensor.shape[-2:]) == tuple(padded):
            return tensor[..., : size[0], : size[1]].contiguous()
        return tensor

    return _tensors(value, crop)


class _Clock:
    """The time of each stage since the last lap. On CUDA a lap records an event and waits for nothing: the
    stages' times are read (:meth:`seconds`) once the work is done, so timing never stalls the device's queue."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.laps = [(None, self._mark())]

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, stage):
        """The time since the last lap is ``stage``'s, or shared equally by a tuple of stages (done together)."""
        self.laps.append((stage, self._mark()))

    def seconds(self):
        out = {}
        for (_, start), (stage, end) in zip(self.laps, self.laps[1:]):
            if self.cuda:
                end.synchronize()
            seconds = start.elapsed_time(end) / 1000 if self.cuda else end - start
            names = stage if isinstance(stage, tuple) else (stage,)
            for name in names:
                out[name] = out.get(name, 0.0) + seconds / len(names)
        return out
