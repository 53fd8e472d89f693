"""Tables and figures of a run, rebuilt from its saved state (``segood report runs/NAME``)."""

import csv
import hashlib
import io
import json
import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from segood.evaluation.analysis import committed, computed, forward_seconds, runtime, significance
from segood.evaluation.layout import RunFolder, grid_of_config
from segood.evaluation.runner import Evaluation
from segood.io import atomic_output, atomic_write_text, make_folder, write_json
from segood.labels import CLASS_NAMES, colorize
from segood.methods.tuning import same_source_tuning
from segood.metrics import METRICS, describe_grid
from segood.metrics.bootstrap import COARSE_BITS, Bootstrap
from segood.metrics.float_order import MAX_MANTISSA_BITS
from segood.metrics.official import LABELS as OFFICIAL_LABELS, PER_IMAGE as OFFICIAL_PER_IMAGE

SCHEMA = "segood.results/1"
COARSE = 0.01  # a pooled value the binning may move by more than this is flagged ≈ in results.md
CURVE_POINTS = 1 << 16  # points of a drawn ROC or PR curve at most
HEAT_PERCENTILES = (1, 99)  # each method's heat maps span these percentiles of its own scores


def arrow(metric):
    return METRICS[metric].arrow()


def build_results(run, ev, *, bootstrap=Bootstrap(), commit_on=None, running=False):
    """The results.json document from the run description and the (all-reduced) evaluation state: pooled and
    per-image metrics with bootstrap intervals (``bootstrap``; None: none) and tied ranks, thresholds committed on
    the set ``commit_on`` (and the oracle ones, named so), and runtime per method; ``running``: the run is still
    going (its notes say so, not that it is unfinished)."""
    computed_results = computed(ev)
    cells, comparisons, described = significance(ev, computed_results, bootstrap) if bootstrap else ({}, {}, None)
    thresholds = committed(ev, computed_results, commit_on)
    results, per_class = {}, {}
    for m in ev.method_names:
        results[m], per_class[m] = {}, {}
        params = run["methods"][m]["params"]
        for s in ev.set_names:
            acc = ev.acc[(m, s)]
            n_id, n_ood = (int(v) for v in acc.curve_counts()[1].sum(axis=1))
            r = computed_results[(m, s)] or {k: float("nan") for k in (*METRICS, "max_iou_threshold")}
            pooled = {k: _number(r.get(k, float("nan"))) for k in (*METRICS, "max_iou_threshold")}
            bounds = {k: [_number(v) for v in r.get("bounds", {}).get(k, (float("nan"),) * 2)] for k in METRICS}
            per_image = r.get("per_image_mean")
            per_image = {k: _number(v) if isinstance(v, float) else v for k, v in per_image.items()} if per_image else None
            results[m][s] = {
                "pooled": pooled,
                "bounds": bounds,
                "per_image_mean": per_image,
                "n_id": n_id, "n_ood": n_ood, "n_ignored": int(acc.n_ignored),
                "id_to_ood_ratio": n_id / n_ood if n_ood else None,
                "same_source_tuning": same_source_tuning(params, run["sets"][s]),
                "same_source_oe": s in _outlier_exposure(run, m).get("same_source_sets", ()),
                **cells.get((m, s), {}),
                **thresholds[(m, s)],
            }
            if (m, s) in ev.comp:
                results[m][s]["components"] = {**{k: _number(v) if isinstance(v, float) else v
                                                  for k, v in ev.comp[(m, s)].compute().items()},
                                               **component_choice(ev.components)}
            if ev.official:
                results[m][s]["official"] = official_results(ev, m, s)
            counts = ev.class_count[s]
            means = np.divide(ev.class_sum[(m, s)], counts, out=np.full(len(counts), np.nan), where=counts > 0)
            per_class[m][s] = {name: (None if np.isnan(v) else float(v)) for name, v in zip(CLASS_NAMES, means)}
    images = sum(ev.images.values())
    timings = {"images": images, "images_per_set": dict(ev.images),
               "ms_per_image": {k: 1e3 * v / images for k, v in ev.seconds.items()} if images else {},
               "per_method": runtime(ev)}
    notes = run.get("notes", []) + ev.notes() + _unfinished(run, ev, running)
    if ev.skipped:
        notes.append(skipped_note(ev.skipped))
    return {"schema": SCHEMA, **run, "results": results, "per_class_mean_score": per_class, "timings": timings,
            "skipped_frames": ev.skipped, "bootstrap": described, "comparisons": comparisons,
            "commit_on": commit_on, "notes": notes}


def skipped_note(skipped):
    """A note on the frames that could not be read and were passed over (``--skip-bad``: [set, index, reason])."""
    where = ", ".join(f"{n} of {s}" for s, n in Counter(entry[0] for entry in skipped).items())
    s, index, reason = skipped[0]
    return (f"{len(skipped)} unreadable {'frame was' if len(skipped) == 1 else 'frames were'} passed over "
            f"(--skip-bad) and {'is' if len(skipped) == 1 else 'are'} in no number here: {where} (e.g. frame {index} "
            f"of {s}: {reason}); results.json lists them (skipped_frames).")


def _unfinished(run, ev, running=False):
    """Notes for the sets whose frames were not all scored (or skipped): a run stopped before its end, or one that
    is still ``running``."""
    state, then = (("still running", "it goes on") if running else ("unfinished", "finish it with --resume"))
    return [f"The run is {state}: {counted} of the {frames} frames of {s} were scored or skipped, and its "
            f"numbers are those of these frames only; {then}."
            for s, (counted, frames) in unfinished_sets(run, ev).items()]


def unfinished_sets(run, ev):
    """{set: [frames scored or skipped, frames of the set]} for the sets of a run stopped before its end (a
    robustness run's conditions, ``set@corruption-level``, have their set's frames)."""
    skipped = [entry[0] for entry in ev.skipped]
    out = {}
    for s in ev.set_names:
        frames = (run["sets"].get(s) or run["sets"].get(s.rpartition("@")[0]) or {}).get("frames")
        counted = ev.images[s] + skipped.count(s)
        if frames is not None and counted < frames:
            out[s] = [counted, frames]
    return out


