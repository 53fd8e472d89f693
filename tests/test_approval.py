"""Type-approval checks on a hand-made robustness result."""

import pytest

from segood.robustness.approval import approval_markdown, check_requirements, load_requirements, parse_requirements


def cell(auroc_a, auroc_b, miou, ece=0.05):
    return {"ood": {"entropy": {"auroc": auroc_a, "fpr95": 0.2}, "max_softmax": {"auroc": auroc_a - 0.01, "fpr95": 0.3}},
            "as_ood": {"entropy": {"auroc": auroc_b}, "max_softmax": {"auroc": auroc_b}},
            "segmentation": {"miou": miou, "ece": ece, "brier": 0.2, "accuracy": 0.9}}


# AUROC falls with severity, fog faster; mIoU falls below 0.60 for fog from severity 3; one undefined value
RESULT = {
    "methods": {"entropy": {}, "max_softmax": {}},
    "robustness": {"corruptions": ["fog", "blur"], "severities": [1, 2, 3, 4, 5]},
    "corrupted": {"sun": {
        "fog": {str(s): cell(0.97 - 0.04 * s, 0.5 + 0.08 * s, 0.72 - 0.05 * s) for s in range(1, 6)},
        "blur": {str(s): cell(0.96 - 0.01 * s, 0.5 + 0.02 * s, 0.70 - 0.01 * s) for s in range(1, 6)}}},
}
RESULT["corrupted"]["sun"]["blur"]["2"]["ood"]["entropy"]["auroc"] = None


def test_the_seeds_criteria_name_the_failing_cells():
    requirements = parse_requirements({"requirements": [{"require": "auroc >= 0.90", "up_to_severity": 3},
                                                        {"require": "miou >= 0.60", "up_to_severity": 3}]})
    result = check_requirements(RESULT, requirements)
    assert not result["passed"]
    auroc, miou = result["requirements"]
    # AUROC: fog 0.93 / 0.89 / 0.85 (entropy), 0.92 / 0.88 / 0.84 (max_softmax); blur fine but entropy's undefined
    assert auroc["cells"] == 2 * 3 * 2 and not auroc["passed"]
    assert {(f["corruption"], f["severity"], f["method"]) for f in auroc["failing"]} == {
        ("fog", 2, "entropy"), ("fog", 3, "entropy"), ("fog", 2, "max_softmax"), ("fog", 3, "max_softmax"),
        ("blur", 2, "entropy")}
    # mIoU: fog 0.67 / 0.62 / 0.57: only fog 3 fails
    assert miou["cells"] == 6 and [(f["corruption"], f["severity"], f["method"]) for f in miou["failing"]] == [
        ("fog", 3, None)]
    assert miou["failing"][0]["value"] == pytest.approx(0.57)
    md = approval_markdown(result)
    assert "## Type approval: FAIL" in md
    assert "| miou >= 0.6, severity <= 3 | 6 | **FAIL** | fog 3 / sun: 0.57 |" in md  # (6 significant digits:
    # a value just under its bound, 0.74294 against 0.743, read 0.743 FAIL at 3 decimals)
    assert "blur 2 / entropy / sun: undefined" in md


def test_passing_requirements_and_the_corruption_as_ood_question(tmp_path):
    path = tmp_path / "req.yaml"
    path.write_text("requirements:\n"
                    "  - require: auroc >= 0.60\n    question: corruption_as_ood\n    severities: [3, 4, 5]\n"
                    "    corruptions: [fog]\n"
                    "  - name: calibrated\n    require: ece <= 0.1\n"
                    "  - require: fpr95 < 0.35\n    methods: [max_softmax]\n    corruptions: [blur]\n")
    result = check_requirements(RESULT, load_requirements(path))
    assert result["passed"] and [r["cells"] for r in result["requirements"]] == [3 * 2, 10, 5]
    assert "## Type approval: PASS" in approval_markdown(result) and "| calibrated | 10 | pass | – |" in \
        approval_markdown(result)
    failing = check_requirements(RESULT, parse_requirements(
        {"requirements": [{"require": "auroc > 0.80", "question": "corruption_as_ood", "corruptions": ["fog"]}]}))
    # fog as OOD: AUROC 0.58, 0.66, 0.74, 0.82, 0.90 for both methods
    assert [f["severity"] for f in failing["requirements"][0]["failing"]] == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("doc, message", [
    ({"requirements": [{"require": "auroc = 0.9"}]}, "cannot read 'auroc = 0.9'"),
    ({"requirements": [{"require": "iou >= 0.9"}]}, "unknown metric 'iou'"),
    ({"requirements": [{"require": "miou >= 0.6", "methods": ["entropy"]}]}, "takes no methods"),
    ({"requirements": [{"require": "auroc >= 0.9", "question": "what"}]}, "question must be one of"),
    ({"requirements": [{"require": "auroc >= 0.9", "severity": 3}]}, "unknown fields \\['severity'\\]"),
    ({"requirements": [{"require": "auroc >= 0.9", "severities": [0, 6]}]}, "a list of distinct levels 1-5"),
    ({"requirements": [{"require": "auroc >= 0.9", "severities": [3, 3]}]}, "a list of distinct levels 1-5"),
    ({"requirements": [{"require": "auroc >= 0.9", "severities": [0]}]}, "a list of distinct levels 1-5"),
    ({"requirements": [{"require": "auroc >= 0.9", "severities": [6]}]}, "a list of distinct levels 1-5"),
    ({"requirements": [{"require": "auroc >= 0.9", "up_to_severity": 0}]}, "up_to_severity a level"),
    ({"requirements": [{"require": "auroc >= 0.9", "up_to_severity": 6}]}, "up_to_severity a level"),
    ({"requirements": [{"require": "auroc >= 0.9", "methods": []}]}, "methods must be a list of distinct names"),
    ({"requirements": [{"require": "auroc >= 0.9", "corruptions": ["fog", "fog"]}]}, "must be a list of distinct"),
    ({"requirements": [{"require": "auroc >= 0.9", None: 1, "foo": 2}]}, r"unknown fields \['None', 'foo'\]"),
    ({"require": "auroc >= 0.9"}, "expected 'requirements:'"),
])
def test_bad_requirements_are_clear_errors(doc, message):
    with pytest.raises(ValueError, match=message):
        parse_requirements(doc)


