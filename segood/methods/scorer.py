"""Scorers: callables that return anomaly scores directly (``images -> scores``), evaluated in the place of a model
and its methods, through the same accumulators, bootstrap and report.

SegmentMeIfYouCan's own evaluation loop hands a method one RGB image and takes an H×W score map back; a scorer is
that shape of method, batched or (``per_image``) exactly as SegmentMeIfYouCan calls it.
"""

from typing import Callable

import numpy as np
import torch

from segood.methods.methods import Needs
from segood.registry import import_user_module


class Scorer:
    """A callable that returns per-pixel anomaly scores, evaluated as a method of its own.

    Args:
        fn: ``fn(images) -> scores``: ``images`` a uint8 RGB tensor (N, 3, H, W), as the set stores the frames
            (not normalised: the callable does its own preprocessing), on the run's device (CPU unless one is
            given); ``scores`` (N, H, W), a torch tensor or numpy array of real numbers, higher = more OOD
            (±inf allowed, NaN not). With ``per_image``: ``fn(image) -> score`` as SegmentMeIfYouCan's loop
            calls a method, ``image`` a uint8 numpy array (H, W, 3) RGB, ``score`` (H, W).
        name: its name in the tables (default: the function's ``__name__``).
        per_image: call ``fn`` once per frame with a numpy image, as above.
        score_range: (lo, hi) of its scores where bounded (the linear grid needs one); None: unbounded.
    """

    needs = Needs()  # scheduled by nothing: it scores the frames itself
    scores_frames = True  # what segood.methods.schedule.score_frames asks (without importing this module)
    ready = True
    served_heads = frozenset()

    def __init__(self, fn: Callable, *, name: str | None = None, per_image: bool = False,
                 score_range: tuple[float, float] | None = None):
        if not callable(fn):
            raise TypeError(f"a scorer must be callable (images -> scores), got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.per_image = bool(per_image)
        self.score_range = None if score_range is None else tuple(float(v) for v in score_range)
        self.params = {"scorer": _qualified_name(fn), "per_image": self.per_image,
                       **({"score_range": list(self.score_range)} if self.score_range else {})}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """(N, H, W) scores of uint8 images (N, 3, H, W), checked: one real, non-NaN score per pixel."""
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"a scorer takes uint8 RGB images (N, 3, H, W), got {images.dtype} of shape "
                             f"{tuple(images.shape)}")
        height, width = images.shape[-2:]
        with torch.no_grad():
            if self.per_image:
                frames = [np.ascontiguousarray(image.permute(1, 2, 0).cpu().numpy()) for image in images]
                return torch.stack([self._checked(self._call(frame, f"image {k} of the batch"), (height, width),
                                                  f"image {k} of the batch") for k, frame in enumerate(frames)])
            return self._checked(self._call(images, "the batch"), (len(images), height, width), "the batch")

    def _call(self, images, what):
        """``fn(images)``; what it raises, a ValueError naming the scorer and its exception (a traceback points into
        the user's code only with the Python API, where the exception is chained)."""
        try:
            return self.fn(images)
        except Exception as err:  # noqa: BLE001 - whatever the user's function raises
            raise ValueError(f"scorer {self.params['scorer']} raised {type(err).__name__} on {what}: {err}") from err

    def _checked(self, scores, shape, what):
        """``scores`` as a tensor of ``shape``, or a ValueError that says what the scorer returned instead."""
        if isinstance(scores, np.ndarray):
            if scores.dtype.kind not in "iuf":
                raise ValueError(f"scorer {self.name} returned {scores.dtype} scores for {what}: return real numbers "
                                 "(float; higher = more OOD)")
            scores = torch.from_numpy(scores.astype(scores.dtype.newbyteorder("="), copy=False))
        elif not isinstance(scores, torch.Tensor):
            raise ValueError(f"scorer {self.name} returned a {type(scores).__name__} for {what}: return a torch "
                             f"tensor or numpy array of shape {shape}")
        if scores.dtype == torch.bool or scores.is_complex():
            raise ValueError(f"scorer {self.name} returned {scores.dtype} scores for {what}: return real numbers "
                             "(float; higher = more OOD), not a mask")
        if tuple(scores.shape) != tuple(shape):
            raise ValueError(f"scorer {self.name} returned scores of shape {tuple(scores.shape)} for {what}; expected "
                             f"{tuple(shape)}, one score per pixel of the frame (resize a smaller map to the frame, "
                             "e.g. F.interpolate(..., size=(H, W), mode='bilinear'))")
        if scores.is_floating_point():
            nan = torch.isnan(scores)
            if nan.any():
                where = [k for k in range(len(nan)) if nan[k].any()] if len(shape) == 3 else []
                raise ValueError(f"scorer {self.name} returned {int(nan.sum())} NaN scores for {what}"
                                 + (f" (images {where} of the batch)" if where else "")
                                 + "; every pixel needs a score (±inf are allowed)")
        return scores.detach()

    def check(self, model):
        """A scorer scores frames itself: it runs as the model, alone."""
        if model is not self:
            raise ValueError(f"scorer {self.name} scores the frames itself: evaluate it as the model, alone "
                             "(evaluate(Scorer(fn), sets)), not as a method of a network")

    def describe(self):
        """Name and parameters; whether OOD data shaped it is not known (None)."""
        return {"name": self.name, "params": dict(self.params), "uses_ood_data": None}

    def identity(self):
        """What the model of a scorer's run is, for run.json."""
        return {"scorer": self.params["scorer"], "per_image": self.per_image}

    def eval(self):
        return self

    def to(self, device):
        return self


def load_scorer(spec: str, *, name: str | None = None, per_image: bool = False,
                score_range: tuple[float, float] | None = None) -> Scorer:
    """The :class:`Scorer` of ``spec`` = ``"module:function"`` (``function`` may be dotted, ``Class.method``),
    imported from the current folder (searched first, as ``python -m`` does) or PYTHONPATH; a ValueError that
    names what is missing."""
    module_name, sep, attribute = str(spec).partition(":")
    if not (sep and module_name and attribute):
        raise ValueError(f"--scorer {spec!r}: write MODULE:FUNCTION, e.g. my_method:anomaly_scores for the function "
                         "anomaly_scores in my_method.py (in the current folder or on PYTHONPATH)")
    module = import_user_module(f"--scorer {spec}", module_name)
    fn = module
    for part in attribute.split("."):
        if not hasattr(fn, part):
            found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                           and getattr(v, "__module__", None) == module.__name__)
            raise ValueError(f"--scorer {spec}: {module_name} ({getattr(module, '__file__', '?')}) has no "
                             f"{attribute!r}; its functions: {', '.join(found) or 'none'}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"--scorer {spec}: {attribute} is not callable ({type(fn).__name__}); name a function "
                         "images -> scores")
    return Scorer(fn, name=name, per_image=per_image, score_range=score_range)


def _qualified_name(fn):
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"
