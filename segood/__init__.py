"""segood: pixel-level out-of-distribution detection benchmark for semantic segmentation."""

import os
from typing import TYPE_CHECKING

from segood.version import __version__

if TYPE_CHECKING:  # (imported on first use below: ``import segood`` stays light)
    from segood.evaluation import evaluate
    from segood.methods.scorer import Scorer

# albumentations asks the package index for a newer version when it is imported, unless this is set: segood
# makes no network access (every import of albumentations in segood comes after this package's import).
os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"

__all__ = ["Scorer", "__version__", "evaluate", "keep_freed_memory"]


#: the subpackages, reached as ``segood.models`` and so on after ``import segood`` alone
SUBPACKAGES = ("attack", "data", "evaluation", "leaderboard", "methods", "metrics", "models", "robustness")


def __getattr__(name: str):  # ``segood.evaluate`` and the others without importing torch at ``import segood``
    if name in SUBPACKAGES:
        import importlib

        return importlib.import_module(f"segood.{name}")
    if name == "evaluate":
        from segood.evaluation import evaluate

        return evaluate
    if name == "Scorer":
        from segood.methods.scorer import Scorer

        return Scorer
    if name == "keep_freed_memory":
        from segood._memory import keep_freed_memory

        return keep_freed_memory
    raise AttributeError(f"module 'segood' has no attribute {name!r}")
