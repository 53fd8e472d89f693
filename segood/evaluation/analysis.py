"""What a run's numbers mean: bootstrap intervals and tied ranks, committed thresholds, and runtime apart.

Each works from the saved evaluation state and its accumulators' results (:func:`computed`, once per report),
so ``segood report`` can redo it with other settings.
"""

import warnings

import numpy as np

from segood.metrics import METRICS, UndefinedMetricWarning
from segood.metrics.bootstrap import COARSE_BITS, Bootstrap, compare, tied_ranks
from segood.metrics.thresholds import RULES, at_threshold, commit


def computed(ev):
    """{(method, set): the accumulator's ``compute()``, or None where it saw no image}."""
    with warnings.catch_warnings():  # undefined metrics are NaN, reported as null
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        return {key: acc.compute() if acc.n_images else None for key, acc in ev.acc.items()}


def significance(ev, results, settings=Bootstrap()):
    """({(method, set): {"intervals", "per_image_intervals", "coarsening", and "undefined_resamples" where some
    resamples left a metric undefined}}, {set: {"ranks", "p_better"}}, the settings as reported); sets without
    per-image counts (runs before them) are left out."""
    cells, comparisons = {}, {}
    for s in ev.set_names:
        images = {m: ev.acc[(m, s)].images for m in ev.method_names}
        if any(len(i) == 0 or len(i) != ev.acc[(m, s)].n_images for m, i in images.items()):
            continue
        pooled = {m: _pooled(results[(m, s)]) for m in ev.method_names}
        found = compare(images, settings, points=pooled)
        for m in ev.method_names:
            cells[(m, s)] = {key: found[key][m] for key in ("intervals", "per_image_intervals", "coarsening")}
            if found["undefined_resamples"][m]:  # (the intervals are over the other resamples)
                cells[(m, s)]["undefined_resamples"] = found["undefined_resamples"][m]
        comparisons[s] = {
            "ranks": {k: tied_ranks({m: pooled[m][k] for m in pooled}, found["significant"][k],
                                    METRICS[k].higher_is_better) for k in METRICS},
            "p_better": found["p_better"]}
    described = {"resamples": settings.resamples, "seed": settings.seed, "confidence": settings.confidence,
                 "resampled": "images, with replacement", "coarse_mantissa_bits": COARSE_BITS}
    return cells, comparisons, described


def committed(ev, results, commit_on=None, rules=tuple(RULES)):
    """{(method, set): {"committed": {rule: {...}} or absent, "oracle": {rule: {...}}}}: thresholds chosen by each
    rule on the set ``commit_on`` (one of the run's sets) and applied to every set, and, named as such, the
    oracle thresholds each set would choose for itself."""
    if commit_on is not None and commit_on not in ev.set_names:
        raise ValueError(f"--commit-on {commit_on!r} is not a set of the run; choose one of {ev.set_names}")
    r = results[(ev.method_names[0], commit_on)] if commit_on else None  # (every method counts the same pixels)
    if r is not None and r["n_id"] + r["n_ood"] and not (r["n_id"] and r["n_ood"]):
        raise ValueError(f"--commit-on {commit_on!r}: a threshold needs ID and OOD pixels on the tuning set, and it "
                         f"has {r['n_id']} ID and {r['n_ood']} OOD; choose a set of both (a mix)")
    out = {}
    for m in ev.method_names:
        chosen = {rule: _commit(results[(m, commit_on)], rule) for rule in rules} if commit_on else {}
        for s in ev.set_names:
            result = results[(m, s)]
            cell = {"oracle": {rule: _applied(result, _commit(result, rule), "oracle (this set)") for rule in rules}}
            if commit_on:
                cell["committed"] = {rule: _applied(result, chosen[rule], commit_on) for rule in rules}
            out[(m, s)] = cell
    return out


def forward_seconds(ev, method):
    """The network time of ``method``'s run: the run's forward passes (a combined run keeps each method's own)."""
    return ev.seconds.get(f"forward/{method}", ev.seconds.get("forward", 0.0))


def runtime(ev):
    """{method: inference and scoring time apart, per image and per megapixel} (inference = the shared
    forward pass; scoring = what the method adds, its Monte-Carlo samples included)."""
    images = sum(ev.images.values())
    pixels = sum(int(a.curve_counts()[1].sum()) + int(a.n_ignored) for (m, _), a in ev.acc.items()
                 if m == ev.method_names[0])
    if not images or not pixels:
        return {}
    out = {}
    for m in ev.method_names:
        forward = forward_seconds(ev, m)
        scoring = ev.seconds.get(f"score/{m}", 0.0)
        out[m] = {"inference_ms_per_image": 1e3 * forward / images, "scoring_ms_per_image": 1e3 * scoring / images,
                  "inference_ms_per_megapixel": 1e9 * forward / pixels, "scoring_ms_per_megapixel": 1e9 * scoring / pixels}
    return out


def _pooled(result):
    if result is None:
        return {k: None for k in METRICS}
    return {k: None if np.isnan(result[k]) else float(result[k]) for k in METRICS}


def _commit(result, rule):
    if result is None or not (result["n_ood"] and result["n_id"]):
        return None
    return commit(result, rule)


def _applied(result, threshold, chosen_on):
    if threshold is None or result is None or not (result["n_ood"] and result["n_id"]):
        return {"threshold": threshold, "chosen_on": chosen_on, **{k: None for k in ("tpr", "fpr", "precision",
                                                                                   "balanced_accuracy", "f1", "iou")}}
    values = at_threshold(result, threshold)
    return {"threshold": threshold, "chosen_on": chosen_on,
            **{k: None if np.isnan(v) else v for k, v in values.items()}}
