"""``segood robustness`` end to end on a tiny generated set and a tiny real network, against direct computations."""

import json
import shutil

import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset
from segood.evaluation import evaluate
from segood.methods import get_method
from segood.metrics import METRIC_NAMES, exact_metrics, make_accumulator
from segood.metrics.calibration import CalibrationAccumulator
from segood.metrics.segmentation import confusion_matrix, mean_iou
from segood.models import build_model, preprocess, save_checkpoint
from segood.robustness import CorruptedSet
from segood.robustness.suite import corruption_as_ood, robustness, write_robustness_report

from networks import tiny_network
from rawtrees import killed_after

METHODS = ["max_softmax", "entropy"]
OPTIONS = {"corruptions": ["fog", "rotation"], "severities": [1, 3], "seed": 4, "batch_size": 1, "progress": False}


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets(kinds=("perlin",), noise_frames=2, cityscapes_frames=2)


@pytest.fixture(scope="module")
def whole(sets, tmp_path_factory):
    out = tmp_path_factory.mktemp("robustness_run") / "run"
    requirements = out.parent / "req.yaml"
    requirements.write_text("requirements:\n  - require: auroc >= 0.0\n    up_to_severity: 3\n"
                            "  - require: miou >= 0.99\n    corruptions: [fog]\n")
    return out, robustness(tiny_network(), [sets / "perlin_mixed.h5"], METHODS, out, requirements=requirements,
                           **OPTIONS)


def direct(net, dataset):
    """The reference, frame by frame: each method's accumulator, the confusion matrix, the calibration, and the
    scores and labels themselves."""
    accs = {m: make_accumulator() for m in METHODS}
    confusion, calibration, frames = np.zeros((19, 19), np.int64), CalibrationAccumulator(), []
    for i in range(len(dataset)):
        item = dataset[i]
        x = preprocess(item["image"][None])
        with torch.no_grad():
            logits = net(x).logits
        scores = {m: get_method(m).score(net, x)[0] for m in METHODS}
        for m in METHODS:
            accs[m].update(scores[m], item["ood_mask"][None])
        confusion += confusion_matrix(logits.argmax(1)[0].numpy(), item["semantic"].numpy(), 19)
        calibration.update(torch.softmax(logits, 1), item["semantic"][None])
        frames.append((scores, item["ood_mask"].numpy()))
    return accs, confusion, calibration, frames


def test_every_cell_equals_a_direct_computation(sets, whole):
    out, doc = whole
    net = tiny_network()
    clean = H5SegmentationDataset(sets / "perlin_mixed.h5")
    ref_clean = direct(net, clean)
    for corruption in ("fog", "rotation"):
        for level in (1, 3):
            accs, confusion, calibration, frames = direct(net, CorruptedSet(clean, corruption, level, seed=4))
            cell = doc["corrupted"]["perlin_mixed"][corruption][str(level)]
            for m in METHODS:  # (a): the corrupted set's own OOD and ID pixels
                reference = accs[m].compute()
                for metric in METRIC_NAMES:
                    assert cell["ood"][m][metric] == pytest.approx(reference[metric], abs=1e-12)
                # (b): clean ID pixels negative, corrupted ID pixels positive, straight from the pixels
                scores = np.concatenate([f[0][m].numpy().ravel() for f in ref_clean[3]]
                                        + [f[0][m].numpy().ravel() for f in frames])
                labels = np.concatenate([np.where(f[1] == 0, 0, 255).ravel() for f in ref_clean[3]]
                                        + [np.where(f[1] == 0, 1, 255).ravel() for f in frames]).astype(np.uint8)
                pooled = make_accumulator().update(scores, labels).compute()
                for metric in METRIC_NAMES:
                    assert cell["as_ood"][m][metric] == pytest.approx(pooled[metric], abs=1e-12)
                exact = exact_metrics(scores[labels != 255], labels[labels != 255])
                assert cell["as_ood"][m]["auroc"] == pytest.approx(exact["auroc"], abs=2e-3)
            assert cell["segmentation"]["miou"] == pytest.approx(mean_iou(confusion)[0], abs=1e-12)
            assert cell["segmentation"]["ece"] == pytest.approx(calibration.compute()["ece"], abs=1e-9)
            assert cell["segmentation"]["brier"] == pytest.approx(calibration.compute()["brier"], abs=1e-9)
    # the clean set is what segood evaluate reports
    plain = evaluate(tiny_network(), [sets / "perlin_mixed.h5"], METHODS, out.parent / "plain", batch_size=1,
                     progress=False, figures=False)
    for m in METHODS:
        for metric in METRIC_NAMES:
            assert doc["clean"]["perlin_mixed"]["ood"][m][metric] == plain["results"][m]["perlin_mixed"]["pooled"][metric]


