"""``segood robustness``: every method and the network itself on test frames corrupted on the fly.

Each set is evaluated clean and under every (corruption, severity) as a set of its own, "SET@CORRUPTION-LEVEL"
(:class:`~segood.robustness.CorruptedSet`), through evaluate's runner: one forward pass per frame feeds every
method, the network's mIoU and calibration (:class:`~segood.metrics.calibration.CalibrationAccumulator`) are
accumulated beside the OOD counts, the state is saved every few batches (``resume``) and sharded under torchrun.
The report answers the robustness seed's two questions per corruption and severity:

(a) corrupted ID stays ID: do the methods still separate the set's OOD pixels from its ID pixels, and what
    happens to mIoU and calibration? (the OOD metrics of the corrupted set itself);
(b) corruption as OOD: are corrupted frames flagged? The ID pixels of the clean frames are the negatives and the
    ID pixels of the corrupted frames the positives (the seed's "transformed in-distribution as OOD"); built
    from the two sets' counts (:func:`corruption_as_ood`), with no forward pass of its own.
"""

import json
import warnings

import numpy as np

from segood.data.h5 import H5SegmentationDataset
from segood.evaluation.api import claimed_run, execute, prepare
from segood.evaluation.options import EvaluateOptions
from segood.evaluation.report import unfinished_sets
from segood.evaluation.layout import RunFolder
from segood.evaluation.runner import EXAMPLE_WIDTH, Evaluation
from segood.io import write_json
from segood.metrics import METRICS, UndefinedMetricWarning, accumulator_from_state
from segood.metrics.segmentation import mean_iou
from segood.models.network import keeps_modes
from segood.robustness.corruptions import (SEVERITIES, check_corruption, condition_name, family_of, levels_table,
                                          resolve_corruptions)
from segood.robustness.report import check_reference, load_reference, results_markdown, summary, write_figures

SCHEMA = "segood.robustness/1"


@keeps_modes
def robustness(model, sets, methods=None, out_dir="runs/robustness", *, corruptions=None, severities=SEVERITIES,
               seed=0, requirements=None, family=None, standard_size="fixed", reference=None,
               options: EvaluateOptions | None = None, **keywords):
    """Evaluate ``methods`` of ``model`` on ``sets`` clean and under ``corruptions`` (default: all of the severity
    table) at ``severities``; writes ``out_dir`` (results.json, results.md, figures/) and returns the results
    document. ``options`` and ``keywords`` as :func:`segood.evaluate` (batch size, device, grid, workers, ...; the
    components, official mode and bootstrap do not apply); the corruptions are applied where the frames are
    read, in the reader processes (``workers``). ``seed`` seeds the corruptions (per frame, corruption and
    severity); ``requirements``: type-approval requirements (a YAML path, or parsed ones) checked at the end.
    ``family``: the corruptions by default, "segood" (segood's own; without a family too), "standard" (the 15 of
    ImageNet-C / Cityscapes-C, ``c:NAME``) or "all"; named ``corruptions`` must be of it; ``standard_size``:
    "fixed" (the standard's pixel sizes) or "height" (scaled to the frames' rows); ``reference``: a robustness
    run (folder or results.json) whose numbers the summary's corruption errors (mCE) are relative to."""
    from segood.robustness.approval import covered, load_requirements
    from segood.robustness.standard import standard_scale

    corruptions = resolve_corruptions(corruptions, family)
    standard_scale(1, standard_size)  # (checks it)
    reference_doc = None if reference is None else load_reference(reference, out_dir)  # (fails before the run)
    severities = sorted(set(severities))
    for level in severities:
        check_corruption(corruptions[0], level)
    if requirements is not None and not isinstance(requirements, list):
        requirements = load_requirements(requirements)  # a bad file fails before the run, not after it
    options = EvaluateOptions.of(options, **keywords)
    model, sets, methods, description = prepare(model, sets, methods, options)
    description["config"]["robustness"] = {"corruptions": corruptions, "severities": severities, "seed": int(seed),
                                           "levels": {c: levels_table()[c] for c in corruptions}}
    if any(family_of(c) == "standard" for c in corruptions):
        description["config"]["robustness"]["standard_size"] = standard_size
    if reference_doc is not None:
        check_reference(reference_doc, description, reference)
    for req in requirements or ():  # (a requirement on what the run lacks fails now, not after it)
        covered(req, list(sets), corruptions, severities, [m.name for m in methods])
    conditions = {}
    for set_name, path in sets.items():
        clean = H5SegmentationDataset(path, verify=options.verify)
        conditions[set_name] = clean
        for corruption in corruptions:
            for level in severities:
                conditions[condition_name(set_name, corruption, level)] = _corrupted(clean, corruption, level, seed,
                                                                                     standard_size)
    with claimed_run(out_dir):  # (held until its report is written)
        ev = execute(model, conditions, methods, out_dir, description, options, quality=True,
                     examples=(1, EXAMPLE_WIDTH))  # (one frame per set and condition)
        return None if ev is None else write_robustness_report(out_dir, figures=options.figures,
                                                               requirements=requirements, reference=reference,
                                                               previous=False)


