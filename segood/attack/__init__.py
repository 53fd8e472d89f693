"""Worst-case OOD (issue #21): search, per method and network, for the pasted objects a method misses.

``space`` (the search space: OOD outlines with parametric fills, colour, brightness and placement, as points
of the unit cube), ``constraints`` (the zero-inlier space: OOD objects of the label map only, and the filter
against content the network explains as well as its weakest inlier), ``generator`` (the optional learned fill:
a small autoencoder over the bank's OOD object crops, its decoder's latent joining the cube), ``search``
(Metropolis MCMC with a temperature, a budget of network passes, resumable), ``sets`` (the worst-case sets, the
transfer matrix and its report); ``segood attack`` runs them all.
"""

from segood.attack.constraints import check_content, ood_only, passes_filter, weakest_inlier
from segood.attack.search import SearchConfig, calibrate, search_frame, search_set
from segood.attack.space import DIMENSIONS, Scene, SearchSpace

__all__ = ["DIMENSIONS", "Scene", "SearchConfig", "SearchSpace", "calibrate", "check_content", "ood_only",
           "passes_filter", "search_frame", "search_set", "weakest_inlier"]
