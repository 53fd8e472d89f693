"""Fair hyperparameter tuning: a grid evaluated on a *tuning* set with the metric engine, with provenance.

The seed paper tunes ODIN on the 25% SUN tune split mixed with Cityscapes train frames; OD-test (Shafaei et
al.) shows why a method tuned on its test source must say so. Every tuned method carries ``params["tuning"]``
(metric, value, the tuning set's identity), and :func:`same_source_tuning` flags results whose test set shares
an OOD source with the tuning set.
"""

import itertools
import math
from dataclasses import dataclass

import torch
from tqdm import tqdm

from segood.data.h5 import set_identity
from segood.methods.methods import LINEAR_FORMS, check_grid, get_method
from segood.methods.schedule import frame_seeds, score_batch
from segood.metrics import METRICS, make_accumulator
from segood.models.external import as_network
from segood.models.network import device_of, evaluation_mode, preprocess


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
def tune(method_name, model, loader, grid, *, metric="auroc", tuning_set=None, metric_grid=None, progress=True):
    """Evaluate every point of ``grid`` ({param: [values]}) on the tuning ``loader`` and pick the best by
    ``metric`` (a name in :data:`segood.metrics.METRICS`, which gives its better direction).

    Args:
        loader: batches of dicts with ``image`` (N, 3, H, W) uint8 and ``ood_mask`` (N, H, W).
        tuning_set: path of the converted tuning set (default: ``loader.dataset.path``; required when the loader's
            dataset has none), recorded in provenance.
        metric_grid: the metric engine's threshold grid (:func:`segood.metrics.grid_spec`; default: float-order).

    The points are scored together (:func:`~segood.methods.schedule.score_batch`): those without perturbation
    share one forward pass per batch.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    if not points:
        raise ValueError("empty grid")
    # on the linear grid, in the [0, 1] form of its score where it has one (as evaluate makes it by name)
    form = LINEAR_FORMS.get(method_name, {}) if (metric_grid or {}).get("kind") == "linear" else {}
    methods = [get_method(method_name, **{**form, **p}) for p in points]
    for method in methods:
        check_grid(method, metric_grid or {"kind": "float"})
    accumulators = [make_accumulator(metric_grid) for _ in points]
    with evaluation_mode(as_network(model)) as model:  # (any nn.Module returning logits, as evaluate takes it)
        device = device_of(model)
        done = 0
        for batch in tqdm(loader, desc=f"tune {method_name} ({len(points)} points)", disable=not progress):
            x = preprocess(batch["image"].to(device))
            labels = batch["ood_mask"].to(device)
            frames = batch.get("frame_id", range(done, done + len(x)))  # (a loader of frames without ids: their order)
            done += len(x)
            for scores, acc in zip(score_batch(model, x, methods, mc_seeds=frame_seeds(0, "tune", frames)).scores,
                                   accumulators):
                acc.update(scores, labels)
    table = []
    for params, acc in zip(points, accumulators):
        result = acc.compute()
        table.append({**params, **{m: result[m] for m in METRICS}})
    sign = 1 if METRICS[metric].higher_is_better else -1
    defined = [row for row in table if math.isfinite(row[metric])]
    if not defined:
        raise ValueError(f"{metric} is undefined at every point on the tuning data ({result['n_id']} ID and "
                         f"{result['n_ood']} OOD pixels): tune on a set with both")
    best_row = max(defined, key=lambda row: sign * row[metric])  # the first of equals, in grid order
    path = tuning_set or getattr(getattr(loader, "dataset", None), "path", None)
    if path is None:
        raise ValueError("tune() cannot tell which set it tuned on: pass tuning_set=<the converted .h5>, so that "
                         "results on the same OOD source are flagged")
    provenance = {"method": method_name, "metric": metric, "value": best_row[metric], "grid_points": len(points),
                  "set": set_identity(path)}
    return TuningResult({**form, **{k: best_row[k] for k in grid}}, table, provenance)
