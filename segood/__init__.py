"""segood: pixel-level out-of-distribution detection benchmark for semantic segmentation."""

__version__ = "0.1.0"


def __getattr__(name):  # ``segood.evaluate`` and ``segood.Scorer`` without importing torch at ``import segood``
    if name == "evaluate":
        from segood.evaluation import evaluate

        return evaluate
    if name == "Scorer":
        from segood.methods.scorer import Scorer

        return Scorer
    raise AttributeError(f"module 'segood' has no attribute {name!r}")
