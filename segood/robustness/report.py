"""Tables and figures of a robustness run: each metric against severity, a panel per corruption, a line per
method; the summary over corruptions and severities (plain mean and mCE); corrupted example frames with their heat
maps; the contact sheet of the severities."""

import json
from pathlib import Path

import numpy as np

from segood.evaluation.report import _save, file_names, heat_limits
from segood.io import make_folder
from segood.labels import colorize
from segood.metrics import METRICS
from segood.robustness.approval import approval_markdown
from segood.robustness.corruptions import FAMILIES, condition_name, contact_sheet, family_of, severity_markdown

QUALITY = {"miou": ("mIoU", "↑"), "ece": ("ECE (15 bins)", "↓"), "brier": ("Brier", "↓")}
OOD_SHOWN = ("auroc", "fpr95")  # the OOD metrics tabulated and drawn per corruption (results.json holds all)


def _fmt(value):
    return "–" if value is None else f"{value:.3f}"


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def load_reference(path, own):
    """The results document of a robustness run (its folder or its results.json), for :func:`summary` of the run in
    the folder ``own``, which it must not be."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if Path(own).resolve() in (path.resolve(), file.parent.resolve()):
        raise ValueError(f"the reference run {path} is this run's own folder: its mCE would compare the run with "
                         "itself; name the finished robustness run of a reference model")
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the reference run {file}: {err}; name the folder of a finished segood "
                         "robustness run (or its results.json)") from None
    if not str(doc.get("schema", "")).startswith("segood.robustness/"):
        raise ValueError(f"{file} is not the results of segood robustness (schema {doc.get('schema')!r}); name the "
                         "folder of a finished segood robustness run")
    return doc


def check_reference(reference, run, path):
    """Refuse a ``reference`` results document (of the run at ``path``) that corrupted other frames than ``run``
    (run.json's content) does: another version of one of its sets, another seed or standard size."""
    ours, theirs = run.get("sets") or {}, reference.get("sets") or {}
    for name in ours:
        if name in theirs and (ours[name] or {}).get("manifest_sha256") != (theirs[name] or {}).get("manifest_sha256"):
            raise ValueError(f"the reference run {path} evaluated another set named {name!r} (its manifest sha256 "
                             "differs): the corruption errors would compare different frames; name a reference run "
                             "on these sets")
    mine = (run.get("config") or {}).get("robustness") or {}
    other = (reference.get("config") or {}).get("robustness") or {}
    for key in ("seed", "standard_size"):
        if mine.get(key) != other.get(key):
            raise ValueError(f"the reference run {path} corrupted its frames with {key} {other.get(key)!r}, this run "
                             f"with {mine.get(key)!r}: the corruption errors would compare different frames")


def corruption_error(values, clean, reference_values, reference_clean, *, higher_is_better):
    """The ImageNet-C corruption errors of one corruption (Hendrycks & Dietterich 2019, §3): with the error
    E = 1 - value for a metric where higher is better (AUROC, mIoU) and E = value otherwise (FPR95),
    CE = sum over severities of E / the same sum of the reference, relative CE = sum of (E - E clean) / the same
    sum of the reference. Returns (CE, relative CE), None where a value is missing or a denominator is 0."""
    def error(v):
        return None if v is None else (1 - v if higher_is_better else v)

    errors, ref = [error(v) for v in values], [error(v) for v in reference_values]
    if None in errors or None in ref or not ref:
        return None, None
    total, ref_total = sum(errors), sum(ref)
    ce = total / ref_total if ref_total else None
    if error(clean) is None or error(reference_clean) is None:
        return ce, None
    rel_ref = ref_total - len(ref) * error(reference_clean)
    return ce, ((total - len(errors) * error(clean)) / rel_ref if rel_ref else None)


def summary(doc, reference=None):
    """Per set and corruption family: the mean over corruptions and severities of the network's mIoU and of each
    method's OOD metrics (question a), and, against a ``reference`` results document (another model's run on
    the same set, corruptions and severities), mCE and relative mCE: the corruption errors of
    :func:`corruption_error` averaged over the corruptions.

    Returns {set: {family: {"network": {"miou": cell}, "ood": {method: {metric: cell}}}}}, a cell
    {"mean", "mce", "relative_mce"} (None where undefined or without a reference)."""

    levels = [str(v) for v in doc["robustness"]["severities"]]
    out = {}
    for s, by_corruption in doc["corrupted"].items():
        ref_set = (reference or {}).get("corrupted", {}).get(s, {})
        ref_clean = (reference or {}).get("clean", {}).get(s)
        out[s] = {}
        for family in FAMILIES[:2]:
            names = [c for c in by_corruption if family_of(c) == family]
            if not names:
                continue

            def cell(get, higher_is_better, names=names):
                values = {c: [get(by_corruption[c][v]) for v in levels] for c in names}
                flat = [x for c in names for x in values[c] if x is not None]
                result = {"mean": float(np.mean(flat)) if flat else None, "mce": None, "relative_mce": None}
                if reference is None or ref_clean is None:
                    return result
                errors = []
                for c in names:
                    ref_cells = ref_set.get(c, {})
                    if any(v not in ref_cells for v in levels):
                        return result
                    errors.append(corruption_error(values[c], get(doc["clean"][s]), [get(ref_cells[v]) for v in levels],
                                                   get(ref_clean), higher_is_better=higher_is_better))
                for k, key in enumerate(("mce", "relative_mce")):
                    column = [e[k] for e in errors]
                    result[key] = None if None in column else float(np.mean(column))
                return result

            def get_ood(m, k):
                def get(cells):
                    return (cells.get("ood", {}).get(m) or {}).get(k)
                return get

            out[s][family] = {
                "network": {"miou": cell(lambda cells: cells["segmentation"]["miou"], True)},
                "ood": {m: {k: cell(get_ood(m, k), METRICS[k].higher_is_better) for k in METRICS}
                        for m in doc["methods"]}}
    return out


def summary_markdown(doc):
    """The summary of :func:`summary` (``doc["summary"]``) as Markdown: per set, a row per family and quantity."""
    lines = ["## Summary: mean over corruptions and severities", "",
             "mCE and relative mCE (ImageNet-C's corruption errors, error = 1 - metric where higher is better) are "
             + (f"relative to the reference run `{doc['reference_run']}`." if doc.get("reference_run") else
                "undefined without a reference run (`--reference RUN`)."), ""]
    for s, by_family in doc["summary"].items():
        lines += [f"### Set {s}", "", "| family | quantity | mean | mCE | relative mCE |", "|---|---|---:|---:|---:|"]
        for family, parts in by_family.items():
            rows = [("network mIoU ↑", parts["network"]["miou"])]
            rows += [(f"{m} {METRICS[k].label} {METRICS[k].arrow()}", parts["ood"][m][k])
                     for m in parts["ood"] for k in OOD_SHOWN]
            for label, c in rows:
                numbers = " | ".join(_fmt(c[key]) for key in ("mean", "mce", "relative_mce"))
                lines.append(f"| {family} | {label} | {numbers} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def results_markdown(doc):
    """Per set: the network's mIoU / ECE / Brier per corruption and severity, then per OOD metric and question
    a summary (mean over corruptions, one row per method) and one table per method."""
    spec, levels = doc["robustness"], [str(s) for s in doc["robustness"]["severities"]]
    head = "| corruption | clean | " + " | ".join(f"severity {s}" for s in levels) + " |"
    rule = "|---|" + "---:|" * (len(levels) + 1)
    lines = [f"# Robustness ({doc['schema']}, segood {doc['toolkit']['segood_version']})", "",
             f"{len(spec['corruptions'])} corruptions at severities {', '.join(levels)}, each frame corrupted on the "
             f"fly, seeded per (frame, corruption, severity) with seed {spec['seed']}. (a) corrupted ID stays ID: "
             "the methods on the corrupted set's own OOD and ID pixels. (b) corruption as OOD: the clean frames' ID "
             "pixels as ID, the corrupted frames' ID pixels as OOD (clean column: not defined).", ""]
    if doc.get("unfinished"):
        lines += [f"**The run is unfinished**: {len(doc['unfinished'])} sets or conditions were not scored to the end "
                  f"(e.g. {', '.join(list(doc['unfinished'])[:3])}); their numbers are those of part of the frames. "
                  "Finish it with --resume.", ""]
    methods = list(doc["methods"])
    for s, by_corruption in doc["corrupted"].items():
        clean = doc["clean"][s]
        lines += [f"## Set {s}", ""]
        for key, (label, arrow) in QUALITY.items():
            lines += [f"### Network: {label} {arrow}", "", head, rule]
            for c, cells in by_corruption.items():
                lines.append(f"| {c} | {_fmt(clean['segmentation'][key])} | "
                             + " | ".join(_fmt(cells[level]["segmentation"][key]) for level in levels) + " |")
            lines.append("")
        for question, title in (("ood", "(a) corrupted ID stays ID"), ("as_ood", "(b) corruption as OOD")):
            for metric in OOD_SHOWN if question == "ood" else ("auroc",):
                label = f"{METRICS[metric].label} {METRICS[metric].arrow()}"
                lines += [f"### {title}: {label}, mean over corruptions", "",
                          "| method | clean | " + " | ".join(f"severity {v}" for v in levels) + " |", rule]
                for m in methods:
                    first = _fmt(clean["ood"][m][metric]) if question == "ood" else "–"
                    means = [_mean([cells[level][question][m][metric] for cells in by_corruption.values()])
                             for level in levels]
                    lines.append(f"| {m} | {first} | " + " | ".join(_fmt(v) for v in means) + " |")
                lines.append("")
                for m in methods:
                    lines += [f"#### {title}: {label}, {m}", "", head, rule]
                    for c, cells in by_corruption.items():
                        first = _fmt(clean["ood"][m][metric]) if question == "ood" else "–"
                        lines.append(f"| {c} | {first} | "
                                     + " | ".join(_fmt(cells[level][question][m][metric]) for level in levels) + " |")
                    lines.append("")
    if "summary" in doc:
        lines += [summary_markdown(doc)]
    if "approval" in doc:
        lines += [approval_markdown(doc["approval"])]
    lines += ["## Severity levels", "", severity_markdown(spec["corruptions"])]
    return "\n".join(lines) + "\n"


def write_figures(figures, doc, ev):
    """Metric-against-severity panels per set, example frames per set and corruption, the contact sheet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    make_folder(figures)
    file_name = file_names()
    spec = doc["robustness"]
    corruptions, levels = spec["corruptions"], spec["severities"]
    methods = list(doc["methods"])
    rows = -(-len(corruptions) // 5)  # at most 5 panels a row, the rows filled evenly
    cols = -(-len(corruptions) // rows)

    def panels(path, title, lines_of, ylabel):
        """One panel per corruption: x = severity (0 = clean), one line per entry of ``lines_of(cells, clean)``."""
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows + 0.5), squeeze=False, sharey=True)
        for ax, c in zip(axes.ravel(), corruptions):
            for label, clean_value, values in lines_of(c):
                x = ([0] if clean_value is not None else []) + levels
                y = ([clean_value] if clean_value is not None else []) + values
                ax.plot(x, [np.nan if v is None else v for v in y], marker="o", markersize=3, label=label)
            ax.set_title(c, fontsize=9)
            ax.set_xticks([0, *levels])
            ax.grid(alpha=0.3)
        for ax in axes.ravel()[len(corruptions):]:
            ax.set_axis_off()
        for ax in axes[:, 0]:
            ax.set_ylabel(ylabel, fontsize=8)
        for ax in axes[-1]:
            ax.set_xlabel("severity (0 = clean)", fontsize=8)
        axes[0, 0].legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        _save(fig, path)

    for s, by_corruption in doc["corrupted"].items():
        clean = doc["clean"][s]
        for question, metrics, what in (("ood", OOD_SHOWN, "corrupted ID stays ID"),
                                        ("as_ood", ("auroc",), "corruption as OOD")):
            for metric in metrics:
                label = f"{METRICS[metric].label} {METRICS[metric].arrow()}"
                panels(figures / file_name(question, metric, s), f"{label}: {what} ({s})",
                       lambda c, q=question, k=metric: [
                           (m, clean["ood"][m][k] if q == "ood" else None,
                            [by_corruption[c][str(v)][q][m][k] for v in levels]) for m in methods], label)
        panels(figures / file_name("network", s), f"the network under corruption ({s})",
               lambda c: [(f"{QUALITY[k][0]} {QUALITY[k][1]}", clean["segmentation"][k],
                           [by_corruption[c][str(v)]["segmentation"][k] for v in levels]) for k in QUALITY], "")

        for c in corruptions:  # example frames: clean and each severity; input | truth | prediction | heat maps
            keys = [(s, 0)] + [(condition_name(s, c, v), 0) for v in levels]
            keys = [k for k in keys if k in ev.examples]
            if not keys:
                continue
            ncols = 3 + len(methods)
            first = ev.examples[keys[0]]["image"]
            fig, axes = plt.subplots(len(keys), ncols, squeeze=False,
                                     figsize=(2.2 * ncols, 2.2 * first.shape[0] / first.shape[1] * len(keys) + 0.5))
            limits = {m: heat_limits([ev.examples[k][f"score_{m}"] for k in keys]) for m in methods}
            for row, key in enumerate(keys):
                ex = ev.examples[key]
                truth = colorize(ex["semantic"])
                truth[ex["ood_mask"] == 1] = 255
                panels_ = [ex["image"], truth, colorize(ex["classes"])] + [ex[f"score_{m}"] for m in methods]
                ranges = [(None, None)] * 3 + [limits[m] for m in methods]
                for col, (ax, panel, (lo, hi)) in enumerate(zip(axes[row], panels_, ranges)):
                    ax.imshow(panel, cmap="inferno" if panel.ndim == 2 else None, vmin=lo, vmax=hi)
                    ax.set_xticks([])
                    ax.set_yticks([])
                    if row == 0:
                        ax.set_title(["input", "ground truth (OOD white)", "prediction", *methods][col], fontsize=8)
                    if col == 0:
                        ax.set_ylabel("clean" if row == 0 else f"{c} {levels[row - 1]}", fontsize=8)
            _save(fig, figures / file_name("examples", s, c))

    first = next(iter(doc["corrupted"]))
    if (first, 0) in ev.examples:  # what each level looks like, on the first frame of the first set
        contact_sheet(ev.examples[(first, 0)]["image"], figures / "contact_sheet.png", names=corruptions,
                      severities=levels, seed=spec["seed"], standard_size=spec.get("standard_size", "fixed"))