def _corrupted(dataset, corruption, severity, seed, standard_size):
    from segood.robustness.corruptions import CorruptedSet

    return CorruptedSet(dataset, corruption, severity, seed=seed, standard_size=standard_size)


def is_robustness_run(out_dir):
    """Whether ``out_dir`` holds a run of ``segood robustness`` (its run.json names the corruptions)."""
    return "robustness" in RunFolder(out_dir).read_run().get("config", {})


def corruption_as_ood(clean, corrupted):
    """Question (b) as an accumulator: the clean set's ID pixels are ID, the corrupted set's ID pixels are OOD
    (both sets' OOD pixels are left out), on the grid both accumulators share. Pooled counts only."""
    return _relabel(clean, 0, None).merge(_relabel(corrupted, None, 0))


def _relabel(acc, id_row, ood_row):
    """A copy of ``acc`` whose ID counts are its row ``id_row`` and OOD counts its row ``ood_row`` (None: none),
    without per-image bookkeeping."""
    state = acc.state_dict()
    if "id_scores" in state:  # the exact grid: the scores themselves, ID and OOD
        rows = (state["id_scores"], state["ood_scores"])
        state["id_scores"], state["ood_scores"] = (rows[0][:0] if r is None else rows[r] for r in (id_row, ood_row))
    else:
        key, axis = ("hist", 0) if "hist" in state else ("counts", 1)  # linear: (2, T); float-order: (B, 2, 2^m)
        counts = state[key]
        empty = np.zeros_like(np.take(counts, 0, axis))
        state[key] = np.stack([empty if r is None else np.take(counts, r, axis) for r in (id_row, ood_row)], axis=axis)
    state.update(n_ignored=np.array(0, np.int64), n_images=np.array(0, np.int64),
                 per_image_sum=np.zeros_like(state["per_image_sum"]), per_image_defined=np.array(0, np.int64))
    for name in ("image_offsets", "image_keys", "image_counts", "image_values"):  # (no per-image counts either)
        state.pop(name, None)
    return accumulator_from_state(state)


