"""Pixel-level OOD scores. The pure formulas live in :mod:`segood.methods.functional`."""

from segood.methods.functional import entropy, max_softmax

__all__ = ["entropy", "max_softmax"]
