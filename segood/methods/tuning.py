"""Fair hyperparameter tuning: a grid evaluated on a *tuning* set with the metric engine, with provenance.

The seed paper tunes ODIN on the 25% SUN tune split mixed with Cityscapes train frames; OD-test (Shafaei et
al.) shows why a method tuned on its test source must say so. Every tuned method carries ``params["tuning"]``
(metric, value, the tuning set's identity), and :func:`same_source_tuning` flags results whose test set shares
an OOD source with the tuning set.
"""

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from segood.data.h5 import read_manifest
from segood.methods.methods import SinglePass, get_method
from segood.metrics import HIGHER_IS_BETTER, METRIC_NAMES, PixelOODAccumulator
from segood.models.network import preprocess


def set_identity(path):
    """What a converted set is, for provenance: its OOD sources and a hash of its manifest's array hashes."""
    manifest = read_manifest(path)
    if manifest["source"] == "mix":
        components = manifest["components"]
        ood_sources = [c["source"] for c in components[:1]]  # mix() puts the OOD set first
    else:
        ood_sources = [manifest["source"]] if manifest["pixels"]["ood"] else []
    digest = hashlib.sha256(json.dumps(manifest["sha256"], sort_keys=True).encode()).hexdigest()
    return {"file": Path(path).name, "ood_sources": ood_sources, "manifest_sha256": digest}


def same_source_tuning(params, test_identity):
    """True when the method was tuned on data from an OOD source that the test set also uses."""
    tuning = params.get("tuning")
    return bool(tuning) and bool(set(tuning["set"]["ood_sources"]) & set(test_identity["ood_sources"]))


@dataclass
class TuningResult:
    best: dict  # the chosen parameters
    table: list  # one dict per grid point: its parameters and every metric
    provenance: dict  # what goes into params["tuning"]

    def method(self):
        """The tuned method, carrying its provenance."""
        return get_method(self.provenance["method"], **self.best, tuning=self.provenance)


@torch.no_grad()
def tune(method_name, model, loader, grid, *, metric="auroc", tuning_set=None, num_thresholds=400, progress=True):
    """Evaluate every point of ``grid`` ({param: [values]}) on the tuning ``loader`` and pick the best by
    ``metric`` (its better direction from :data:`HIGHER_IS_BETTER`).

    Args:
        loader: batches of dicts with ``image`` (N, 3, H, W) uint8 and ``ood_mask`` (N, H, W).
        tuning_set: path of the converted tuning set (default: ``loader.dataset.path``; required when the loader's
            dataset has none), recorded in provenance.

    Single-pass points without perturbation share one forward pass per batch.
    """
    if metric not in METRIC_NAMES:
        raise ValueError(f"metric must be one of {METRIC_NAMES}, got {metric!r}")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    if not points:
        raise ValueError("empty grid")
    methods = [get_method(method_name, **p) for p in points]
    accumulators = [PixelOODAccumulator(num_thresholds) for _ in points]
    device = next(model.parameters()).device
    for batch in tqdm(loader, desc=f"tune {method_name} ({len(points)} points)", disable=not progress):
        x = preprocess(batch["image"].to(device))
        labels = batch["ood_mask"].to(device)
        shared = None
        for method, acc in zip(methods, accumulators):
            if isinstance(method, SinglePass) and not method.params.get("epsilon"):
                method.check(model)
                shared = shared if shared is not None else model(x)
                scores = method.from_output(shared)
            else:
                scores, _ = method.score(model, x)
            acc.update(scores, labels)
    table = []
    for params, acc in zip(points, accumulators):
        result = acc.compute()
        table.append({**params, **{m: result[m] for m in METRIC_NAMES}})
    sign = 1 if HIGHER_IS_BETTER[metric] else -1
    best_row = max(table, key=lambda row: sign * row[metric])  # the first of equals, in grid order
    path = tuning_set or getattr(getattr(loader, "dataset", None), "path", None)
    if path is None:
        raise ValueError("tune() cannot tell which set it tuned on: pass tuning_set=<the converted .h5>, so that "
                         "results on the same OOD source are flagged")
    provenance = {"method": method_name, "metric": metric, "value": best_row[metric], "grid_points": len(points),
                  "set": set_identity(path)}
    return TuningResult({k: best_row[k] for k in grid}, table, provenance)
