"""The options of ``segood attack`` as one object, checked once when it is made: the command line builds it from
its arguments, :func:`~segood.attack.run.attack` from its keywords."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from segood.attack.search import SearchConfig
from segood.attack.space import check_blend, check_height_ratio
from segood.data.paste import HEIGHT_RATIO
from segood.evaluation.options import Options


@dataclass(frozen=True)
class AttackOptions(Options):
    """Everything an attack takes besides the targets, the clean frames and the attack's folder.

    A value that cannot work is a ValueError (or TypeError) naming the option when the object is made, before
    anything is read or run. ``AttackOptions(config=SearchConfig(budget=50), max_frames=10)``.

    Attributes:
        objects: the outlines and pixels to paste: ``"demo"`` or a SUN2012 root; ``label_map`` says which are OOD.
        blend: the paste generator's blending (``none``, ``feather``, ``seamless``).
        height_ratio: (low, high) of the pasted height over the base's distance below the horizon.
        config: the :class:`~segood.attack.search.SearchConfig` (budget of network passes per frame, temperature,
            step, seed).
        standard: a converted standard OOD set evaluated beside (e.g. the demo's pasted-object set).
        fit_set: a converted training set to fit the methods that need it (sml, mahalanobis).
        max_frames: the first frames only (None: every frame).
        resume: continue a killed run in the attack's folder from its per-frame states.
        progress: progress bars. figures: draw each method's worst case. device: "cpu", "cuda" (None: cpu).
        generator: a generator file (:func:`~segood.attack.run.train_generator`): adds the ``learned`` fill and
            its latent dimensions to the search space (None: the 13-dimensional space).
    """

    objects: str | Path = "demo"
    label_map: str | Path = "sun"
    blend: str = "feather"
    height_ratio: tuple = HEIGHT_RATIO
    config: SearchConfig = field(default_factory=SearchConfig)
    standard: str | Path | None = None
    fit_set: str | Path | None = None
    max_frames: int | None = None
    resume: bool = False
    progress: bool = True
    figures: bool = True
    device: str | None = None
    generator: str | Path | None = None

    def __post_init__(self):
        check_blend(self.blend)
        object.__setattr__(self, "height_ratio", check_height_ratio(self.height_ratio))
        if not isinstance(self.config, SearchConfig):
            raise TypeError(f"config must be a segood.attack.search.SearchConfig, got {type(self.config).__name__}")
        self._check_counts("max_frames", optional=("max_frames",))
        self._check_flags("resume", "progress", "figures")
        self._check_device()
        for name in ("objects", "label_map", "standard", "fit_set", "generator"):
            value = getattr(self, name)
            if not isinstance(value, (str, os.PathLike)) and (value is not None or name in ("objects", "label_map")):
                raise TypeError(f"{name} must be a path or a name, got {value!r}")