def _outlier_exposure(run, method):
    """The OE record of the network that ``method`` ran on ({} for a network without outlier exposure); a
    combined run keeps one model per run folder (``method_models`` names it)."""
    model = run.get("model") or {}
    if "method_models" in run:
        model = model.get(run["method_models"].get(method), {})
    record = model.get("outlier_exposure") if isinstance(model, dict) else None
    return record if isinstance(record, dict) else {}


def official_results(ev, m, s):
    """The benchmark's own numbers for method ``m`` on set ``s`` (the run's official mode), beside segood's:
    {"benchmark", "label", "auprc", "fpr95", ... (:mod:`segood.metrics.official`), "components" in the SMIYC mode
    with component metrics}."""
    def plain(result):
        return {k: _number(v) if isinstance(v, float) else v for k, v in result.items()}

    out = {"benchmark": ev.official, "label": OFFICIAL_LABELS[ev.official], **plain(ev.official_acc[(m, s)].compute())}
    if (m, s) in ev.official_comp:
        out["components"] = {**plain(ev.official_comp[(m, s)].compute()), **component_choice(ev.components)}
    return out


def component_choice(spec):
    """Where a run's component thresholds came from: {"chosen_on": the tuning set, "tuned on the test set
    (oracle)", or None (given in a file); "rule": the rule that chose them, None when given}."""
    oracle = "tuned on the test set (oracle)"
    if "rule" not in spec:
        return {"chosen_on": oracle if spec["source"] == "oracle" else None, "rule": None}
    return {"chosen_on": spec["commit_on"] if spec["source"] == "committed" else oracle, "rule": spec["rule"]}


def write_report(out_dir: str | Path, *, figures: bool = True, bootstrap: Bootstrap | None = Bootstrap(),
                 commit_on: str | None = None, state: Evaluation | None = None) -> dict:
    """(Re)write results.json, results.csv, results.md, results.tex and the figures of ``out_dir`` from its state, with
    bootstrap intervals (``bootstrap``: resamples and seed; None: none) and thresholds committed on the set
    ``commit_on``. ``state``: the run's :class:`Evaluation` where it is at hand (else read from the folder)."""
    folder = RunFolder(out_dir)
    ev = Evaluation.load(folder.state()) if state is None else state
    ev.warn_unregistered()
    run = folder.read_run()
    running = state is None and folder.in_use()  # (a report of a run another process is still writing)
    doc = build_results(run, ev, bootstrap=bootstrap, commit_on=commit_on, running=running)
    if folder.results_json.exists():  # what a caller added to the document (the demo's OE comparison) is kept
        previous = json.loads(folder.results_json.read_text())
        doc = {**{k: v for k, v in previous.items() if k not in doc}, **doc}
    write_json(folder.results_json, doc)
    atomic_write_text(folder.results_csv, results_csv(doc))
    atomic_write_text(folder.results_md, results_markdown(doc))
    atomic_write_text(folder.results_tex, results_latex(doc))
    if figures:
        write_figures(folder.figures, doc, ev, prune=True)
    for note in _unfinished(run, ev, running):  # (a report of a run stopped, or still going, on its way)
        warnings.warn(note, stacklevel=2)
    return doc


def combine_runs(run_dirs: list[str | Path], out_dir: str | Path, *, figures: bool = True,
                 bootstrap: Bootstrap | None = Bootstrap(), commit_on: str | None = None) -> dict:
    """One report over several runs on the same sets (e.g. one network per head): their accumulators side by
    side, no recomputation. A method that several runs evaluated (max softmax of two networks) is named by its
    run's folder too: ``max_softmax (psp_plain_eval)``."""
    folders = [RunFolder(d) for d in run_dirs]
    out = RunFolder(out_dir)
    if any(out.path.resolve() == f.path.resolve() for f in folders) or (
            out.run.exists() and "combined_from" not in json.loads(out.run.read_text())):
        raise ValueError(f"{out.path} holds a run of its own, which the combined report would replace: choose "
                         "another --out")
    runs = [f.read_run() for f in folders]
    states = [Evaluation.load(f.state()) for f in folders]
    sets = states[0].set_names
    if any(ev.set_names != sets for ev in states):
        raise ValueError(f"runs on different sets cannot be combined: {[ev.set_names for ev in states]}")
    for run in runs[1:]:
        for set_name in sets:
            if run["sets"][set_name]["manifest_sha256"] != runs[0]["sets"][set_name]["manifest_sha256"]:
                raise ValueError(f"set {set_name!r} differs between the runs (another manifest): not comparable")
    repeated = Counter(m for ev in states for m in ev.method_names)
    renames = [{m: f"{m} ({Path(d).name})" if repeated[m] > 1 else m for m in ev.method_names}
               for d, ev in zip(run_dirs, states)]
    names = [rename[m] for rename, ev in zip(renames, states) for m in ev.method_names]
    if len(set(names)) != len(names):
        raise ValueError(f"method names repeat across the runs, and so do the runs' folder names: {names}")
    if any(ev.grid != states[0].grid for ev in states):
        raise ValueError(f"runs on different threshold grids cannot be combined: {[ev.grid for ev in states]}")
    specs = [ev.components for ev in states if ev.components]
    if len({ev.official for ev in states}) > 1:
        raise ValueError(f"runs with different official modes cannot be combined: {[ev.official for ev in states]}")
    if len({(c["preset"], c["source"], c.get("rule"), c.get("commit_on")) for c in specs}) > 1:
        raise ValueError("runs whose component metrics differ in preset or in how their thresholds were chosen "
                         "cannot be combined")
    unchosen = [str(d) for d, ev in zip(run_dirs, states) if ev.components and ev.components["thresholds"] is None]
    if unchosen:
        raise ValueError(f"{', '.join(unchosen)} stopped before choosing their component thresholds (after the pixel "
                         "pass): finish them with segood evaluate ... --resume first")
    counted = [(ev.images, sorted(entry[:2] for entry in ev.skipped)) for ev in states]
    if any(c != counted[0] for c in counted):
        raise ValueError("the runs counted other frames (" + "; ".join(
            f"{d}: {c[0]}, {len(c[1])} skipped" for d, c in zip(run_dirs, counted)) + "): finish an interrupted "
                         "run with segood evaluate ... --resume, or combine runs over the same frames")
    thresholds = {rename[m]: t for rename, ev in zip(renames, states) if ev.components
                  for m, t in ev.components["thresholds"].items() if m in rename}
    components = {**specs[0], "thresholds": thresholds} if specs else None
    combined = Evaluation(names, sets, states[0].grid, components, official=states[0].official)
    labels = [Path(d).name for d in run_dirs]
    labels = labels if len(set(labels)) == len(labels) else [str(d) for d in run_dirs]
    for ev, rename, label in zip(states, renames, labels):
        for part in ("acc", "comp", "official_acc", "official_comp", "class_sum"):
            getattr(combined, part).update({(rename[m], s): v for (m, s), v in getattr(ev, part).items()})
        for key, example in ev.examples.items():
            combined.examples.setdefault(key, {}).update(
                {f"score_{rename[f[6:]]}" if f.startswith("score_") else
                 f"classes ({label})" if f == "classes" else f: v for f, v in example.items()})
        for stage, seconds in ev.seconds.items():
            kind, _, m = stage.partition("/")
            stage = f"{kind}/{rename[m]}" if m in rename else stage
            combined.seconds[stage] = combined.seconds.get(stage, 0.0) + seconds
        for m in ev.method_names:  # a method's network time is its own run's, not every run's together
            combined.seconds[f"forward/{rename[m]}"] = forward_seconds(ev, m)
    _one_prediction_where_the_networks_agree(combined.examples)
    combined.class_count, combined.images, combined.skipped = states[0].class_count, states[0].images, states[0].skipped
    models, method_models = {}, {}
    for d, r, rename in zip(run_dirs, runs, renames):
        if "method_models" in r:  # a combined run: its own runs' models, each method with its own
            models.update(r["model"])
            method_models.update({rename[m]: model for m, model in r["method_models"].items()})
        else:
            models[str(d)] = r["model"]
            method_models.update({rename[m]: str(d) for m in r["methods"]})
    notes = [note for d, r, ev in zip(run_dirs, runs, states)  # (what each run said of its model's outputs)
             for note in r.get("notes", [f"{d}: {n}" for n in ev.notes()])]
    run = {"toolkit": runs[0]["toolkit"], "model": models, "method_models": method_models,
           "sets": runs[0]["sets"],
           "methods": {rename[m]: d for r, rename in zip(runs, renames) for m, d in r["methods"].items()},
           "config": runs[0]["config"], "combined_from": [str(d) for d in run_dirs], "notes": notes}
    write_json(out.run, run)
    combined.save(out.state())
    return write_report(out.path, figures=figures, bootstrap=bootstrap, commit_on=commit_on)


