"""The cross-source protocol (OD-test's): tune on one OOD source, test on the others.

For each tuning set S, every method's hyperparameters (those with a grid) are tuned on S and its thresholds
committed on S; it is then evaluated on every test set T. A cell (S, T) is *same-source* when S and T share an
OOD source; the headline of a method is the mean over the other cells, where neither its hyperparameters nor its
threshold saw the test's outliers.
"""

import dataclasses
import json
import warnings
from pathlib import Path

from segood.data.h5 import H5SegmentationDataset, frame_loader, read_manifest, set_identity
from segood.evaluation.api import evaluate
from segood.evaluation.layout import RunFolder, refuse_another_command
from segood.evaluation.options import GRIDS, ProtocolOptions
from segood.evaluation.report import COARSE_WARNING
from segood.io import atomic_write_text, write_json
from segood.methods.methods import method_for_grid
from segood.methods.scorer import Scorer
from segood.methods.tuning import tune
from segood.metrics import METRICS
from segood.models.external import as_network
from segood.models.network import keeps_modes

SCHEMA = "segood.protocol/1"
__all__ = ["GRIDS", "ProtocolOptions", "cross_source", "protocol_markdown"]


@keeps_modes
def cross_source(model, tuning_sets: dict[str, str | Path], test_sets: dict[str, str | Path], methods: list[str],
                 out_dir: str | Path, options: ProtocolOptions | None = None, **keywords) -> dict:
    """Run the protocol; writes ``out_dir/<S>/`` (one evaluation per tuning set, resumable), ``protocol.json`` and
    ``protocol.md``, and returns the protocol document.

    Args:
        model: a segood network or any ``nn.Module`` returning logits, as :func:`segood.evaluate` takes.
        tuning_sets: {name: converted set}, one per OOD source.
        test_sets: {name: converted set}.
        methods: method names.
        out_dir: the protocol's folder.
        options: a :class:`~segood.evaluation.options.ProtocolOptions` (rule, metric, grids and the evaluation's
            options); ``keywords`` are its fields or those of its evaluation (``rule="f1", batch_size=4``), put into
            ``options`` when both are given. Every option is checked there, once.
    """
    options = ProtocolOptions.of(options, **keywords)
    refuse_another_command(out_dir, "protocol.json")
    grids, rule, metric, evaluation = options.grids, options.rule, options.metric, options.evaluation
    clash = sorted(set(tuning_sets) & set(test_sets))
    if clash:
        raise ValueError(f"sets {clash} are named both as tuning and as test sets: a tuning set is a held-out split; "
                         "name its own test split differently")
    for kind, sets in (("tuning", tuning_sets), ("test", test_sets)):  # each must rank OOD against ID pixels
        for name, path in sets.items():
            pixels = read_manifest(path)["pixels"]
            if not pixels["ood"] or not pixels["id"]:
                raise ValueError(f"{kind} set {name!r} ({path}) has {pixels['id']} ID and {pixels['ood']} OOD pixels: "
                                 f"the protocol ranks OOD against ID pixels (a {kind} set without both leaves "
                                 f"{'nothing tuned' if kind == 'tuning' else 'every headline undefined'}); give a set "
                                 "with OOD objects (e.g. segood convert mix)")
    for s in tuning_sets:  # (a later tuning set's folder found taken only after the earlier ones' evaluations)
        folder = RunFolder(Path(out_dir) / s)
        run = folder.read_run() if folder.run.exists() else None
        if run is not None and (set(run.get("sets") or {}) != {s, *test_sets}
                                or set(run.get("methods") or {}) != set(methods)):
            raise ValueError(f"{folder.path} holds a run of other sets or methods than this protocol's evaluation "
                             f"tuned on {s}; choose another folder (--out; in Python out_dir)")
    sources = {name: set(set_identity(path)["ood_sources"]) for name, path in {**tuning_sets, **test_sets}.items()}
    if not isinstance(model, Scorer):  # (tuning scores the network itself, in inference mode, as the evaluation will)
        model = as_network(model, feature_layer=evaluation.feature_layer,
                           align_corners=evaluation.align_corners).eval()
    out_dir = Path(out_dir)
    cells = {m: {} for m in methods}
    tuned_params = {m: {} for m in methods}
    for s, path in tuning_sets.items():
        loader = frame_loader(H5SegmentationDataset(path), evaluation.batch_size)
        tuned = [tune(m, model, loader, grids[m], metric=metric, tuning_set=path, metric_grid=evaluation.grid,
                      progress=evaluation.progress).method()
                 if m in grids else method_for_grid(m, evaluation.grid) for m in methods]
        with warnings.catch_warnings():  # (each evaluation's results.md marks ≈ what its grid cannot pin down)
            warnings.filterwarnings("ignore", message=COARSE_WARNING)
            doc = evaluate(model, {s: path, **test_sets}, tuned, out_dir / s, dataclasses.replace(
                evaluation, resume=evaluation.resume and (out_dir / s / "run.json").exists(), commit_on=s))
        for method in tuned:
            m = method.name
            tuned_params[m][s] = {k: v for k, v in method.params.items() if k != "tuning"}
            cells[m][s] = {t: {metric: doc["results"][m][t]["pooled"][metric],
                               **doc["results"][m][t]["committed"][rule],
                               "same_source": bool(sources[s] & sources[t])} for t in test_sets}
    headline = {m: _headline(cells[m], metric) for m in methods}
    document = {"schema": SCHEMA, "metric": metric, "rule": rule, "tuning_sets": list(tuning_sets),
                "test_sets": list(test_sets), "ood_sources": {k: sorted(v) for k, v in sources.items()},
                "grids": {m: grids[m] for m in methods if m in grids}, "tuned_params": tuned_params,
                "cells": cells, "headline": headline}
    write_json(out_dir / "protocol.json", document)
    atomic_write_text(out_dir / "protocol.md", protocol_markdown(document))
    return document


def _headline(by_source, metric):
    """Means over the cells that are not same-source (None where there are none, or a value is undefined)."""
    other = [cell for row in by_source.values() for cell in row.values() if not cell["same_source"]]
    out = {"cells": len(other)}
    for key in (metric, "balanced_accuracy", "tpr", "fpr"):
        values = [c[key] for c in other]
        out[key] = sum(values) / len(values) if values and None not in values else None
    return out


def protocol_markdown(doc):
    metric, rule = doc["metric"], doc["rule"]
    label = METRICS[metric].label
    lines = [f"# Cross-source protocol ({label}; thresholds committed by {rule} on the tuning set)", "",
             "Headline: the mean over the cells whose tuning and test sets share no OOD source (cells marked † do "
             "and are left out).", "",
             f"| method | headline {label} | headline balanced accuracy | cells |", "|---|---:|---:|---:|"]
    for m, h in doc["headline"].items():
        lines.append(f"| {m} | {_fmt(h[metric])} | {_fmt(h['balanced_accuracy'])} | {h['cells']} |")
    for m, by_source in doc["cells"].items():
        lines += ["", f"## {m}: {label} / balanced accuracy at the committed threshold", "",
                  "| tuned on ↓ tested on → | " + " | ".join(doc["test_sets"]) + " |",
                  "|---|" + "---:|" * len(doc["test_sets"])]
        for s, row in by_source.items():
            params = doc["tuned_params"][m].get(s)
            name = f"{s} ({json.dumps(params)[1:-1]})" if params else s
            lines.append(f"| {name} | " + " | ".join(
                f"{_fmt(c[metric])} / {_fmt(c['balanced_accuracy'])}" + (" †" if c["same_source"] else "")
                for c in row.values()) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value):
    return "–" if value is None else f"{value:.4f}"
