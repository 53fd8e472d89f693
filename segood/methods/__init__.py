"""Pixel-level OOD methods: pure formulas in :mod:`segood.methods.functional`, scorers on a network in
:mod:`segood.methods.methods` and the mask-level ones in :mod:`segood.methods.mask` (each registered with
``@register_method``), their scheduling in :mod:`segood.methods.schedule`, callables that return scores
themselves in :mod:`segood.methods.scorer`, fair tuning in :mod:`segood.methods.tuning`."""

from segood.methods.functional import entropy, max_softmax, mutual_info, odin, odin_spread, varsum
from segood.methods.methods import (METHODS, ODIN_EPSILONS, ODIN_TEMPERATURES, ClassFeatureStats, Confidence, Energy,
                                    Entropy, Mahalanobis, MaxLogit, MaxSoftmax, Method, MonteCarlo, MutualInfo, Needs,
                                    Odin, StandardizedMaxLogit, VarSum, get_method, list_methods, method_for_grid,
                                    register_method)
from segood.methods.mask import MASK_HEADS, EnsembleOverMasks, MaskMaxSoftmax, RbA
from segood.methods.schedule import perturb, score_batch
from segood.methods.scorer import Scorer, load_scorer

__all__ = ["MASK_HEADS", "METHODS", "ClassFeatureStats", "ODIN_EPSILONS", "ODIN_TEMPERATURES", "Confidence", "Energy",
           "EnsembleOverMasks", "Entropy", "Mahalanobis", "MaskMaxSoftmax", "MaxLogit", "MaxSoftmax", "Method",
           "MonteCarlo", "MutualInfo", "Needs", "Odin", "RbA", "Scorer", "StandardizedMaxLogit", "VarSum", "entropy",
           "get_method", "list_methods", "load_scorer", "max_softmax", "method_for_grid", "mutual_info", "odin",
           "odin_spread", "perturb", "register_method", "score_batch", "varsum"]