def test_report_files_figures_and_approval(whole):
    out, doc = whole
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema"] == "segood.robustness/1" and saved["robustness"]["severities"] == [1, 3]
    assert saved["config"]["robustness"]["levels"]["fog"] == {"f": [0.3, 0.4, 0.5, 0.6, 0.7]}
    assert saved["approval"]["requirements"][0]["passed"] and not saved["approval"]["passed"]
    assert [(f["corruption"], f["severity"]) for f in saved["approval"]["requirements"][1]["failing"]] == [
        ("fog", 1), ("fog", 3)]
    md = (out / "results.md").read_text()
    assert "### Network: mIoU ↑" in md and "(b) corruption as OOD: AUROC ↑, mean over corruptions" in md
    assert "## Type approval: FAIL" in md and "| fog | f 0.3 |" in md
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {"ood_auroc_perlin_mixed.png", "ood_fpr95_perlin_mixed.png", "as_ood_auroc_perlin_mixed.png",
            "network_perlin_mixed.png", "examples_perlin_mixed_fog.png", "examples_perlin_mixed_rotation.png",
            "contact_sheet.png"} <= figures
    assert all((out / "figures" / f).stat().st_size > 5000 for f in figures)
    # the rotation corrupts the masks too: its invented corners are ignore, counted as such
    assert doc["corrupted"]["perlin_mixed"]["rotation"]["3"]["ood"]["entropy"]["n_id"] < \
        doc["clean"]["perlin_mixed"]["ood"]["entropy"]["n_id"]
    # rebuilt from the saved state alone; re-checked against other requirements
    (out / "results.json").unlink()
    assert main(["report", str(out)]) == 0 and json.loads((out / "results.json").read_text())["corrupted"] == \
        saved["corrupted"]
    passing = out.parent / "pass.yaml"
    passing.write_text("requirements:\n  - require: brier <= 2\n")
    assert main(["approve", str(out), str(passing)]) == 0
    assert main(["approve", str(out), str(out.parent / "req.yaml")]) == 1


def test_a_refused_requirement_file_changes_nothing_in_the_run(whole):
    from test_approval import ALIAS_BOMB

    out = whole[0]
    main(["report", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    bomb = out.parent / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert main(["approve", str(out), str(bomb)]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_resume_after_a_kill_equals_an_uninterrupted_run(sets, whole, tmp_path, monkeypatch, capsys):
    _, doc = whole
    net = tiny_network()
    original = net.forward
    monkeypatch.setattr(net, "forward", killed_after(net, 9))  # dies in the third of five sets
    with pytest.raises(KeyboardInterrupt):
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "killed", save_every=1, figures=False,
                   **OPTIONS)
    monkeypatch.setattr(net, "forward", original)
    (tmp_path / "req.yaml").write_text("requirements:\n  - require: auroc >= 0.0\n")
    assert main(["approve", str(tmp_path / "killed"), str(tmp_path / "req.yaml")]) == 2  # (it passed on part)
    assert "is an unfinished run" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "killed")]) == 0
    doc_killed = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert doc_killed["unfinished"] and "**The run is unfinished**" in (tmp_path / "killed" / "results.md").read_text()
    resumed = robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "killed", resume=True, figures=False,
                         **OPTIONS)
    assert "unfinished" not in resumed
    assert main(["approve", str(tmp_path / "killed"), str(tmp_path / "req.yaml")]) == 0
    assert main(["report", str(tmp_path / "killed")]) == 0  # (a rebuilt report dropped the verdict)
    assert json.loads((tmp_path / "killed" / "results.json").read_text())["approval"]["passed"]
    assert resumed["corrupted"] == doc["corrupted"] and resumed["clean"] == doc["clean"]
    assert resumed["timings"]["images"] == doc["timings"]["images"] == 4 * 5
    with pytest.raises(ValueError, match="holds a different run"):  # other corruptions: not this run's state
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "killed", resume=True,
                   **{**OPTIONS, "corruptions": ["blur"]})


