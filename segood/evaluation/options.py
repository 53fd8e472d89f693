"""The options of a command as one object, checked once when it is made: the command line builds it from its
arguments, the Python function (:func:`segood.evaluate`, :func:`~segood.evaluation.api.evaluate_score_maps`,
:func:`~segood.evaluation.protocol.cross_source`) from its keywords, and every layer below reads it."""

import dataclasses
import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from segood.evaluation.reading import device_batches
from segood.evaluation.runner import component_spec
from segood.metrics import METRICS, grid_spec, make_accumulator
from segood.metrics.bootstrap import Bootstrap
from segood.methods.schedule import AMP_DTYPES, check_compile_backend
from segood.metrics.official import check_benchmark
from segood.metrics.thresholds import RULES

#: hyperparameter grids the cross-source protocol tunes per source (methods without one are used as they are)
GRIDS = {"odin": {"temperature": [1, 10, 100, 1000], "epsilon": [0.0]}}


class Options:
    """What the options objects share: :meth:`of`, and the checks of their plain fields."""

    @classmethod
    def of(cls, options=None, **keywords):
        """``options`` (None: the defaults) with ``keywords`` put in, checked."""
        if options is None:
            return cls(**keywords)
        if not isinstance(options, cls):
            raise TypeError(f"options must be an instance of {cls.__name__} or None, got {type(options).__name__}")
        return dataclasses.replace(options, **keywords) if keywords else options

    def _check_flags(self, *names):
        for name in names:
            if type(getattr(self, name)) is not bool:
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def _check_device(self):
        if self.device is not None:
            from segood.models.network import check_device

            check_device(self.device)

    def _check_counts(self, *names, optional=()):
        """Positive integers; those in ``optional`` may be None."""
        for name in names:
            value = getattr(self, name)
            if not (value is None and name in optional) and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be a positive integer{' or None' if name in optional else ''}, got "
                                 f"{value!r}")


@dataclass(frozen=True)
class EvaluateOptions(Options):
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
        compile: a ``torch.compile`` backend ("inductor", its default) for the network's forward pass (None: run
            as it is); the first batches of each frame size wait for the compilation.
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
        official: "smiyc", "fishyscapes" or "caos": also that benchmark's own computation (docs/official.md).
        align_corners: for an ``nn.Module`` whose logits come out smaller than the frame: how they are resized.
    """

    batch_size: int = 2
    workers: int | None = None
    device: str | None = None
    amp: str | None = None
    compile: str | None = None
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
        self._check_counts("batch_size", "save_every")
        if self.workers is not None and (type(self.workers) is not int or self.workers < 0):
            raise ValueError(f"workers must be a non-negative integer (0: read in the main process) or None, got "
                             f"{self.workers!r}")
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {sorted(k for k in AMP_DTYPES if k)} or None, got {self.amp!r}")
        if self.compile is not None:
            check_compile_backend(self.compile)
        self._check_flags("resume", "progress", "figures", "skip_bad", "verify")
        if self.align_corners is not None and type(self.align_corners) is not bool:
            raise TypeError(f"align_corners must be True, False or None, got {self.align_corners!r}")
        if self.bootstrap is not None and not isinstance(self.bootstrap, Bootstrap):
            raise TypeError(f"bootstrap must be a segood.metrics.bootstrap.Bootstrap or None, got {self.bootstrap!r}")
        grid = grid_spec(num_thresholds, score_range, mantissa_bits, kind=self.grid, max_pixels=max_pixels)
        make_accumulator(grid)  # a grid that cannot be built is refused here
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "components", component_spec(self.components, self.commit_on))
        check_benchmark(self.official)
        device_batches()  # (a misspelt SEGOOD_DEVICE_BATCHES refused now, not once the network is loaded)
        self._check_device()


@dataclass(frozen=True)
class ScoreOptions(Options):
    """Everything an evaluation of score maps (``segood score``) takes besides the maps, the set and the run folder.

    A value that cannot work is a ValueError (or TypeError) naming the option when the object is made.

    Attributes:
        name: the method's name in the tables.
        score_range: (low, high) the scores are declared to lie in (None: the score file's ``score_range``
            attribute, if any). On the linear grid it is the grid's range; on the others it is checked.
        grid: the threshold grid, a :func:`segood.metrics.grid_spec` dict, made from ``grid`` ("float", "linear",
            "exact" or a dict) and the init-only ``num_thresholds``, ``mantissa_bits``, ``max_pixels``. Default:
            the float-order grid, or the linear grid with ``num_thresholds``. A linear grid without a
            ``score_range`` holds None as its range: it takes the one the score file declares.
        clip: on the linear grid, clip out-of-range scores into the range instead of failing.
        figures: draw the figures into the run folder. verify: check every frame against its set's manifest.
        official: "smiyc", "fishyscapes" or "caos": also that benchmark's own computation of its pixel metrics
            (docs/official.md).
        components: SegmentMeIfYouCan's component metrics, as :func:`~segood.evaluation.runner.component_spec`
            normalises them; the set is the run's only one, so its thresholds are given or tuned on it ("oracle").
    """

    name: str = "external"
    score_range: tuple | None = None
    grid: str | dict | None = None
    clip: bool = False
    figures: bool = True
    verify: bool = True
    official: str | None = None
    components: dict | None = None
    num_thresholds: InitVar[int | None] = None
    mantissa_bits: InitVar[int | None] = None
    max_pixels: InitVar[int | None] = None

    def __post_init__(self, num_thresholds, mantissa_bits, max_pixels):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string (the method's name in the tables), got {self.name!r}")
        if self.score_range is not None:
            object.__setattr__(self, "score_range", score_range_of(self.score_range))
        self._check_flags("clip", "figures", "verify")
        check_benchmark(self.official)
        if self.components is not None and self.components.get("thresholds") is None \
                and self.components.get("source", "committed") == "committed":
            raise ValueError("segood score evaluates one set: give the component thresholds chosen on a tuning set "
                             "(--component-thresholds FILE.json; 'thresholds': {method: threshold}), or tune them on "
                             "this set, reported as an oracle (--component-thresholds oracle; 'source': 'oracle')")
        object.__setattr__(self, "components", component_spec(self.components))
        grid = grid_spec(num_thresholds, None, mantissa_bits, kind=self.grid, max_pixels=max_pixels)
        if grid["kind"] == "linear":  # its range: score_range, else a whole grid's own, else the score file's
            declared = self.score_range or (grid.get("score_range") if isinstance(self.grid, dict) else None)
            grid["score_range"] = None if declared is None else list(score_range_of(declared))
            make_accumulator({**grid, "score_range": grid["score_range"] or (0.0, 1.0)})
        else:
            make_accumulator(grid)
        object.__setattr__(self, "grid", grid)
        if self.clip and grid["kind"] != "linear":
            raise ValueError(f"clip has no meaning on the {grid['kind']} grid (every real score has its place): drop "
                             "clip (--clip), or use the linear grid with num_thresholds (--num-thresholds)")


def score_range_of(value):
    """(low, high) as two floats, or a ValueError: a declared score range is two finite numbers, low < high."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"score_range must be two finite numbers (low, high) with low < high, got {value!r}")
    return low, high


