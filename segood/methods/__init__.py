"""Pixel-level OOD methods: pure formulas in :mod:`segood.methods.functional`, scorers on a network in
:mod:`segood.methods.methods`, fair tuning in :mod:`segood.methods.tuning`."""

from segood.methods.functional import entropy, max_softmax, mutual_info, odin, odin_spread, varsum
from segood.methods.methods import (METHODS, ClassFeatureStats, ODIN_EPSILONS, ODIN_TEMPERATURES, Confidence, Energy, Entropy,
                                    Mahalanobis, MaxLogit, MaxSoftmax, Method, MutualInfo, Odin, StandardizedMaxLogit,
                                    VarSum, get_method, method_for_grid, perturb)

__all__ = ["METHODS", "ClassFeatureStats", "ODIN_EPSILONS", "ODIN_TEMPERATURES", "Confidence", "Energy", "Entropy",
           "Mahalanobis", "MaxLogit", "MaxSoftmax", "StandardizedMaxLogit",
           "Method", "MutualInfo", "Odin", "VarSum", "entropy", "get_method", "max_softmax", "method_for_grid",
           "mutual_info", "odin", "odin_spread", "perturb", "varsum"]
