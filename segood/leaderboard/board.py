"""Judging a folder of submissions against a benchmark: recompute, never believe; one bad file never stops
the board. Outputs leaderboard.md, leaderboard.json and a self-contained index.html."""

import hashlib
import html
import json
import math
import unicodedata
import warnings
from pathlib import Path

import numpy as np

from segood.data.h5 import read_manifest, set_identity
from segood.io import atomic_write_text, write_json
from segood.leaderboard.safe import Limits, Rejected, load_npz, read_submission_files, strict_json
from segood.leaderboard.submission import validate
from segood.metrics import (METRICS, UndefinedMetricWarning, accumulator_from_state, describe_grid, grid_spec,
                            make_accumulator)

BENCHMARK_SCHEMA = "segood.benchmark/1"
TOLERANCE = 1e-6


def make_benchmark(tracks, out, *, grid=None):
    """Write BENCH.json: ``tracks`` = {track: {"sets": {name: path of the maintainer's set}, "rank_by": metric}};
    every submission must be binned on ``grid`` (:func:`segood.metrics.grid_spec`; default: the float-order
    grid), so that entries are comparable."""
    doc = {"schema": BENCHMARK_SCHEMA, "grid": grid or grid_spec(), "tracks": {}}
    for track, spec in tracks.items():
        if spec["rank_by"] not in METRICS:
            raise ValueError(f"rank_by must be one of {sorted(METRICS)}, got {spec['rank_by']!r}")
        doc["tracks"][track] = {"rank_by": spec["rank_by"], "sets": {
            name: {"manifest_sha256": identity["manifest_sha256"], "ood_sources": identity["ood_sources"],
                   "pixels": read_manifest(path)["pixels"]}
            for name, path in spec["sets"].items() for identity in [set_identity(path)]}}
    write_json(out, doc)
    return doc


def judge(path, benchmark, limits=Limits()):
    """One submission: (accepted entries {track: row}, None) or (None, reason). Never raises for bad input."""
    try:
        files = read_submission_files(path, limits)
        if "submission.json" not in files:
            raise Rejected("no submission.json at the top of the submission")
        unexpected = [n for n in files if n != "submission.json" and not (n.startswith("states/") and n.endswith(".npz"))]
        if unexpected:
            raise Rejected(f"unexpected members {unexpected[:3]}: only submission.json and states/*.npz are read")
        doc = strict_json(files["submission.json"], limits)
        validate(doc)
        rows = {}
        for track, spec in benchmark["tracks"].items():
            recomputed = {}
            for set_name, official in spec["sets"].items():
                entry = doc["sets"].get(set_name)
                if entry is None:
                    raise Rejected(f"track {track}: no results for set {set_name!r}")
                if entry["manifest_sha256"] != official["manifest_sha256"]:
                    raise Rejected(f"set {set_name!r}: evaluated on another version of the set (manifest hash "
                                   f"{entry['manifest_sha256'][:12]}…, the benchmark's {official['manifest_sha256'][:12]}…)")
                state_file = f"states/{set_name}.npz"
                if state_file not in files:
                    raise Rejected(f"set {set_name!r}: no accumulator state {state_file}")
                grid = benchmark_grid(benchmark)
                state = load_npz(files[state_file], tuple(make_accumulator(grid).state_dict()),
                                 optional=("per_image_metrics",))  # states before they named their metrics
                _check_state_config(set_name, state, grid)
                try:
                    acc = accumulator_from_state(state)
                except (ValueError, KeyError, TypeError) as err:
                    raise Rejected(f"set {set_name!r}: invalid accumulator state ({err})") from None
                recomputed[set_name] = _check(set_name, acc, entry["claims"], official["pixels"])
            rank_by = spec["rank_by"]
            values = [r[rank_by] for r in recomputed.values()]
            rows[track] = {
                "name": shown(doc["method"]["name"]), "description": shown(doc["method"].get("description", "")),
                "file": shown(Path(path).name), "sha256": _content_hash(files),
                "uses_ood_data": doc["method"].get("uses_ood_data", False),
                "same_source_tuning": any(_same_source(doc, s, official) for s, official in spec["sets"].items()),
                "score": None if any(v is None for v in values) else sum(values) / len(values),
                "sets": recomputed,
            }
        return rows, None
    except Rejected as reason:
        return None, shown(str(reason))
    except Exception as err:  # a board must survive whatever a stranger uploads
        return None, shown(f"unreadable submission ({type(err).__name__}: {err})")