def _protocol_evaluation(**keywords):
    """The protocol's default :class:`EvaluateOptions`: no figures, no bootstrap (its matrix reads neither)."""
    return EvaluateOptions(**{"figures": False, "bootstrap": None, **keywords})


@dataclass(frozen=True)
class ProtocolOptions(Options):
    """Everything the cross-source protocol (``segood protocol``) takes besides the model, the sets, the methods
    and the folder.

    A value that cannot work is a ValueError (or TypeError) naming the option when the object is made.

    Attributes:
        rule: how thresholds are committed on each tuning set (:data:`segood.metrics.thresholds.RULES`).
        metric: the threshold-free metric of the matrix, and the one hyperparameters are tuned by.
        grids: {method: {param: [values]}} tuned per source (default :data:`GRIDS`).
        evaluation: the :class:`EvaluateOptions` of each tuning set's evaluation (its batch size also that of the
            tuning); by default without figures and bootstrap intervals. Its ``commit_on`` is each tuning set in
            turn, so it stays None.
    """

    rule: str = "tpr95"
    metric: str = "auroc"
    grids: dict = field(default_factory=GRIDS.copy)
    evaluation: EvaluateOptions = field(default_factory=_protocol_evaluation)

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown threshold rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if not isinstance(self.grids, dict) or not all(
                isinstance(grid, dict) and all(isinstance(v, (list, tuple)) and v for v in grid.values())
                for grid in self.grids.values()):
            raise ValueError(f"grids must be {{method: {{param: [values]}}}}, each list non-empty, got {self.grids!r}")
        if not isinstance(self.evaluation, EvaluateOptions):
            raise TypeError(f"evaluation must be an EvaluateOptions, got {type(self.evaluation).__name__}")
        if self.evaluation.commit_on is not None:
            raise ValueError(f"the protocol commits thresholds on each tuning set in turn: drop commit_on "
                             f"{self.evaluation.commit_on!r}")

    @classmethod
    def of(cls, options=None, **keywords):
        """``options`` (None: the defaults) with ``keywords`` put in, checked; keywords that are
        :class:`EvaluateOptions` fields (``batch_size=4, device="cuda"``) go into ``evaluation``."""
        own = {f.name for f in dataclasses.fields(cls)}
        passed_on = {k: v for k, v in keywords.items() if k not in own}
        keywords = {k: v for k, v in keywords.items() if k in own}
        if passed_on:
            base = keywords.get("evaluation") or (options.evaluation if isinstance(options, cls) else None)
            keywords["evaluation"] = (EvaluateOptions.of(base, **passed_on) if base else
                                      _protocol_evaluation(**passed_on))
        return super().of(options, **keywords)
