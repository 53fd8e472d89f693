"""The results of a run as a notebook uses them: the results document (a dict, the content of results.json) that
also makes a table, writes the report and draws the figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from segood.evaluation.layout import RunFolder
from segood.evaluation.report import results_csv, results_latex, results_markdown, write_figures
from segood.io import atomic_write_text, make_folder, write_json
from segood.metrics import METRICS

if TYPE_CHECKING:
    import pandas

    from segood.evaluation.runner import Evaluation


class Results(dict):
    """A run's results document (``results["results"][method][set]["pooled"]["auroc"]`` and the rest of
    results.json) with the run's state (:class:`~segood.evaluation.runner.Evaluation`) beside it.

    >>> results = segood.evaluate(model, {"val": "datasets/ra21_val.h5"}, ["max_softmax", "energy"])
    >>> results.table()                        # method, set, metric, aggregation, value, low, high
    >>> results.save("runs/ra21"); results.figures("runs/ra21/figures")
    """

    def __init__(self, doc: dict, state: Evaluation | None):
        super().__init__(doc)
        self.state = state

    def table(self, *, aggregation: str = "pooled") -> pandas.DataFrame:
        """A pandas DataFrame, one row per (method, set, metric): ``value`` and its bootstrap interval
        ``low``..``high`` (NaN where the run drew none); ``aggregation`` "pooled" (every pixel of the set, the
        default) or "per-image mean" (needs pandas: ``pip install segood[notebook]``)."""
        try:
            import pandas as pd
        except ModuleNotFoundError:
            raise ModuleNotFoundError("Results.table() makes a pandas DataFrame: pip install 'segood[notebook]' (or "
                                      "pandas); the numbers themselves are in the results dict without it") from None

        if aggregation not in ("pooled", "per-image mean"):
            raise ValueError(f"aggregation must be 'pooled' or 'per-image mean', got {aggregation!r}")
        key, intervals = ("pooled", "intervals") if aggregation == "pooled" else ("per_image_mean",
                                                                                  "per_image_intervals")
        rows = []
        for method, by_set in self["results"].items():
            for set_name, r in by_set.items():
                values, bounds = r.get(key) or {}, r.get(intervals) or {}
                for metric in METRICS:
                    low, high = bounds.get(metric) or (None, None)
                    rows.append({"method": method, "set": set_name, "metric": metric, "aggregation": aggregation,
                                 "value": values.get(metric), "low": low, "high": high})
        frame = pd.DataFrame(rows, columns=["method", "set", "metric", "aggregation", "value", "low", "high"])
        return frame.astype({"value": float, "low": float, "high": float})

    def save(self, folder: str | Path) -> Path:
        """Write the run folder's files into ``folder``: run.json, state.npz (so ``segood report`` can rebuild the
        report with other settings), results.json, .csv, .md and .tex; returns the folder. A folder that holds
        another run is refused."""
        out = RunFolder(folder)
        described = {k: self[k] for k in ("toolkit", "model", "sets", "methods", "config") if k in self}
        out.refuse_another_run(described)  # (not overwritten)
        make_folder(out.path)
        write_json(out.run, described)
        self.state.save(out.state())
        write_json(out.results_json, dict(self))
        atomic_write_text(out.results_csv, results_csv(self))
        atomic_write_text(out.results_md, results_markdown(self))
        atomic_write_text(out.results_tex, results_latex(self))
        return out.path

    def figures(self, folder: str | Path) -> Path:
        """Draw the run's figures (metrics, curves, per-class scores, examples) into ``folder``; returns it."""
        folder = Path(folder)
        write_figures(folder, self, self.state)
        return folder