def _same_source(doc, set_name, official):
    """Whether the method was tuned on an OOD source of the set: derived from its tuning provenance and the
    benchmark's record of the set's OOD sources, never taken from the submission's own flag (benchmarks written
    before they recorded sources: the flag, or the provenance, whichever says so)."""
    tuning = (doc["method"].get("params") or {}).get("tuning") if isinstance(doc["method"].get("params"), dict) else None
    tuned_on = set((((tuning or {}).get("set") or {}).get("ood_sources") or []) if isinstance(tuning, dict) else [])
    if "ood_sources" in official:
        return bool(tuned_on & set(official["ood_sources"]))
    return bool(doc["sets"][set_name]["same_source_tuning"]) or bool(tuned_on)


def _content_hash(files):
    """The first 12 hex digits of the sha256 of a submission's members (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    return digest.hexdigest()[:12]


def shown(text):
    """A submitted string made safe to show anywhere: control, format (bidi, zero-width) and other non-printing
    characters become U+FFFD, so nothing can retitle or clear a terminal or reorder a line."""
    return "".join("\ufffd" if unicodedata.category(ch).startswith("C") else ch for ch in str(text))


def benchmark_grid(benchmark):
    """The threshold grid every submission to ``benchmark`` must use (benchmark files before the float-order
    grid name the linear grid's num_thresholds and score_range)."""
    if "grid" in benchmark:
        return benchmark["grid"]
    return grid_spec(benchmark["num_thresholds"], benchmark["score_range"])


def _check_state_config(set_name, state, grid):
    """The grid must be the benchmark's and the counts int64 of the right shape, before anything is built."""
    try:
        if grid["kind"] == "linear":
            mine = {"kind": "linear", "num_thresholds": int(state["num_thresholds"]),
                    "score_range": [float(v) for v in state["score_range"]]}
            shape = (2, mine["num_thresholds"])
            counts = state["hist"]
        else:
            mine = {"kind": "float", "mantissa_bits": int(state["mantissa_bits"])}
            counts = state["counts"]
            shape = (len(state["binades"]), 2, 1 << min(mine["mantissa_bits"], 30))
    except (TypeError, ValueError, KeyError):
        raise Rejected(f"set {set_name!r}: unreadable grid settings in the accumulator state") from None
    if mine != grid:
        raise Rejected(f"set {set_name!r}: binned on {describe_grid(mine)}; the benchmark asks for "
                       f"{describe_grid(grid)}")
    if counts.dtype != np.int64 or counts.shape != shape:
        raise Rejected(f"set {set_name!r}: counts must be int64 of shape {shape}")


def _check(set_name, acc, claims, pixels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        result = acc.compute()
    counts = {"n_id": result["n_id"], "n_ood": result["n_ood"], "n_ignored": int(acc.n_ignored)}
    expected = {"n_id": pixels["id"], "n_ood": pixels["ood"], "n_ignored": pixels["ignore"]}
    if counts != expected:
        raise Rejected(f"set {set_name!r}: counts {counts} do not match the set's pixels {expected}")
    for key in counts:
        if claims[key] != counts[key]:
            raise Rejected(f"set {set_name!r}: claimed {key} {claims[key]} but the state holds {counts[key]}")
    values = {}
    for metric in METRICS:
        value = None if math.isnan(result[metric]) else float(result[metric])
        claimed = claims.get(metric)
        if (value is None) != (claimed is None) or (value is not None and abs(value - claimed) > TOLERANCE):
            raise Rejected(f"set {set_name!r}: claimed {metric} {claimed} but the counts give {value}")
        values[metric] = value
    return values


def leaderboard(submissions_dir, benchmark_path, out_dir, limits=Limits()):
    """Judge every zip / folder in ``submissions_dir``; write the board; returns its JSON document."""
    benchmark = json.loads(Path(benchmark_path).read_text())
    if benchmark.get("schema") != BENCHMARK_SCHEMA or "tracks" not in benchmark \
            or not ({"grid"} <= set(benchmark) or {"num_thresholds", "score_range"} <= set(benchmark)):
        raise ValueError(f"{benchmark_path} is not a segood benchmark file (schema {BENCHMARK_SCHEMA!r}); write one "
                         "with segood benchmark")
    tracks = {track: [] for track in benchmark["tracks"]}
    rejected = []
    for path in sorted(Path(submissions_dir).iterdir()):
        rows, reason = judge(path, benchmark, limits)
        if reason:
            rejected.append({"file": shown(path.name), "reason": reason})
            continue
        for track, row in rows.items():
            tracks[track].append(row)
    for track, rows in tracks.items():
        metric = benchmark["tracks"][track]["rank_by"]
        sign = -1 if METRICS[metric].higher_is_better else 1
        rows.sort(key=lambda r: (r["score"] is None, sign * (r["score"] or 0.0), r["name"]))
    doc = {"schema": "segood.leaderboard/1", "tracks": {
        t: {"rank_by": benchmark["tracks"][t]["rank_by"], "sets": list(benchmark["tracks"][t]["sets"]), "entries": rows}
        for t, rows in tracks.items()}, "rejected": rejected}
    out_dir = Path(out_dir)
    write_json(out_dir / "leaderboard.json", doc)
    atomic_write_text(out_dir / "leaderboard.md", board_markdown(doc))
    atomic_write_text(out_dir / "index.html", board_html(doc))
    return doc


def _flags(row):
    return ("OOD data used; " if row["uses_ood_data"] else "") + ("same-source tuning" if row["same_source_tuning"] else "")


def board_markdown(doc):
    lines = ["# Leaderboard", ""]
    for track, t in doc["tracks"].items():
        metric = t["rank_by"]
        lines += [f"## {track} — ranked by mean {metric} over {', '.join(t['sets'])}", "",
                  "| rank | method | score | " + " | ".join(t["sets"]) + " | notes | file (sha256) |",
                  "|---:|---|---:|" + "---:|" * len(t["sets"]) + "---|---|"]
        for k, row in enumerate(t["entries"], 1):
            cells = " | ".join(_fmt(row["sets"][s][metric]) for s in t["sets"])
            lines.append(f"| {k} | {_md(row['name'])} | {_fmt(row['score'])} | {cells} | {_md(_flags(row))} | "
                         f"{_md(row['file'])} ({row['sha256']}) |")
        lines.append("")
    if doc["rejected"]:
        lines += ["## Rejected", "", "| file | reason |", "|---|---|"]
        lines += [f"| {_md(r['file'])} | {_md(r['reason'])} |" for r in doc["rejected"]]
    return "\n".join(lines) + "\n"


def board_html(doc):
    """A self-contained page (no external assets); every submitted string is escaped; columns sort on click."""
    esc = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>segood leaderboard</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}",
             "td,th{border:1px solid #ccc;padding:4px 8px}th{cursor:pointer;background:#eee}</style></head><body>",
             "<h1>segood leaderboard</h1>"]
    for track, t in doc["tracks"].items():
        metric = t["rank_by"]
        parts.append(f"<h2>{esc(track)} — ranked by mean {esc(metric)}</h2><table class='sortable'><thead><tr>"
                     + "".join(f"<th>{esc(h)}</th>" for h in ["rank", "method", "score", *t["sets"], "notes",
                                                              "file (sha256)"])
                     + "</tr></thead><tbody>")
        for k, row in enumerate(t["entries"], 1):
            cells = [str(k), row["name"], _fmt(row["score"]), *(_fmt(row["sets"][s][metric]) for s in t["sets"]),
                     _flags(row), f"{row['file']} ({row['sha256']})"]
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
        parts.append("</tbody></table>")
    if doc["rejected"]:
        parts.append("<h2>Rejected</h2><table><thead><tr><th>file</th><th>reason</th></tr></thead><tbody>")
        parts += [f"<tr><td>{esc(r['file'])}</td><td>{esc(r['reason'])}</td></tr>" for r in doc["rejected"]]
        parts.append("</tbody></table>")
    parts.append("""<script>
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
  const key = r => { const t = r.cells[col].textContent, n = parseFloat(t); return isNaN(n) ? t : n; };
  const up = th.dataset.up !== '1'; th.dataset.up = up ? '1' : '0';
  rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1));
  rows.forEach(r => body.appendChild(r));
}));
</script></body></html>""")
    return "".join(parts) + "\n"


def _fmt(value):
    return "–" if value is None else f"{value:.4f}"


def _md(text):
    """Markdown-safe: HTML escaped and every character with a Markdown meaning backslash-escaped (no live links)."""
    text = html.escape(shown(text))
    for ch in "\\`*_[]()!#|~":
        text = text.replace(ch, "\\" + ch)
    return text
