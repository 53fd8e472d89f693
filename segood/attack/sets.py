"""The attack's results as converted sets, and the transfer matrix: every method evaluated on every method's
worst case with the existing :func:`segood.evaluation.evaluate` (the float-order grid by default).

A worst-case set holds each clean frame with its chain's lowest-energy object pasted (OOD pixels 1, semantic
255 there, the frame's own labels elsewhere), written with :class:`~segood.data.h5.SetWriter` (atomic, manifest
embedded). Its manifest records the attack (target method and network, seed, budget, temperature, step, the
search space's definition, the weakest inlier and the energy's unit) and, per frame, the found parameters,
scores and confidences, passes and acceptances. A random set holds each chain's start instead: a sample of the
same space drawn without search (the same for every method of a network), the baseline that tells the search's
effect from the space's.
"""

import warnings
from pathlib import Path

import numpy as np

from segood.attack.constraints import check_content
from segood.data.common import Sample
from segood.data.h5 import SetWriter

METRICS = ("auroc", "fpr95")


def write_set(path, space, scenes, records, label_map, *, state="best", attrs=None, extra=None, overwrite=False):
    """Write the found samples (``state`` "best") or the chains' starts (``state`` "start") of ``records``
    (:func:`segood.attack.search.search_set`) on ``scenes`` to the set ``path``; frames without a feasible start
    are listed as skipped. Every object is checked against the label map (:func:`check_content`) as it is
    written. Returns the manifest."""
    if state not in ("best", "start"):
        raise ValueError(f"state must be 'best' or 'start', got {state!r}")
    height, width = scenes[0].image.shape[:2]
    writer = SetWriter(path, (height, width), {"source": "attack", "split": "eval", **(attrs or {})},
                       overwrite=overwrite)
    found, skipped = [], []
    try:
        for scene, record in zip(scenes, records, strict=True):
            if not record["found"]:
                skipped.append((scene.frame_id, record["reason"]))
                continue
            point = record if state == "best" else record["start"]
            candidate = space.render(scene, np.asarray(point["u"], np.float64))
            check_content(candidate.params["name"], label_map)
            writer.append(Sample(candidate.image, candidate.ood_mask, candidate.semantic, scene.frame_id))
            found.append({"frame_id": scene.frame_id, **candidate.params, "score": point["score"],
                          "confidence": point["confidence"], "start_score": record["start"]["score"],
                          "passes": record["passes"], "accepted": record.get("accepted", 0)})
        if not found:
            raise ValueError(f"{path}: no frame found a feasible sample ({skipped[0][1]}); raise the budget or "
                             "check that the frames have road or sidewalk")
        return writer.commit(skipped, {"attack": {**(extra or {}), "state": state}, "found": found})
    except BaseException:
        writer.abort()
        raise


def transfer_matrix(networks, sets, out_dir, *, progress=True, batch_size=4):
    """Evaluate each network's methods on every set: ``networks`` {name: (model, methods, checkpoint)}, ``sets``
    {set name: path}. Each network's run lands in ``out_dir/<name>`` (results.json, results.md). Returns
    {method: {set: {"auroc": .., "fpr95": ..}}} (pooled over pixels)."""
    from segood.evaluation import evaluate
    from segood.evaluation.report import COARSE_WARNING

    matrix = {}
    for name, (model, methods, checkpoint) in networks.items():
        with warnings.catch_warnings():  # (each run's results.md marks ≈ what its grid cannot pin down)
            warnings.filterwarnings("ignore", message=COARSE_WARNING)
            doc = evaluate(model, sets, methods, Path(out_dir) / name, batch_size=batch_size, progress=progress,
                           figures=False, checkpoint=checkpoint, bootstrap=None)
        for method, by_set in doc["results"].items():
            matrix[method] = {s: {k: r["pooled"][k] for k in METRICS} for s, r in by_set.items()}
    return matrix