@pytest.mark.parametrize("require, passed", [
    ("auroc >= 0.75", True), ("auroc > 0.75", False), ("fpr95 <= 0.25", True), ("fpr95 < 0.25", False),
    ("auroc >= 0.75000001", False), ("fpr95 <= 0.24999999", False), ("auroc > 0.74999999", True),
    ("fpr95 < 0.25000001", True)])
def test_a_value_on_its_bound_passes_the_inclusive_comparisons_only(require, passed):
    """AUROC 0.75 and FPR95 0.25 exactly (both exact in binary): >= and <= include the bound, > and < do not."""
    on_bound = {"methods": {"entropy": {}}, "robustness": {"corruptions": ["fog"], "severities": [1]},
                "corrupted": {"sun": {"fog": {"1": {"ood": {"entropy": {"auroc": 0.75, "fpr95": 0.25}}}}}}}
    [row] = check_requirements(on_bound, parse_requirements({"requirements": [{"require": require}]}))["requirements"]
    assert row["cells"] == 1 and row["passed"] is passed


def test_names_the_run_lacks_are_errors():
    with pytest.raises(ValueError, match=r"the run has no severities \[2\]"):  # (not a KeyError deep in the cells)
        check_requirements({"methods": {"entropy": {}}, "robustness": {"corruptions": ["fog"], "severities": [1, 3]},
                            "corrupted": {"sun": {"fog": {"1": cell(0.9, 0.5, 0.7), "3": cell(0.9, 0.5, 0.7)}}}},
                           parse_requirements({"requirements": [{"require": "miou >= 0.5", "severities": [2]}]}))
    with pytest.raises(ValueError, match=r"the run has no corruptions \['snow'\]"):
        check_requirements(RESULT, parse_requirements({"requirements": [{"require": "miou >= 0.5",
                                                                         "corruptions": ["snow"]}]}))
    with pytest.raises(ValueError, match=r"the run has no methods \['odin'\]"):
        check_requirements(RESULT, parse_requirements({"requirements": [{"require": "auroc >= 0.5",
                                                                         "methods": ["odin"]}]}))


ALIAS_BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]",
                        *(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 7)),
                        "requirements:", "  - require: auroc >= 0.9", "    name: *a6"]) + "\n"

HOSTILE = {
    "alias bomb": (ALIAS_BOMB, "aliases expand to more than"),
    "many aliases": ("a: &a x\nb: [" + ", ".join(["*a"] * 200) + "]\nrequirements: [{require: auroc >= 0.9}]\n",
                     "more than 100 aliases"),
    "a tag": ("requirements:\n  - require: !!python/name:os.system auroc >= 0.9\n", "without tags"),
    "a core tag": ("requirements:\n  - require: !!str auroc >= 0.9\n", "without tags"),
    "repeated key": ("requirements:\n  - require: auroc >= 0.9\n    require: auroc >= 0.1\n", "appear twice"),
    "an infinite bound": ("requirements:\n  - require: auroc >= -1e999\n", "not a finite number"),
    "a huge file": ("requirements:\n  - require: auroc >= 0.9\n" + "#" * (70 << 10) + "\n", "more than 65536 bytes"),
    "a name that is a list": ("requirements:\n  - require: auroc >= 0.9\n    name: [a, b]\n", "name must be a text"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_requirement_files_are_refused_with_their_reason(tmp_path, case):
    text, reason = HOSTILE[case]
    path = tmp_path / "req.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=reason) as err:
        load_requirements(path)
    assert str(path) in str(err.value)


def test_a_file_of_exactly_the_byte_limit_reads(tmp_path):
    from segood.robustness.approval import MAX_BYTES

    head = "requirements:\n  - require: auroc >= 0.9\n"
    path = tmp_path / "req.yaml"
    path.write_text(head + "#" * (MAX_BYTES - len(head) - 1) + "\n")
    assert path.stat().st_size == MAX_BYTES == 65536
    assert [r["metric"] for r in load_requirements(path)] == ["auroc"]


def test_a_plain_requirement_file_still_reads(tmp_path):
    path = tmp_path / "req.yaml"
    path.write_text("limits: &strict {up_to_severity: 3}\nrequirements:\n  - require: auroc >= 0.9\n"
                    "    up_to_severity: 3\n    name: 'AUROC, the seed criterion'\n")
    [req] = load_requirements(path)
    assert req["name"] == "AUROC, the seed criterion" and req["value"] == 0.9 and req["up_to_severity"] == 3


def test_approve_refuses_a_run_that_is_not_a_robustness_run(tmp_path, capsys):
    import json

    from segood.cli import main

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"model": {}, "sets": {}, "methods": {}, "config": {}}))
    (tmp_path / "req.yaml").write_text("requirements:\n  - require: auroc >= 0.9\n")
    assert main(["approve", str(tmp_path / "run"), str(tmp_path / "req.yaml")]) == 2
    assert "is not a run of segood robustness" in capsys.readouterr().err
    assert main(["approve", str(tmp_path / "nothing"), str(tmp_path / "req.yaml")]) == 2  # (no run at all)
    assert "is not a run of segood robustness (no run.json naming corruptions); approve checks robustness runs" in \
        capsys.readouterr().err
