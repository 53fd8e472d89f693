"""Pixel-level OOD methods: pure formulas in :mod:`segood.methods.functional`, scorers on a network in
:mod:`segood.methods.methods`, callables that return scores themselves in :mod:`segood.methods.scorer`, fair
tuning in :mod:`segood.methods.tuning`."""

from segood.methods.functional import entropy, max_softmax, mutual_info, odin, varsum
from segood.methods.methods import (METHODS, ClassFeatureStats, ODIN_EPSILONS, ODIN_TEMPERATURES, Confidence, Energy, Entropy,
                                    Mahalanobis, MaxLogit, MaxSoftmax, Method, MutualInfo, Odin, StandardizedMaxLogit,
                                    VarSum, get_method, perturb)
from segood.methods.scorer import Scorer, load_scorer

__all__ = ["METHODS", "ClassFeatureStats", "ODIN_EPSILONS", "ODIN_TEMPERATURES", "Confidence", "Energy", "Entropy",
           "Mahalanobis", "MaxLogit", "MaxSoftmax", "StandardizedMaxLogit",
           "Method", "MutualInfo", "Odin", "Scorer", "VarSum", "entropy", "get_method", "load_scorer", "max_softmax",
           "mutual_info", "odin", "perturb", "varsum"]
