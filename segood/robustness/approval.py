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

import math
import re

import yaml

from segood.metrics import METRICS

SEGMENTATION_METRICS = {"miou": True, "accuracy": True, "ece": False, "brier": False}  # name: higher is better
QUESTIONS = ("corrupted_id", "corruption_as_ood")
_FIELDS = {"require", "up_to_severity", "severities", "corruptions", "methods", "sets", "question", "name"}
_COMPARISON = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")
_OPERATORS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


MAX_BYTES = 64 << 10  # a requirements file is a few lines
MAX_ALIASES = 100
MAX_VALUES = 10_000  # scalars, lists and mappings of the document, every alias counted as often as it is used


def load_requirements(path):
    """The checked requirements of a YAML file (see the module docstring), parsed safely: at most
    :data:`MAX_BYTES`, no tags, no repeated keys, at most :data:`MAX_ALIASES` aliases and :data:`MAX_VALUES`
    values once the aliases are expanded. A ValueError names the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ValueError(f"{path}: more than {MAX_BYTES} bytes; a requirements file is a short list")
        doc = yaml.load(data.decode("utf-8"), Loader=_RequirementsLoader)  # noqa: S506 - a SafeLoader, bounded
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not a readable YAML file of requirements ({err})") from None
    except _Refused as err:
        raise ValueError(f"{path}: {err}") from None
    if _count(doc) > MAX_VALUES:
        raise ValueError(f"{path}: its aliases expand to more than {MAX_VALUES} values; write the requirements out")
    return parse_requirements(doc, source=str(path))


class _Refused(Exception):
    """What the requirements loader refuses (tags, repeated keys, too many aliases)."""


class _RequirementsLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader without tags or repeated keys, with a bounded number of aliases."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _Refused(f"more than {MAX_ALIASES} aliases (*name); write the requirements out")
        elif getattr(event, "tag", None) is not None:
            raise _Refused(f"line {event.start_mark.line + 1}: tag {event.tag!r}; requirements take plain values, "
                           "without tags")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=True) for key, _ in node.value]
        repeated = sorted({str(k) for k in keys if keys.count(k) > 1})
        if repeated:
            raise _Refused(f"line {node.start_mark.line + 1}: the keys {repeated} appear twice in one mapping; "
                           "which one counts would be undefined, so give each once")
        return super().construct_mapping(node, deep=deep)


def _count(value, budget=MAX_VALUES + 1):
    """The number of values in ``value`` (shared ones counted each time), stopping once over ``budget``."""
    seen, stack = 0, [value]
    while stack and seen <= budget:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return seen


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
            raise ValueError(f"{where}: unknown fields {sorted(map(str, unknown))}; allowed: {sorted(_FIELDS)}")
        match = _COMPARISON.match(str(item["require"]))
        if not match:
            raise ValueError(f"{where}: cannot read {item['require']!r}; write e.g. 'auroc >= 0.90'")
        try:
            metric, op, value = match.group(1), match.group(2), float(match.group(3))
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f"{where}: the bound {match.group(3)} is not a finite number; write e.g. 'auroc >= 0.90'")
        if "name" in item and not (isinstance(item["name"], str) and 0 < len(item["name"]) <= 200):
            raise ValueError(f"{where}: name must be a text of 1-200 characters")
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
        if not (_listed(severities) or severities is None) or not all(
                type(v) is int and 1 <= v <= 5 for v in [*(severities or []), up_to]):
            raise ValueError(f"{where}: severities must be a list of distinct levels 1-5 and up_to_severity a level, "
                             f"got {severities!r} and {up_to!r}")
        lists = {key: item.get(key) for key in ("corruptions", "methods", "sets")}
        for key, names in lists.items():
            if names is not None and not (_listed(names) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"{where}: {key} must be a list of distinct names (leave it out for all of the "
                                 f"run's), got {names!r}")
        scope = f"severities {severities}" if severities else f"severity <= {up_to}"
        extra = " (corruption as OOD)" if question == "corruption_as_ood" else ""
        parsed.append({"name": str(item.get("name") or f"{metric} {op} {value:g}{extra}, {scope}"),
                       "metric": metric, "op": op, "value": value, "question": question, "severities": severities,
                       "up_to_severity": up_to, **lists})
    return parsed


def _listed(values):
    """Whether ``values`` is a non-empty list without repeats (an empty list would silently mean all of the run's;
    a repeat, a cell counted twice)."""
    return isinstance(values, list) and bool(values) and len(set(map(repr, values))) == len(values)


def covered(req, sets, corruptions, severities, methods):
    """(sets, corruptions, severities, methods) a requirement covers in a run of these (methods [None] for a
    segmentation metric); a ValueError naming what the run lacks (checked before a run, and after it)."""
    segmentation = req["metric"] in SEGMENTATION_METRICS
    wanted = (req["sets"] or sets, req["corruptions"] or corruptions,
              req["severities"] or [v for v in severities if v <= req["up_to_severity"]],
              [None] if segmentation else (req["methods"] or methods))
    if not wanted[2]:
        raise ValueError(f"requirement {req['name']!r} covers no severity of the run ({severities})")
    for kind, names, have in zip(("sets", "corruptions", "severities", "methods"), wanted,
                                 (sets, corruptions, severities, methods)):
        missing = [n for n in names if n not in have and n is not None]
        if missing:
            raise ValueError(f"requirement {req['name']!r}: the run has no {kind} {missing} (it has "
                             f"{list(have)}); rerun with them or narrow the requirement")
    return wanted


def check_requirements(doc, requirements):
    """Evaluate ``requirements`` (:func:`parse_requirements`) on a robustness results document.

    Returns {"passed": bool, "requirements": [{"name", "passed", "cells", "failing": [{"set", "corruption",
    "severity", "method", "value"}]}]}; names in a requirement that the run lacks are a ValueError."""
    rows = []
    run = doc["robustness"]
    for req in requirements:
        sets, corruptions, levels, methods = covered(req, list(doc["corrupted"]), run["corruptions"],
                                                     run["severities"], list(doc["methods"]))
        segmentation = req["metric"] in SEGMENTATION_METRICS
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
                 + f" / {f['set']}: " + ("undefined" if f["value"] is None else f"{f['value']:.6g}")
                 for f in row["failing"][:shown]]
        if len(row["failing"]) > shown:
            named.append(f"and {len(row['failing']) - shown} more")
        lines.append(f"| {row['name']} | {row['cells']} | {'pass' if row['passed'] else '**FAIL**'} | "
                     f"{'; '.join(named) or '–'} |")
    return "\n".join(lines) + "\n"
