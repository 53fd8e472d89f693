"""segood: pixel-level out-of-distribution detection benchmark for semantic segmentation."""

import os

from segood.version import __version__

# albumentations asks the package index for a newer version when it is imported, unless this is set: segood
# makes no network access (every import of albumentations in segood comes after this package's import).
os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"

__all__ = ["__version__", "evaluate"]


def __getattr__(name):  # ``segood.evaluate`` and ``segood.Scorer`` without importing torch at ``import segood``
    if name == "evaluate":
        from segood.evaluation import evaluate

        return evaluate
    if name == "Scorer":
        from segood.methods.scorer import Scorer

        return Scorer
    raise AttributeError(f"module 'segood' has no attribute {name!r}")