def test_cli_and_clear_errors(sets, tmp_path):
    net = tiny_network()
    save_checkpoint(tmp_path / "m.pt", net)
    assert main(["robustness", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets / "perlin_mixed.h5"),
                 "--methods", "entropy", "--corruptions", "jpeg", "--severities", "5", "--out", str(tmp_path / "c"),
                 "--quiet"]) == 0
    doc = json.loads((tmp_path / "c/results.json").read_text())
    assert list(doc["corrupted"]["perlin_mixed"]) == ["jpeg"] and list(doc["corrupted"]["perlin_mixed"]["jpeg"]) == ["5"]
    assert main(["report", str(tmp_path / "c"), "--combine", str(tmp_path / "c")]) == 2  # (a bare KeyError)
    with pytest.raises(KeyError, match="unknown corruption 'smog'"):
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "e", corruptions=["smog"])
    with pytest.raises(ValueError, match="severity of fog must be one of"):
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "e", corruptions=["fog"], severities=[6])
    bad = tmp_path / "bad.yaml"
    bad.write_text("requirements:\n  - require: auroc = 1\n")
    with pytest.raises(ValueError, match="cannot read 'auroc = 1'"):  # before any frame is evaluated
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "e", requirements=bad)
    assert not (tmp_path / "e").exists()
    bad.write_text("requirements:\n  - require: auroc >= 0.5\n    corruptions: [snow]\n")
    with pytest.raises(ValueError, match=r"the run has no corruptions \['snow'\] \(it has \['fog'\]\)"):  # (before too)
        robustness(net, [sets / "perlin_mixed.h5"], METHODS, tmp_path / "e", corruptions=["fog"], requirements=bad)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("grid", [{"kind": "float", "mantissa_bits": 10},
                                  {"kind": "linear", "num_thresholds": 64, "score_range": [0.0, 1.0]},
                                  {"kind": "exact", "max_pixels": 1000}])
def test_corruption_as_ood_equals_relabelled_pixels(grid):
    rng = np.random.default_rng(0)
    clean_scores, corrupted_scores = rng.random((2, 50)), rng.random((2, 50)) * 0.5 + 0.4
    clean_labels, corrupted_labels = rng.choice([0, 1, 255], (2, 50)), rng.choice([0, 1, 255], (2, 50))
    clean = make_accumulator(grid, per_image=True).update(clean_scores, clean_labels.astype(np.uint8))
    corrupted = make_accumulator(grid, per_image=True).update(corrupted_scores, corrupted_labels.astype(np.uint8))
    reference = make_accumulator(grid).update(
        np.concatenate([clean_scores.ravel(), corrupted_scores.ravel()]),
        np.concatenate([np.where(clean_labels == 0, 0, 255).ravel(),
                        np.where(corrupted_labels == 0, 1, 255).ravel()]).astype(np.uint8))
    got = corruption_as_ood(clean, corrupted)
    assert (got.curve_counts()[1] == reference.curve_counts()[1]).all()
    assert got.compute()["auroc"] == reference.compute()["auroc"]


