"""Type-approval checks: requirements (a YAML file) evaluated on a robustness run into a pass/fail table.

The file lists requirements, each a comparison and the cells it covers, e.g. the seed's acceptance criteria
("AUROC >= 0.90 and mIoU >= 0.60 for every corruption up to severity 3")::

    requirements:
      - require: auroc >= 0.90        # an OOD metric (AUROC, AUPRC, FPR95, MaxIoU): every method, or `methods`
        up_to_severity: 3
      - require: miou >= 0.60         # a segmentation metric: miou, accuracy, ece, brier
        up_to_severity: 3
      - require: auroc >= 0.75
        question: corruption_as_ood   # (b): are corrupted frames flagged? (default (a): corrupted_id)
        corruptions: [fog, night]     # default: every corruption of the run
        methods: [entropy]
        sets: [sun]                   # default: every set of the run

A cell is one (set, corruption, severity[, method]) of the run's results.json: ``up_to_severity`` covers the run's
levels up to it, ``severities`` names levels the run must have. A value that is undefined there (e.g. AUROC on a
set without OOD pixels) fails, since nothing was shown.
"""

import re

import yaml

from segood.metrics import METRICS

SEGMENTATION_METRICS = {"miou": True, "accuracy": True, "ece": False, "brier": False}  # name: higher is better
QUESTIONS = ("corrupted_id", "corruption_as_ood")
_FIELDS = {"require", "up_to_severity", "severities", "corruptions", "methods", "sets", "question", "name"}
_COMPARISON = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")
_OPERATORS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def load_requirements(path):
    """The checked requirements of a YAML file (see the module docstring)."""
    try:
        doc = yaml.safe_load(open(path, encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not a readable YAML file of requirements ({err})") from None
    return parse_requirements(doc, source=str(path))


def parse_requirements(doc, source="requirements"):
    """[{"name", "metric", "op", "value", "question", "severities", "corruptions", "methods", "sets"}] from the
    YAML document ``doc``; a ValueError says which requirement is wrong and how."""
    items = doc.get("requirements") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{source}: expected 'requirements:' with a list of requirements, e.g. "
                         "[{require: 'auroc >= 0.90', up_to_severity: 3}]")
    parsed = []
    for k, item in enumerate(items, 1):
        where = f"{source}: requirement {k}"
        if not isinstance(item, dict) or "require" not in item:
            raise ValueError(f"{where}: each requirement needs 'require: METRIC >= VALUE' (or <=, >, <)")
        unknown = set(item) - _FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
        match = _COMPARISON.match(str(item["require"]))
        if not match:
            raise ValueError(f"{where}: cannot read {item['require']!r}; write e.g. 'auroc >= 0.90'")
        metric, op, value = match.group(1), match.group(2), float(match.group(3))
        if metric not in METRICS and metric not in SEGMENTATION_METRICS:
            raise ValueError(f"{where}: unknown metric {metric!r}; choose from {', '.join([*METRICS, *SEGMENTATION_METRICS])}")
        question = item.get("question", "corrupted_id")
        if question not in QUESTIONS:
            raise ValueError(f"{where}: question must be one of {QUESTIONS}, got {question!r}")
        if metric in SEGMENTATION_METRICS and (question != "corrupted_id" or "methods" in item):
            raise ValueError(f"{where}: {metric} is the network's, per corrupted set: it takes no methods and no "
                             "question")
        if "severities" in item and "up_to_severity" in item:
            raise ValueError(f"{where}: give severities or up_to_severity, not both")
        severities, up_to = item.get("severities"), item.get("up_to_severity", 5)
        if not (isinstance(severities, list) and severities or severities is None) or not all(
                type(v) is int and 1 <= v <= 5 for v in [*(severities or []), up_to]):
            raise ValueError(f"{where}: severities must be a list of levels 1-5 and up_to_severity a level, got "
                             f"{severities!r} and {up_to!r}")
        lists = {key: item.get(key) for key in ("corruptions", "methods", "sets")}
        for key, names in lists.items():
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"{where}: {key} must be a list of names, got {names!r}")
        scope = f"severities {severities}" if severities else f"severity <= {up_to}"
        extra = " (corruption as OOD)" if question == "corruption_as_ood" else ""
        parsed.append({"name": str(item.get("name") or f"{metric} {op} {value:g}{extra}, {scope}"),
                       "metric": metric, "op": op, "value": value, "question": question, "severities": severities,
                       "up_to_severity": up_to, **lists})
    return parsed


def check_requirements(doc, requirements):
    """Evaluate ``requirements`` (:func:`parse_requirements`) on a robustness results document.

    Returns {"passed": bool, "requirements": [{"name", "passed", "cells", "failing": [{"set", "corruption",
    "severity", "method", "value"}]}]}; names in a requirement that the run lacks are a ValueError."""
    rows = []
    run = doc["robustness"]
    for req in requirements:
        sets = req["sets"] or list(doc["corrupted"])
        corruptions = req["corruptions"] or run["corruptions"]
        segmentation = req["metric"] in SEGMENTATION_METRICS
        methods = [None] if segmentation else (req["methods"] or list(doc["methods"]))
        levels = req["severities"] or [v for v in run["severities"] if v <= req["up_to_severity"]]
        if not levels:
            raise ValueError(f"requirement {req['name']!r} covers no severity of the run ({run['severities']})")
        for kind, names, have in (("sets", sets, doc["corrupted"]), ("corruptions", corruptions, run["corruptions"]),
                                  ("severities", levels, run["severities"]),
                                  ("methods", [] if segmentation else methods, doc["methods"])):
            missing = [n for n in names if n not in have]
            if missing:
                raise ValueError(f"requirement {req['name']!r}: the run has no {kind} {missing} (it has "
                                 f"{list(have)}); rerun with them or narrow the requirement")
        failing, cells = [], 0
        for s in sets:
            for c in corruptions:
                for level in levels:
                    cell = doc["corrupted"][s][c][str(level)]
                    for m in methods:
                        if segmentation:
                            value = cell["segmentation"][req["metric"]]
                        else:
                            key = "ood" if req["question"] == "corrupted_id" else "as_ood"
                            value = cell[key][m][req["metric"]]
                        cells += 1
                        if value is None or not _OPERATORS[req["op"]](value, req["value"]):
                            failing.append({"set": s, "corruption": c, "severity": level, "method": m,
                                            "value": value})
        rows.append({"name": req["name"], "passed": not failing, "cells": cells, "failing": failing})
    return {"passed": all(r["passed"] for r in rows), "requirements": rows}


def approval_markdown(result, *, shown=8):
    """The pass/fail table: one row per requirement, its failing cells named (the first ``shown`` of them)."""
    lines = [f"## Type approval: {'PASS' if result['passed'] else 'FAIL'}", "",
             "| requirement | cells | result | failing cells |", "|---|---:|---|---|"]
    for row in result["requirements"]:
        named = [f"{f['corruption']} {f['severity']}" + (f" / {f['method']}" if f["method"] else "")
                 + f" / {f['set']}: " + ("undefined" if f["value"] is None else f"{f['value']:.3f}")
                 for f in row["failing"][:shown]]
        if len(row["failing"]) > shown:
            named.append(f"and {len(row['failing']) - shown} more")
        lines.append(f"| {row['name']} | {row['cells']} | {'pass' if row['passed'] else '**FAIL**'} | "
                     f"{'; '.join(named) or '–'} |")
    return "\n".join(lines) + "\n"
