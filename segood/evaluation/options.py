"""The options of an evaluation as one object, checked once: the command line builds it from its arguments,
:func:`segood.evaluate` from its keywords, and every layer below reads it."""

import dataclasses
from dataclasses import InitVar, dataclass
from pathlib import Path

from segood.evaluation.runner import component_spec
from segood.metrics import grid_spec, make_accumulator
from segood.metrics.bootstrap import Bootstrap
from segood.methods.schedule import AMP_DTYPES
from segood.metrics.official import check_benchmark


@dataclass(frozen=True)
class EvaluateOptions:
    """Everything an evaluation takes besides the model, the sets, the methods and the run folder.

    A value that cannot work is a ValueError (or TypeError) naming the option when the object is made, before
    anything runs. ``EvaluateOptions(batch_size=4, grid="exact")``; ``dataclasses.replace(options, ...)`` checks
    the new values alike.

    Attributes:
        batch_size: frames per forward pass (frames of different sizes are scored apart).
        workers: processes that read and decode frames ahead of the network (None: one per spare core, at most
            16, none for a pass of under 8 M pixels; 0: read in the main process).
        device: "cpu", "cuda", "cuda:1" (None: the model's).
        amp: "fp16" or "bf16": the network's forward passes under autocast in that precision, its logits (and
            features) widened to float32 before any method scores them (None: float32 throughout).
        grid: the threshold grid, a :func:`segood.metrics.grid_spec` dict; made from ``grid`` ("float", "linear",
            "exact" or a dict) and the init-only ``num_thresholds``, ``score_range``, ``mantissa_bits``,
            ``max_pixels`` (docs/grids.md). Default: the float-order grid at 10 mantissa bits.
        resume: continue a run saved in the run folder. save_every: batches between saved states.
        progress: progress bars. figures: draw the figures into the run folder.
        skip_bad: pass over unreadable or corrupt frames (listed in the results) instead of stopping.
        fit_set: a converted training set to fit the methods that need it (Mahalanobis, SML) on.
        checkpoint: the file the model came from, recorded with its sha256.
        feature_layer: for an ``nn.Module``: the layer whose output Mahalanobis models.
        verify: check every frame against its set's manifest as it is read.
        components: SegmentMeIfYouCan's component metrics, as :func:`~segood.evaluation.runner.component_spec`
            normalises them (with ``commit_on``).
        bootstrap: the report's image-level bootstrap (None: no intervals).
        commit_on: a set of the run to commit thresholds on (and the component thresholds, when the run chooses).
        official: "smiyc" or "fishyscapes": also that benchmark's own computation (docs/official.md).
        align_corners: for an ``nn.Module`` whose logits come out smaller than the frame: how they are resized.
    """

    batch_size: int = 2
    workers: int | None = None
    device: str | None = None
    amp: str | None = None
    grid: str | dict | None = None
    resume: bool = False
    save_every: int = 20
    progress: bool = True
    figures: bool = True
    skip_bad: bool = False
    fit_set: str | Path | None = None
    checkpoint: str | Path | None = None
    feature_layer: str | None = None
    verify: bool = True
    components: dict | None = None
    bootstrap: Bootstrap | None = Bootstrap()
    commit_on: str | None = None
    official: str | None = None
    align_corners: bool | None = None
    num_thresholds: InitVar[int | None] = None
    score_range: InitVar[tuple | None] = None
    mantissa_bits: InitVar[int | None] = None
    max_pixels: InitVar[int | None] = None

    def __post_init__(self, num_thresholds, score_range, mantissa_bits, max_pixels):
        for name in ("batch_size", "save_every"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.workers is not None and (type(self.workers) is not int or self.workers < 0):
            raise ValueError(f"workers must be a non-negative integer (0: read in the main process) or None, got "
                             f"{self.workers!r}")
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {sorted(k for k in AMP_DTYPES if k)} or None, got {self.amp!r}")
        for name in ("resume", "progress", "figures", "skip_bad", "verify"):
            if type(getattr(self, name)) is not bool:
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.align_corners is not None and type(self.align_corners) is not bool:
            raise TypeError(f"align_corners must be True, False or None, got {self.align_corners!r}")
        if self.bootstrap is not None and not isinstance(self.bootstrap, Bootstrap):
            raise TypeError(f"bootstrap must be a segood.metrics.bootstrap.Bootstrap or None, got {self.bootstrap!r}")
        grid = grid_spec(num_thresholds, score_range, mantissa_bits, kind=self.grid, max_pixels=max_pixels)
        make_accumulator(grid)  # a grid that cannot be built is refused here
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "components", component_spec(self.components, self.commit_on))
        check_benchmark(self.official)

    @classmethod
    def of(cls, options=None, **keywords):
        """``options`` (None: the defaults) with ``keywords`` put in, checked."""
        if options is None:
            return cls(**keywords)
        if not isinstance(options, cls):
            raise TypeError(f"options must be an {cls.__name__}, got {type(options).__name__}")
        return dataclasses.replace(options, **keywords) if keywords else options