def test_the_standard_family_and_its_summary_against_a_reference_run(sets, tmp_path, capsys):
    net = tiny_network()
    save_checkpoint(tmp_path / "m.pt", net)
    common = ["robustness", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets / "perlin_mixed.h5"),
              "--methods", "entropy", "--severities", "1", "5", "--quiet"]
    assert main([*common, "--family", "standard", "--corruptions", "contrast", "c:zoom_blur",
                 "--out", str(tmp_path / "ref")]) == 0
    ref = json.loads((tmp_path / "ref/results.json").read_text())
    assert list(ref["corrupted"]["perlin_mixed"]) == ["c:contrast", "c:zoom_blur"]
    assert ref["config"]["robustness"]["standard_size"] == "fixed"
    assert ref["config"]["robustness"]["levels"]["c:contrast"] == {"factor": [0.4, 0.3, 0.2, 0.1, 0.05]}
    cells = ref["corrupted"]["perlin_mixed"]
    plain = ref["summary"]["perlin_mixed"]["standard"]
    miou = [cells[c][v]["segmentation"]["miou"] for c in cells for v in ("1", "5")]
    assert plain["network"]["miou"] == {"mean": pytest.approx(np.mean(miou)), "mce": None, "relative_mce": None}
    # a copy of the run as its reference: every corruption error is 1; the run itself is refused as its own
    shutil.copytree(tmp_path / "ref", tmp_path / "copy")
    for own in ("ref", "ref/results.json", "ref/../ref"):
        with pytest.raises(ValueError, match=rf"^the reference run {tmp_path / own} is this run's own folder: its mCE "
                                             "would compare the run with itself; name the finished robustness run "
                                             "of a reference model$"):
            write_robustness_report(tmp_path / "ref", figures=False, reference=tmp_path / own)
    doc = write_robustness_report(tmp_path / "ref", figures=False, reference=tmp_path / "copy")
    assert doc["summary"]["perlin_mixed"]["standard"]["network"]["miou"]["mce"] == pytest.approx(1.0)
    assert doc["summary"]["perlin_mixed"]["standard"]["ood"]["entropy"]["fpr95"]["mce"] == pytest.approx(1.0)
    assert "## Summary: mean over corruptions and severities" in (tmp_path / "ref/results.md").read_text()
    # another model against it: CE by hand from the two documents
    torch.manual_seed(1)
    save_checkpoint(tmp_path / "other.pt", build_model("pspnet", "resnet18", head="plain").eval())
    assert main([*common[:2], str(tmp_path / "other.pt"), *common[3:], "--family", "standard", "--corruptions",
                 "contrast", "zoom_blur", "--reference", str(tmp_path / "ref"), "--out", str(tmp_path / "other")]) == 0
    other = json.loads((tmp_path / "other/results.json").read_text())
    assert other["reference_run"] == str(tmp_path / "ref")

    def errors(d, c):
        return sum(1 - d["corrupted"]["perlin_mixed"][c][v]["segmentation"]["miou"] for v in ("1", "5"))

    expected = np.mean([errors(other, c) / errors(ref, c) for c in ("c:contrast", "c:zoom_blur")])
    assert other["summary"]["perlin_mixed"]["standard"]["network"]["miou"]["mce"] == pytest.approx(expected)
    assert main(["report", str(tmp_path / "other")]) == 0  # the rebuilt report keeps its reference
    assert json.loads((tmp_path / "other/results.json").read_text())["summary"] == other["summary"]
    assert main([*common, "--corruptions", "c:smog", "--out", str(tmp_path / "e")]) == 2
    assert "unknown corruption 'c:smog'; choose from noise" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is not the results of segood robustness"):
        write_robustness_report(tmp_path / "other", figures=False, reference=tmp_path / "ref/run.json")
    assert main([*common, "--reference", str(tmp_path / "e"), "--out", str(tmp_path / "e")]) == 2
    assert "is this run's own folder" in capsys.readouterr().err and not (tmp_path / "e").exists()
    # a reference of other frames (another seed, or another set under the same name) is refused before the run
    assert main([*common[:2], str(tmp_path / "other.pt"), *common[3:], "--family", "standard", "--corruptions",
                 "contrast", "zoom_blur", "--seed", "3", "--reference", str(tmp_path / "ref"), "--out",
                 str(tmp_path / "seeded")]) == 2
    assert "corrupted its frames with seed 0, this run with 3" in capsys.readouterr().err
    assert not (tmp_path / "seeded" / "state.npz").exists()
    copy = json.loads((tmp_path / "copy/results.json").read_text())
    copy["sets"]["perlin_mixed"]["manifest_sha256"] = "0" * 64
    (tmp_path / "copy/results.json").write_text(json.dumps(copy))
    with pytest.raises(ValueError, match="evaluated another set named 'perlin_mixed' .*name a reference run on these"):
        write_robustness_report(tmp_path / "other", figures=False, reference=tmp_path / "copy")
    # a new run into a folder does not take the reference its last report named
    assert main([*common[:2], str(tmp_path / "other.pt"), *common[3:], "--family", "standard", "--corruptions",
                 "contrast", "zoom_blur", "--out", str(tmp_path / "other"), "--resume"]) == 0
    assert "reference_run" not in json.loads((tmp_path / "other/results.json").read_text())


def test_corruption_error_by_hand():
    from segood.robustness.report import corruption_error

    # AUROC (higher is better): errors 0.2 + 0.4 against 0.1 + 0.2; relative: (0.6 - 2 * 0.1) / (0.3 - 2 * 0.05)
    ce, relative = corruption_error([0.8, 0.6], 0.9, [0.9, 0.8], 0.95, higher_is_better=True)
    assert ce == pytest.approx(2.0) and relative == pytest.approx(2.0)
    ce, relative = corruption_error([0.5, 0.7], 0.3, [0.25, 0.25], 0.25, higher_is_better=False)  # FPR95: E = value
    assert ce == pytest.approx(2.4) and relative is None  # the reference loses nothing: relative undefined
    assert corruption_error([None, 0.7], 0.3, [0.2, 0.2], 0.1, higher_is_better=False) == (None, None)


