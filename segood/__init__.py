"""segood: pixel-level out-of-distribution detection benchmark for semantic segmentation."""

from segood.version import __version__

__all__ = ["__version__", "evaluate"]


def __getattr__(name):  # ``segood.evaluate`` and ``segood.Scorer`` without importing torch at ``import segood``
    if name == "evaluate":
        from segood.evaluation import evaluate

        return evaluate
    if name == "Scorer":
        from segood.methods.scorer import Scorer

        return Scorer
    raise AttributeError(f"module 'segood' has no attribute {name!r}")