def pooled_metrics(acc):
    """{metric: value or None (undefined)} of an accumulator's pooled counts, with n_id and n_ood."""
    n_id, n_ood = (int(v) for v in acc.curve_counts()[1].sum(axis=1))
    if not n_id + n_ood:
        return {**dict.fromkeys(METRICS), "n_id": 0, "n_ood": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        result = acc.compute()
    return {**{k: _number(result[k]) for k in METRICS}, "n_id": n_id, "n_ood": n_ood}


def segmentation_quality(ev, set_name):
    """{"miou", "accuracy", "ece", "brier", "n_pixels"} of the network on one set of a quality evaluation."""
    confusion = ev.confusion[set_name]
    miou, _ = mean_iou(confusion)
    calibration = ev.calibration[set_name].compute()
    total = int(confusion.sum())
    return {"miou": _number(miou), "accuracy": float(np.trace(confusion) / total) if total else None,
            "ece": _number(calibration["ece"]), "brier": _number(calibration["brier"]), "n_pixels": total}


def robustness_results(run, ev):
    """The results document of a robustness run from its description and (all-reduced) state."""
    spec = run["config"]["robustness"]
    clean, corrupted = {}, {}
    for s in run["sets"]:
        clean[s] = {"ood": {m: pooled_metrics(ev.acc[(m, s)]) for m in ev.method_names},
                    "segmentation": segmentation_quality(ev, s)}
        corrupted[s] = {}
        for c in spec["corruptions"]:
            corrupted[s][c] = {}
            for level in spec["severities"]:
                k = condition_name(s, c, level)
                corrupted[s][c][str(level)] = {
                    "ood": {m: pooled_metrics(ev.acc[(m, k)]) for m in ev.method_names},
                    "as_ood": {m: pooled_metrics(corruption_as_ood(ev.acc[(m, s)], ev.acc[(m, k)]))
                               for m in ev.method_names},
                    "segmentation": segmentation_quality(ev, k)}
    images = sum(ev.images.values())
    timings = {"images": images,
               "ms_per_image": {k: 1e3 * v / images for k, v in ev.seconds.items()} if images else {}}
    unfinished = unfinished_sets(run, ev)
    return {"schema": SCHEMA, **run, "robustness": spec, "clean": clean, "corrupted": corrupted, "timings": timings,
            "skipped_frames": ev.skipped, **({"unfinished": unfinished} if unfinished else {})}


def write_robustness_report(out_dir, *, figures=True, requirements=None, reference=None, previous=True):
    """(Re)write results.json, results.md (and approval.md with ``requirements``) and the figures of a robustness
    run from its saved state; returns the results document. ``reference``: a robustness run (folder or
    results.json) the summary's mCE is relative to; default (with ``previous``, as a rebuilt report): the one the
    run's last report named, if any; ``requirements`` likewise default to those it was last checked against."""
    from segood.io import atomic_write_text
    from segood.robustness.approval import approval_markdown, check_requirements, load_requirements

    folder = RunFolder(out_dir)
    ev = Evaluation.load(folder.state())
    ev.warn_unregistered()
    run = folder.read_run()
    doc = robustness_results(run, ev)
    last = json.loads(folder.results_json.read_text()) if previous and folder.results_json.exists() else {}
    if reference is None:
        reference = last.get("reference_run")
    if requirements is None:  # (a rebuilt report checks the requirements the run was last checked against)
        requirements = last.get("requirements")
    reference_doc = None
    if reference is not None:
        doc["reference_run"] = str(reference)
        reference_doc = load_reference(reference, out_dir)
        check_reference(reference_doc, run, reference)
    doc["summary"] = summary(doc, reference_doc)
    if requirements is not None:
        if not isinstance(requirements, list):
            requirements = load_requirements(requirements)
        if "unfinished" in doc:
            raise ValueError(f"{folder.path} is an unfinished run ({len(doc['unfinished'])} sets or conditions not "
                             "scored to the end, e.g. " + ", ".join(list(doc["unfinished"])[:3]) + "): its numbers "
                             "are those of part of the frames; finish it with segood robustness ... --resume, then "
                             "check the requirements")
        doc["requirements"], doc["approval"] = requirements, check_requirements(doc, requirements)
        atomic_write_text(folder.path / "approval.md", approval_markdown(doc["approval"]))
    write_json(folder.results_json, doc)
    atomic_write_text(folder.results_md, results_markdown(doc))
    if figures:
        write_figures(folder.figures, doc, ev)
    return doc


def _number(value):
    return None if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)