def test_summary_mce_and_relative_mce_by_hand():
    """mCE and relative mCE of a hand-made run against a hand-made reference, three corruptions, two levels: FPR95's
    error is the value itself (lower is better), mIoU's 1 - value; relative errors subtract each run's own clean
    error; the mean over corruptions (not the median) is taken."""
    from segood.robustness.report import summary

    def run(clean, cells):  # cells: {corruption: [(miou, fpr95) at level 1, at level 2]}
        def one(miou, fpr95):
            return {"segmentation": {"miou": miou}, "ood": {"entropy": {"fpr95": fpr95}}}
        return {"robustness": {"severities": [1, 2]}, "methods": {"entropy": {}}, "clean": {"sun": one(*clean)},
                "corrupted": {"sun": {c: {str(v): one(*x) for v, x in enumerate(levels, 1)}
                                      for c, levels in cells.items()}}}

    doc = run((0.8, 0.2), {"fog": [(0.6, 0.3), (0.4, 0.5)], "blur": [(0.7, 0.25), (0.5, 0.45)],
                           "rain": [(0.5, 0.4), (0.3, 0.6)]})
    reference = run((0.9, 0.1), {"fog": [(0.8, 0.2), (0.6, 0.3)], "blur": [(0.8, 0.15), (0.7, 0.25)],
                                 "rain": [(0.7, 0.3), (0.5, 0.35)]})
    got = summary(doc, reference)["sun"]["segood"]
    # mIoU: CE fog 1.0 / 0.6, blur 0.8 / 0.5, rain 1.2 / 0.8; relative fog (1.0 - 0.4) / (0.6 - 0.2),
    # blur (0.8 - 0.4) / (0.5 - 0.2), rain (1.2 - 0.4) / (0.8 - 0.2)
    assert got["network"]["miou"] == {"mean": pytest.approx(0.5), "mce": pytest.approx((5 / 3 + 1.6 + 1.5) / 3),
                                      "relative_mce": pytest.approx((1.5 + 4 / 3 + 4 / 3) / 3)}
    # FPR95: CE fog 0.8 / 0.5, blur 0.7 / 0.4, rain 1.0 / 0.65; relative fog (0.8 - 0.4) / (0.5 - 0.2),
    # blur (0.7 - 0.4) / (0.4 - 0.2), rain (1.0 - 0.4) / (0.65 - 0.2)
    assert got["ood"]["entropy"]["fpr95"] == {"mean": pytest.approx(2.5 / 6),
                                              "mce": pytest.approx((1.6 + 1.75 + 1.0 / 0.65) / 3),
                                              "relative_mce": pytest.approx((4 / 3 + 1.5 + 4 / 3) / 3)}
    assert got["ood"]["entropy"]["auroc"] == {"mean": None, "mce": None, "relative_mce": None}  # not in the cells
    assert summary(doc)["sun"]["segood"]["network"]["miou"] == {"mean": pytest.approx(0.5), "mce": None,
                                                                 "relative_mce": None}

def test_segmentation_quality_by_hand():
    """Accuracy is the share of counted pixels predicted right (pooled, not a mean over classes); an undefined
    calibration value is None."""
    from types import SimpleNamespace

    from segood.robustness.suite import segmentation_quality

    confusion = np.array([[3, 1, 0], [0, 0, 0], [0, 0, 2]])  # IoU 3/4, 0 (predicted once, never right), 2/2
    calibration = SimpleNamespace(compute=lambda: {"ece": 0.125, "brier": float("nan")})
    ev = SimpleNamespace(confusion={"s": confusion}, calibration={"s": calibration})
    assert segmentation_quality(ev, "s") == {"miou": pytest.approx(1.75 / 3), "accuracy": pytest.approx(5 / 6),
                                             "ece": 0.125, "brier": None, "n_pixels": 6}

def test_confusion_counts_in_one_pass_and_by_torch_operations_equal_a_loop():
    from segood.metrics.segmentation import _tensor_confusion, confusion_counts

    rng = np.random.default_rng(1)
    target = rng.choice(np.array([0, 1, 2, 3, 7, 255], np.uint8), 3000)  # (3 and 7: no class of 3)
    pred = rng.integers(-1, 4, 3000)  # (-1 and 3: no class)
    want, left_out = np.zeros((3, 3), np.int64), 0
    for t, p in zip(target.tolist(), pred.tolist()):
        if t != 255:
            if t < 3 and 0 <= p < 3:
                want[t, p] += 1
            else:
                left_out += 1
    assert left_out > 0 and want.min() > 0
    for p in (pred, pred.astype(np.int32), torch.from_numpy(pred)):
        counts, left = confusion_counts(p, target, 3)
        assert left == left_out and np.array_equal(counts, want)
    counts, left = _tensor_confusion(torch.from_numpy(pred), torch.from_numpy(target).long(), 3)  # (as on a device)
    assert int(left) == left_out and np.array_equal(counts.numpy(), want)
    with pytest.raises(ValueError, match="class ids must be below num_classes=3"):
        confusion_matrix(pred, target, 3)
    keep = (target < 3) & (pred >= 0) & (pred < 3) | (target == 255)
    assert np.array_equal(confusion_matrix(pred[keep], target[keep], 3), want)