def _one_prediction_where_the_networks_agree(examples):
    """A combined run's example frames keep each run's predicted classes (``classes (<run>)``) where the runs'
    networks predict differently on any of them, and one ``classes`` where they all agree."""
    predicted = [[v for f, v in ex.items() if f.startswith("classes (")] for ex in examples.values()]
    if all(np.array_equal(p, c) for classes in predicted for p in classes for c in classes[:1]):
        for ex, classes in zip(examples.values(), predicted):
            for f in [f for f in ex if f.startswith("classes (")]:
                del ex[f]
            ex["classes"] = classes[0]


def _pixels(result):
    """What a set's counted pixels are, for the report's list of sets."""
    n_id, n_ood = result["n_id"], result["n_ood"]
    if not n_ood:
        return "no OOD pixels" if n_id else "no pixel counted"
    return f"ID:OOD = {n_id / n_ood:.2f}:1" if n_id else "OOD pixels only"


def results_csv(doc):
    """One row per (method, set, aggregation); each metric's bootstrap interval (``<metric>_ci_low`` /
    ``_ci_high``, empty without a bootstrap) and, for the pooled rows, where the exact value lies given the grid's
    bins (``<metric>_bin_low`` / ``_bin_high``), in named columns."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    interval_columns = [f"{m}_ci_{side}" for m in METRICS for side in ("low", "high")]
    bound_columns = [f"{m}_bin_{side}" for m in METRICS for side in ("low", "high")]
    writer.writerow(["method", "set", "aggregation", *METRICS, "max_iou_threshold", "n_images", "n_id", "n_ood",
                     "same_source_tuning", "same_source_oe", *interval_columns, *bound_columns])

    def intervals(found):
        return [v for m in METRICS for v in ((found or {}).get(m) or ("", ""))]

    for m, by_set in doc["results"].items():
        for s, r in by_set.items():
            flags = r["same_source_tuning"], r.get("same_source_oe", False)
            writer.writerow([m, s, "pooled", *(r["pooled"].get(k) for k in (*METRICS, "max_iou_threshold")),
                             "", r["n_id"], r["n_ood"], *flags, *intervals(r.get("intervals")),
                             *(v for m in METRICS for v in r["bounds"][m])])
            per_image = r["per_image_mean"] or {}
            writer.writerow([m, s, "per-image mean", *(per_image.get(k) for k in METRICS), "",
                             per_image.get("n_images"), "", "", *flags,
                             *intervals(r.get("per_image_intervals")), *[""] * len(bound_columns)])
            official = r.get("official")
            if official:  # the benchmark's own computation: only the metrics it defines
                writer.writerow([m, s, official["label"], *(official.get(k, "") for k in METRICS), "", "",
                                 official["n_id"], official["n_ood"], *flags,
                                 *[""] * (len(interval_columns) + len(bound_columns))])
    return buffer.getvalue()


def metric_tables(doc):
    """The tables of results.md and results.tex, as data: [(metric, title, column names, [(method, [Cell])])], one
    per metric pooled over all pixels, then one per metric of per-image means. A set converted with a protocol
    that averages per image (its identity's ``per_image_headline``) also shows its per-image means beside its
    pooled numbers in the pooled tables, each column named."""
    sets = list(next(iter(doc["results"].values())))
    headlines = {s: _headline(doc, s) for s in sets}
    names = {(s, a): f"{s} ({headlines[s] if a == 'per_image_mean' else 'pooled over pixels'})" if headlines[s]
             else s for s in sets for a in ("pooled", "per_image_mean")}
    tables = []
    for section in ("pooled", "per_image_mean"):
        columns = [(s, section) for s in sets]
        if section == "pooled":  # a per-image protocol's headline beside the pooled numbers
            columns = [(s, a) for s in sets for a in ("pooled", "per_image_mean") if a == "pooled" or headlines[s]]
        for metric in METRICS:
            title = "pooled over all pixels" if section == "pooled" else "per-image mean"
            if len(columns) > len(sets):
                title += ", and per-image means where a set's protocol averages per image"
            rows = [(m, [_cell(doc, m, s, metric, aggregation) for s, aggregation in columns]) for m in doc["results"]]
            tables.append((metric, title, [names[c] for c in columns], rows))
    return tables


@dataclass(frozen=True)
class Cell:
    """One value of a metric table: ``value`` (None: undefined), ``top`` (bold: the best, or not significantly
    worse), its bootstrap ``interval`` or None, ``same_source`` (†: tuned on the test set's source), ``coarse``
    (≈) and ``same_source_oe`` (‡: the network saw OE objects of the test set's source) flags."""

    value: float | None
    top: bool
    interval: tuple | None
    same_source: bool
    coarse: bool
    same_source_oe: bool = False


def _cell(doc, m, s, metric, aggregation):
    r = doc["results"][m][s]
    value = (r[aggregation] or {}).get(metric)
    column = [v for v in ((doc["results"][o][s][aggregation] or {}).get(metric) for o in doc["results"]) if v is not None]
    best = (max if METRICS[metric].higher_is_better else min)(column) if column else None
    ranks = (doc.get("comparisons") or {}).get(s, {}).get("ranks", {}).get(metric)
    top = ranks[m] == 1 if ranks and aggregation == "pooled" else value is not None and value == best
    interval = (r.get("intervals" if aggregation == "pooled" else "per_image_intervals") or {}).get(metric)
    interval = tuple(interval) if value is not None and interval and interval[0] is not None else None
    if interval and f"{interval[0]:.3f}" == f"{interval[1]:.3f}":  # no width at the precision shown: nothing to say
        interval = None
    return Cell(value, bool(top), interval, bool(r["same_source_tuning"]),
                aggregation == "pooled" and too_coarse(metric, r), bool(r.get("same_source_oe")))


def results_markdown(doc):
    """One table per metric: methods × sets, pooled, best per set in bold; per-image means below
    (:func:`metric_tables`); then the committed thresholds, runtime, component metrics and the notes."""
    sets = list(next(iter(doc["results"].values())))
    lines = [f"# Results ({doc['schema']}, segood {doc['toolkit']['segood_version']})", ""]
    for metric, title, columns, rows in metric_tables(doc):
        lines += [f"## {METRICS[metric].label} {arrow(metric)} ({title})", "",
                  "| method | " + " | ".join(map(_md, columns)) + " |", "|---|" + "---:|" * len(columns)]
        for m, cells in rows:
            lines.append(f"| {_md(m)} | " + " | ".join(_markdown_cell(c) for c in cells) + " |")
        lines.append("")
    lines += committed_markdown(doc, sets) + runtime_markdown(doc) + component_markdown(doc, sets)
    lines += official_markdown(doc, sets)
    first = doc["results"][next(iter(doc["results"]))]
    lines.append("Sets: " + ", ".join(f"{s} ({_pixels(first[s])})" for s in sets) + ".")
    lines.append(f"Thresholds: {describe_grid(grid_of_config(doc['config']))}.")
    if any(r["same_source_tuning"] for by_set in doc["results"].values() for r in by_set.values()):
        lines.append("† tuned on data from the same OOD source as this test set (same_source_tuning).")
    if any(r.get("same_source_oe") for by_set in doc["results"].values() for r in by_set.values()):
        lines.append("‡ the network was fine-tuned with outlier exposure on objects from the same source as this "
                     "test set's OOD objects (same_source_oe): not a test on unseen objects.")
    if coarse_cells(doc):
        lines.append(f"≈ {describe_grid(grid_of_config(doc['config']))} cannot pin these values down to {COARSE}: "
                     f"exact mode lies within the bounds in results.json (\"bounds\"); {_finer(doc)}")
    if doc.get("bootstrap"):
        b = doc["bootstrap"]
        lines.append(f"[lo, hi]: {b['confidence']:.0%} image-level bootstrap intervals ({b['resamples']} resamples, "
                     f"seed {b['seed']}). Bold: the best value, and in pooled tables every value not significantly "
                     "worse than it (paired bootstrap of the methods on the same resamples; intervals of the "
                     f"difference that include 0 are ties). The resampled counts use a coarse grid ({2 ** COARSE_BITS} "
                     "bins per binade): "
                     "\"coarsening\" in results.json bounds how far that moves a value.")
        undefined = {}  # {set: the most resamples that left a metric undefined}
        for per_set in doc["results"].values():
            for s, r in per_set.items():
                undefined[s] = max([undefined.get(s, 0), *r.get("undefined_resamples", {}).values()])
        for s, n in undefined.items():
            if 0 < n < b["resamples"]:  # (a set of no OOD or no ID pixel at all: undefined throughout, said above)
                lines.append(f"On {s}, {n} of the {b['resamples']} resamples drew no OOD or no ID pixel, which "
                             "leaves the pooled metrics undefined: their intervals are over the other resamples "
                             "(\"undefined_resamples\" in results.json).")
    per_image = [f"{(r['per_image_mean'] or {}).get('n_images', 0)}" for r in doc["results"][next(iter(doc["results"]))].values()]
    lines.append(f"Per-image means average the images where a metric is defined ({', '.join(per_image)} images per set).")
    lines += doc.get("notes") or []
    return "\n".join(lines) + "\n"


def summary_text(doc):
    """What ``segood evaluate`` prints: one compact table per set, the methods ranked by the set's headline metric
    (its benchmark's, :mod:`segood.data.benchmarks`: AUPRC and FPR95 for SegmentMeIfYouCan and Fishyscapes, AUROC
    for the paper's sets) and the headline first; pooled values (per-image means for a set whose protocol averages
    per image, its identity's ``per_image_headline``), best in each column marked *, ≈ where the grid's bins leave
    a pooled value far from exact. The full report (intervals, per-image means, thresholds, runtime) is
    results.md."""
    from segood.data.benchmarks import benchmark_of, headline_metrics

    sets = list(next(iter(doc["results"].values())))
    blocks = []
    for s in sets:
        identity = (doc.get("sets") or {}).get(s, {})
        sources, per_image = identity.get("ood_sources"), identity.get("per_image_headline")
        metrics = headline_metrics(sources, list(METRICS))
        lead = metrics[0]
        higher = METRICS[lead].higher_is_better
        aggregation = "per_image_mean" if per_image else "pooled"
        rows = [(m, by_set[s].get(aggregation) or {}) for m, by_set in doc["results"].items()]
        rows.sort(key=lambda row: (row[1].get(lead) is None,
                                   -(row[1].get(lead) or 0) if higher else (row[1].get(lead) or 0)))
        best = {}
        for k in metrics:
            values = [p.get(k) for _, p in rows if p.get(k) is not None]
            best[k] = (max if METRICS[k].higher_is_better else min)(values) if values else None
        width = max(len("method"), *(len(m) for m, _ in rows))
        headers = [f"{METRICS[k].label} {arrow(k)}" for k in metrics]
        cells = [max(len(h), 7) for h in headers]
        benchmark = benchmark_of(sources)
        n_images = (doc.get("timings") or {}).get("images_per_set", {}).get(s, identity.get("frames"))  # counted
        title = f"{s} ({benchmark.label}: {', '.join(METRICS[k].label for k in benchmark.headline)} first" + \
            (f"; {n_images} images" if n_images is not None else "") + f"; {per_image or 'pooled'}, * the best)"
        if not any(doc["results"][m][s]["n_ood"] for m in doc["results"]):
            counted = any(doc["results"][m][s]["n_id"] for m in doc["results"])
            blocks += [f"{s}: {'no OOD pixels' if counted else 'no frame counted yet'}, so no OOD metric is "
                       "defined", ""]
            continue
        blocks.append(title)
        blocks.append("  " + "method".ljust(width) + "".join(f"  {h:>{c}}" for h, c in zip(headers, cells)))
        coarse = {(m, k) for m, _ in rows for k in metrics if not per_image and too_coarse(k, doc["results"][m][s])}
        for m, pooled in rows:
            texts = ["–" if pooled.get(k) is None else f"{pooled[k]:.4f}"
                     + (("*" if pooled[k] == best[k] else "") + ("≈" if (m, k) in coarse else "") or " ")
                     for k in metrics]
            blocks.append(("  " + m.ljust(width) + "".join(f"  {t:>{c}}" for t, c in zip(texts, cells))).rstrip())
        if coarse:
            blocks.append(f"≈ the grid's bins leave the value more than {COARSE} from exact (results.md: its bounds)")
        blocks.append("")
    return "\n".join(blocks)


FIGURES = ("curves_*.png", "metrics.png", "per_class_*.png", "examples_*.png")  #: the files write_figures draws


def write_figures(figures, doc, ev, *, prune=False):
    """ROC and PR curves per set, grouped bars per metric, mean score per class, example panels (PNG files in
    the folder ``figures``). ``prune`` (a run folder's own ``figures/``): files of these names that this run does
    not draw (another run's, drawn before into the folder) are removed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    make_folder(figures)
    methods, sets = ev.method_names, ev.set_names
    drawn, file_name = set(), file_names()

    def save(fig, *parts, **layout):
        name = file_name(*parts)
        drawn.add(name)
        _save(fig, figures / name, **layout)

    for s in sets:  # ROC and PR curves
        fig, (roc, pr) = plt.subplots(1, 2, figsize=(10, 4.2))
        for m in methods:
            acc = ev.acc[(m, s)]
            fp, tp = np.cumsum(acc.curve_counts()[1][..., ::-1], axis=-1)[..., ::-1]
            if not (fp.size and fp[0] and tp[0]):  # (no pixel of one kind, or none at all: a set not reached yet)
                continue
            n_id, n_ood = fp[0], tp[0]
            if tp.size > CURVE_POINTS:  # the exact grid: a point per distinct score, more than a figure resolves
                keep = np.unique(np.linspace(0, tp.size - 1, CURVE_POINTS).round().astype(np.int64))
                fp, tp = fp[keep], tp[keep]
            r = doc["results"][m][s]["pooled"]
            roc.plot(np.r_[fp[::-1] / n_id, 1], np.r_[tp[::-1] / n_ood, 1], label=f"{m} ({r['auroc']:.3f})")
            predicted = tp + fp
            precision = np.divide(tp, predicted, out=np.ones(len(tp)), where=predicted > 0)
            pr.step(tp / n_ood, precision, where="post", label=f"{m} ({r['auprc']:.3f})")
        roc.plot([0, 1], [0, 1], ":", color="grey")
        roc.set(xlabel="false positive rate", ylabel="true positive rate", title=f"ROC — {s}")
        pr.set(xlabel="recall (TPR)", ylabel="precision", title=f"PR — {s}")
        if roc.lines[:-1]:  # no curve where the set has no OOD or no ID pixel
            for ax in (roc, pr):
                ax.legend(fontsize=7)
        save(fig, "curves", s)

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4), squeeze=False)  # Figures 3-4
    axes = axes[0]
    width = 0.8 / max(len(methods), 1)
    for ax, metric in zip(axes, METRICS):
        for k, m in enumerate(methods):
            values, intervals = bar_values(doc, m, sets, metric)
            errors = np.array([[v - lo, hi - v] if lo is not None else [0.0, 0.0]
                               for v, (lo, hi) in zip(values, intervals)]).T
            ax.bar(np.arange(len(sets)) + k * width, values, width, label=m, yerr=np.clip(errors, 0, None),
                   capsize=2, error_kw={"linewidth": 0.8})
        ax.set_xticks(np.arange(len(sets)) + width * (len(methods) - 1) / 2,
                      [f"{s}\n(per-image mean)" if _headline(doc, s) else s for s in sets], rotation=20, fontsize=8)
        ax.set_title(f"{METRICS[metric].label} {arrow(metric)}")
    axes[0].legend(fontsize=7)
    save(fig, "metrics")

    for m in methods:  # Figure 2: mean OOD score per Cityscapes class, one bar per set
        means = np.array([[np.nan if v is None else v for v in doc["per_class_mean_score"][m][s].values()]
                          for s in sets])
        if np.all(np.isnan(means)):
            continue
        order = np.argsort(-(np.nan_to_num(means[-1]) - np.nan_to_num(means[0]))) if len(sets) > 1 else np.arange(len(CLASS_NAMES))
        fig, ax = plt.subplots(figsize=(12, 4))
        width = 0.8 / len(sets)
        for k, s in enumerate(sets):
            ax.bar(np.arange(len(CLASS_NAMES)) + k * width, np.nan_to_num(means[k][order]), width, label=s)
        ax.set_xticks(np.arange(len(CLASS_NAMES)) + width * (len(sets) - 1) / 2, [CLASS_NAMES[i] for i in order],
                      rotation=45, ha="right", fontsize=8)
        ax.set(ylabel=f"mean {m} score", title=f"Mean OOD score per class ({m})")
        ax.legend(fontsize=7)
        save(fig, "per_class", m)

    for s in sets:  # Figures 5-7: input | ground truth | prediction | heat map per method
        keys = sorted(k for k in ev.examples if k[0] == s)
        if not keys:
            continue
        predictions = [f for f in ev.examples[keys[0]] if f == "classes" or f.startswith("classes (")]
        cols = 2 + len(predictions) + len(methods)
        fig, axes = plt.subplots(len(keys), cols, figsize=(2.6 * cols, 1.6 * len(keys) + 0.4), squeeze=False)
        limits = {m: heat_limits([ev.examples[key][f"score_{m}"] for key in keys]) for m in methods}
        for row, key in enumerate(keys):
            ex = ev.examples[key]
            truth = colorize(ex["semantic"])
            truth[ex["ood_mask"] == 1] = 255  # OOD pixels in white
            panels = [ex["image"], truth, *(colorize(ex[f]) for f in predictions)]
            panels += [ex[f"score_{m}"].astype(np.float32) for m in methods]
            titles = ["input", "ground truth (OOD white)", *(f"prediction{f[7:]}" for f in predictions), *methods]
            ranges = [(None, None)] * (2 + len(predictions)) + [limits[m] for m in methods]
            for ax, panel, title, (vmin, vmax) in zip(axes[row], panels, titles, ranges):
                ax.imshow(panel, cmap="inferno" if panel.ndim == 2 else None, vmin=vmin, vmax=vmax)
                ax.set_axis_off()
                if row == 0:
                    ax.set_title(title, fontsize=8)
        fig.text(0.5, 0.01, heat_caption(), ha="center", va="bottom", fontsize=7)
        save(fig, "examples", s, bottom=0.25)
    for stale in {path for pattern in FIGURES for path in figures.glob(pattern)} if prune else ():
        if stale.name not in drawn:
            stale.unlink()


def heat_caption(percentiles=HEAT_PERCENTILES):
    """The example panels' note on how their heat maps are scaled."""
    lo, hi = percentiles
    return (f"Heat maps: each method's scale spans the {_ordinal(lo)} to {_ordinal(hi)} percentile of its own scores "
            "on these frames (dark: most in-distribution, bright: most OOD).")


def _ordinal(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _md(name):
    """A method or set name in a Markdown table cell: its ``|`` escaped (it would split the cell)."""
    return str(name).replace("|", r"\|")


def _markdown_cell(cell):
    text = "–" if cell.value is None else f"{cell.value:.4f}"
    flags = (f" [{cell.interval[0]:.3f}, {cell.interval[1]:.3f}]" if cell.interval else "") + \
        (" †" if cell.same_source else "") + (" ‡" if cell.same_source_oe else "") + (" ≈" if cell.coarse else "")
    return (f"**{text}**" if cell.top else text) + flags


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
          ">": r"\textgreater{}", "|": r"\textbar{}", "[": "{[}", "]": "{]}"}  # [ ]: not read as \\[...] options


def latex_escape(text):
    """``text`` with LaTeX's special characters escaped (method and set names are the user's); a character beyond
    printable Latin-1 (which ``\\usepackage[T1]{fontenc}`` sets) is written as its code point (≈: U+2248)."""
    return "".join(_LATEX.get(ch, ch if ch.isprintable() and ord(ch) < 256 else f"U+{ord(ch):04X}")
                   for ch in str(text))


def results_latex(doc):
    r"""The metric tables of results.md (:func:`metric_tables`) as LaTeX tables to paste into a paper: one table
    environment per metric and aggregation, booktabs rules (``\usepackage{booktabs}``), values to four decimals
    with their bootstrap intervals, bold as in results.md, the notes in each caption."""
    tables = metric_tables(doc)
    out = [rf"% segood {doc['toolkit']['segood_version']} ({doc['schema']}): the tables of results.md; needs "
           r"\usepackage{booktabs} (and \usepackage[T1]{fontenc} for accented letters in names)", ""]
    for k, (metric, title, columns, rows) in enumerate(tables):
        notes = _latex_notes(doc.get("bootstrap"), [c for _, row in rows for c in row], pooled=k < len(METRICS))
        direction = r"$\uparrow$" if METRICS[metric].higher_is_better else r"$\downarrow$"
        out += [r"\begin{table}[t]", r"\centering", r"\small",
                rf"\caption{{{latex_escape(METRICS[metric].label)} {direction}, {latex_escape(title)}. {notes}}}",
                rf"\label{{tab:segood-{metric}-{'pooled' if k < len(METRICS) else 'per-image'}}}",
                r"\begin{tabular}{l" + "r" * len(columns) + "}", r"\toprule",
                "Method & " + " & ".join(latex_escape(c) for c in columns) + r" \\", r"\midrule"]
        out += [latex_escape(m) + " & " + " & ".join(_latex_cell(c) for c in row) + r" \\" for m, row in rows]
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(out)


def _latex_notes(b, cells, *, pooled):
    """A table's caption notes: its intervals, what is bold (the paired comparison is of pooled values) and the
    flags its own cells carry."""
    notes = (rf"[lo, hi]: {100 * b['confidence']:.0f}\% image-level bootstrap intervals ({b['resamples']} "
             rf"resamples, seed {b['seed']}). " if b else "") + "Bold: the best value" + (
        " and every value not significantly worse (paired bootstrap)." if b and pooled else ".")
    if any(c.same_source for c in cells):
        notes += r" $^\dagger$ tuned on data from the same OOD source as the test set."
    if any(c.same_source_oe for c in cells):
        notes += r" $^\ddagger$ outlier exposure on objects from the same source as the test set."
    if any(c.coarse for c in cells):
        notes += rf" $\approx$ the binning may move the value by more than {COARSE}."
    return notes


def _latex_cell(cell):
    if cell.value is None:
        return "--"
    text = rf"\textbf{{{cell.value:.4f}}}" if cell.top else f"{cell.value:.4f}"
    if cell.interval:
        text += rf" {{\scriptsize [{cell.interval[0]:.3f}, {cell.interval[1]:.3f}]}}"
    return text + (r"$^\dagger$" if cell.same_source else "") + (r"$^\ddagger$" if cell.same_source_oe else "") + \
        (r" $\approx$" if cell.coarse else "")


def committed_markdown(doc, sets):
    """TPR / FPR / balanced accuracy at thresholds committed on the tuning set (or, named so, oracle ones)."""
    key = "committed" if doc.get("commit_on") else "oracle"
    first = doc["results"][next(iter(doc["results"]))][sets[0]]
    title = (f"chosen on {doc['commit_on']}, applied unchanged to every set" if key == "committed" else
             "ORACLE: chosen on each test set itself (pass --commit-on SET to commit them on a tuning set)")
    lines = []
    for rule in first[key]:
        lines += [f"## At the {rule} threshold ({title})", "", "TPR / FPR / balanced accuracy.", "",
                  "| method | " + " | ".join(map(_md, sets)) + " |", "|---|" + "---:|" * len(sets)]
        for m, by_set in doc["results"].items():
            cells = []
            for s in sets:
                at = by_set[s][key][rule]
                cells.append("–" if at["tpr"] is None else f"{at['tpr']:.3f} / {at['fpr']:.3f} / "
                                                           f"{at['balanced_accuracy']:.3f}")
            lines.append(f"| {_md(m)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def runtime_markdown(doc):
    """Inference (the shared forward pass) and each method's scoring, apart."""
    per_method = (doc.get("timings") or {}).get("per_method")
    if not per_method:
        return []
    lines = ["## Runtime: inference and scoring apart", "",
             "| method | inference ms / image | scoring ms / image | inference ms / MP | scoring ms / MP |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {_md(m)} | {t['inference_ms_per_image']:.1f} | {t['scoring_ms_per_image']:.1f} | "
              f"{t['inference_ms_per_megapixel']:.1f} | {t['scoring_ms_per_megapixel']:.1f} |"
              for m, t in per_method.items()]
    return lines + [""]


def component_markdown(doc, sets):
    """A table of the component-level metrics (sIoU / PPV / F1*) per method and set, when the run has them."""
    cells = {(m, s): r[s].get("components") for m, r in doc["results"].items() for s in sets}
    present = [c for c in cells.values() if c]
    if not present:
        return []
    first = present[0]
    if first["threshold_source"] == "oracle":
        how = "ORACLE: tuned on the test set itself" + (f" (each set's own, by the {first['rule']} rule)"
                                                           if first.get("rule") else "")
    elif first.get("rule"):
        how = f"committed on {first['chosen_on']} by the {first['rule']} rule, applied unchanged to every set"
    else:
        how = "committed (given)"
    title = (f"## Component-level metrics (SMIYC; ground truth >= {first['min_gt']} px, predictions >= "
             f"{first['min_pred']} px; thresholds {how})")
    lines = [title, "", "sIoU / PPV / F1* per method and set.", "",
             "| method | " + " | ".join(map(_md, sets)) + " |", "|---|" + "---:|" * len(sets)]
    for m in doc["results"]:
        row = [cells[(m, s)] for s in sets]
        if any(row):
            lines.append(f"| {_md(m)} | " + " | ".join("–" if not c else " / ".join(
                "–" if c[k] is None else f"{c[k]:.3f}" for k in ("siou", "ppv", "f1_star")) for c in row) + " |")
    return lines + [""]


def official_markdown(doc, sets):
    """segood's numbers and the benchmark's own computation of them side by side (the official mode), per method
    and set; the component metrics too in the SMIYC mode."""
    cells = {(m, s): r[s].get("official") for m, r in doc["results"].items() for s in sets}
    present = [c for c in cells.values() if c]
    if not present:
        return []
    label = present[0]["label"]

    def number(value, digits=4):
        return "–" if value is None else f"{value:.{digits}f}"

    per_image = present[0]["benchmark"] in OFFICIAL_PER_IMAGE  # (a benchmark that averages over frames)
    names = [k for k in METRICS if k in present[0]]
    lines = [f"## {label} beside segood (docs/official.md)", "",
             f"segood's {'per-image means' if per_image else 'pooled values'} and the same metrics as the benchmark's "
             f"own code computes them ({label}).", "",
             "| method | set | " + " | ".join(f"{METRICS[k].label} | {METRICS[k].label} ({label})" for k in names)
             + " |", "|---|---|" + "---:|---:|" * len(names)]
    for (m, s), c in cells.items():
        if c:
            mine = doc["results"][m][s]["per_image_mean" if per_image else "pooled"] or {}
            lines.append(f"| {_md(m)} | {_md(s)} | "
                         + " | ".join(f"{number(mine.get(k))} | {number(c[k])}" for k in names) + " |")
    if "best_f1_threshold" in present[0]:
        lines.append("")
        lines.append(f"{label}: the threshold of best pixel F1 on its curve (its component threshold, tuned on the "
                     "test set): " + ", ".join(f"{m} on {s} {number(c['best_f1_threshold'], 6)}"
                                               for (m, s), c in cells.items() if c) + ".")
    with_components = [(key, c) for key, c in cells.items() if c and c.get("components")]
    if with_components:
        lines += ["", f"| method | set | sIoU / PPV / F1* | sIoU / PPV / F1* ({label}) | threshold |",
                  "|---|---|---:|---:|---:|"]
        for (m, s), c in with_components:
            mine, theirs = doc["results"][m][s]["components"], c["components"]
            lines.append(f"| {_md(m)} | {_md(s)} | "
                         + " | ".join(" / ".join(number(x[k], 3) for k in ("siou", "ppv", "f1_star"))
                                      for x in (mine, theirs)) + f" | {theirs['threshold']:.6g} |")
    return lines + [""]


def bar_values(doc, method, sets, metric):
    """(values, [lo, hi] intervals) of a method's bars of ``metric`` over ``sets``: each set's headline aggregate
    (its per-image mean where its protocol averages per image, else the pooled value); 0 and [None, None] where
    undefined."""
    results = [doc["results"][method][s] for s in sets]
    kinds = [("per_image_mean", "per_image_intervals") if _headline(doc, s) else ("pooled", "intervals") for s in sets]
    values = [(r[value] or {}).get(metric) or 0.0 for r, (value, _) in zip(results, kinds)]
    intervals = [(r.get(interval) or {}).get(metric) or [None, None] for r, (_, interval) in zip(results, kinds)]
    return values, intervals


def _headline(doc, set_name):
    """A set's per-image headline (its protocol averages per image), or None."""
    return (doc.get("sets") or {}).get(set_name, {}).get("per_image_headline")


def heat_limits(maps, percentiles=HEAT_PERCENTILES):
    """(vmin, vmax) of one method's heat maps: the ``percentiles`` (default the 1st and 99th) of the finite values
    of its ``maps`` (the frames it is drawn on), so that every method shows its own ranking of the pixels whatever
    its range (VarSum's and mutual information's small values, unbounded logit scores); (0, 1) without finite
    values, and a unit-wide range around a constant map."""
    values = np.concatenate([np.asarray(v, np.float64).ravel() for v in maps])
    values = values[np.isfinite(values)]
    if not values.size:
        return 0.0, 1.0
    lo, hi = np.percentile(values, percentiles)
    return (float(lo), float(hi)) if hi > lo else (float(lo) - 0.5, float(lo) + 0.5)


def coarse_cells(doc):
    """[(method, set, metric)] of the results document's pooled values that exact mode may differ from by more than
    COARSE (marked ≈)."""
    return [(m, s, metric) for m, by_set in doc["results"].items() for s, r in by_set.items() for metric in METRICS
            if too_coarse(metric, r)]


#: the start of :func:`warn_coarse`'s message, for commands that run evaluations with no grid option of their own
COARSE_WARNING = r".* cannot pin \d+ pooled"


def warn_coarse(doc):
    """A warning naming the pooled values the run's grid cannot pin down (:func:`coarse_cells`; on the linear grid,
    scores crowded into a few of its bins read as chance), beside their ≈ in the tables."""
    cells = coarse_cells(doc)
    if not cells:
        return
    shown = ", ".join(f"{METRICS[k].label} of {m} on {s} in [{doc['results'][m][s]['bounds'][k][0]:.3f}, "
                      f"{doc['results'][m][s]['bounds'][k][1]:.3f}]" for m, s, k in cells[:3])
    more = f" and {len(cells) - 3} more" if len(cells) > 3 else ""
    warnings.warn(f"{describe_grid(grid_of_config(doc['config']))} cannot pin {len(cells)} pooled "
                  f"{'value' if len(cells) == 1 else 'values'} down to {COARSE} (marked ≈): exact mode may lie "
                  f"anywhere in the bounds, e.g. {shown}{more}; {_finer(doc)}", stacklevel=3)


def _finer(doc):
    """How to rerun a run whose grid cannot pin its values down."""
    grid = grid_of_config(doc["config"])
    if grid["kind"] == "linear":
        return "rerun on the float-order grid (the default: drop --num-thresholds)."
    if grid["mantissa_bits"] >= MAX_MANTISSA_BITS:  # (scores that tie, quantised ones, fill one bin at any width)
        return (f"{MAX_MANTISSA_BITS} mantissa bits, the most, leave these bins as they are (their scores may tie): "
                "rerun with --grid exact where the set's scores fit in memory, which counts ties as scikit-learn "
                "does (docs/grids.md).")
    return (f"rerun with more --mantissa-bits (at most {MAX_MANTISSA_BITS}), or with --grid exact where the set's "
            "scores fit in memory (docs/grids.md); scores that tie share a bin however fine it is.")


def too_coarse(metric, result):
    """Whether exact mode may differ from this pooled value by more than COARSE (``result``: one method and set
    of results.json, with its ``bounds``)."""
    value = result["pooled"].get(metric)
    lo, hi = result.get("bounds", {}).get(metric, (None, None))
    if value is None or lo is None or hi is None:
        return False
    return max(value - lo, hi - value) > COARSE


def file_names():
    """A function giving a figure's PNG file name from its parts (a word, method and set names): joined by _, path
    separators and other odd characters replaced by _, distinct for distinct parts: where two become one file name
    (``x|y`` and ``x_y``; set ``a`` with ``b_c`` and set ``a_b`` with ``c``), the later one ends in a short hash of
    its parts."""
    taken = {}

    def file_name(*parts):
        safe = re.sub(r"[^A-Za-z0-9._+-]", "_", "_".join(parts))
        if taken.setdefault(safe, parts) != parts:
            safe += "-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]
        return safe + ".png"
    return file_name


def _number(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _save(fig, path, *, bottom=0.0):
    """Lay out and write ``fig`` to ``path``, keeping ``bottom`` inches free below the axes (for a caption)."""
    fig.tight_layout(rect=(0, bottom / fig.get_figheight(), 1, 1))
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    import matplotlib.pyplot as plt

    plt.close(fig)
