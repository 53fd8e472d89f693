"""The demo pipeline, the CLI and the small helpers it stands on, run for real at a tiny size."""

import json
import subprocess
import sys

import numpy as np
import pytest

from segood.cli import build_parser, main
from segood.data.synthetic import scene_batch
from segood.labels import IGNORE, LABEL_ID_TO_TRAIN_ID, NUM_CLASSES, colorize
from segood.metrics import PixelOODAccumulator
from segood.metrics.segmentation import confusion_matrix, mean_iou


def test_scenes_are_deterministic_and_well_formed():
    a = scene_batch(3, 4, 48, 96, ood_fraction=0.5)
    b = scene_batch(3, 4, 48, 96, ood_fraction=0.5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    images, semantic, ood_mask = a
    assert images.shape == (4, 48, 96, 3) and images.dtype == np.uint8
    assert set(np.unique(ood_mask)) <= {0, 1, 255}
    assert (ood_mask[0] == 1).any() and not (ood_mask[1] == 1).any()  # every second scene holds an object
    assert np.all(semantic[ood_mask == 1] == IGNORE)  # the novel object has no Cityscapes class
    assert np.all((semantic < NUM_CLASSES) == (ood_mask == 0))


def test_cityscapes_tables():
    assert NUM_CLASSES == 19
    assert LABEL_ID_TO_TRAIN_ID[7] == 0 and LABEL_ID_TO_TRAIN_ID[26] == 13  # road, car
    assert LABEL_ID_TO_TRAIN_ID[0] == IGNORE and LABEL_ID_TO_TRAIN_ID[-1] == IGNORE
    assert colorize(np.array([[0, 255]])).tolist() == [[[128, 64, 128], [0, 0, 0]]]


def test_confusion_matrix_and_miou_against_a_loop():
    rng = np.random.default_rng(0)
    target = rng.choice([0, 1, 2, 255], 500)
    pred = rng.integers(0, 3, 500)
    conf = confusion_matrix(pred, target, 4)
    for t in range(4):
        for p in range(4):
            assert conf[t, p] == np.sum((target == t) & (pred == p))
    miou, iou = mean_iou(conf)
    for c in range(3):
        inter = np.sum((target == c) & (pred == c))
        union = np.sum(((target == c) | (pred == c)) & (target != 255))
        assert iou[c] == pytest.approx(inter / union)
    assert np.isnan(iou[3]) and miou == pytest.approx(np.mean(iou[:3]))


def test_a_class_predicted_but_never_right_counts_as_iou_0_and_one_absent_from_both_is_left_out():
    # class 0: 3 right, 1 predicted as class 1; class 1: never right (IoU 0, in the mean); class 2: predicted only on
    # an unknown (255) pixel, so absent from both (NaN, out of the mean)
    conf = confusion_matrix(np.array([0, 0, 0, 1, 2]), np.array([0, 0, 0, 0, 255]), 3)
    assert conf.tolist() == [[3, 1, 0], [0, 0, 0], [0, 0, 0]]
    miou, iou = mean_iou(conf)
    assert iou[:2].tolist() == [0.75, 0.0] and np.isnan(iou[2]) and miou == 0.375
    assert np.isnan(mean_iou(np.zeros((3, 3), np.int64))[0])  # nothing counted: undefined


def test_reduced_demo_end_to_end_with_the_shipped_checkpoints(tmp_path, capsys):
    code = main(["demo", "--quick", "--out", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| mahalanobis | sun |" in out and "Component-level metrics (SMIYC, obstacle preset)" in out
    doc = json.loads((tmp_path / "run/results.json").read_text())
    assert set(doc["results"]) == {"max_softmax", "odin", "entropy", "mahalanobis", "varsum", "mutual_info",
                                   "confidence", "max_logit", "energy", "sml"}
    for by_set in doc["results"].values():
        assert set(by_set) == {"sun", "idd", "perlin", "normal", "paste"}
        for r in by_set.values():
            assert all(0.0 <= r["pooled"][m] <= 1.0 for m in ("auroc", "auprc", "fpr95", "max_iou"))
            assert r["n_ood"] > 0 and r["n_id"] > 0
            assert r["components"]["threshold_source"] == "committed" and r["components"]["min_pred"] == 50
    assert doc["results"]["odin"]["sun"]["same_source_tuning"] and not doc["results"]["odin"]["idd"]["same_source_tuning"]
    oe = doc["outlier_exposure"]  # the OE network beside its parent, SUN objects: the sun set flagged, paste not
    assert oe["record"]["same_source_sets"] == ["sun"] and {r["set"] for r in oe["rows"]} == set(by_set)
    assert all(0.0 <= r["p_oe_better"] <= 1.0 for r in oe["rows"] if r["p_oe_better"] is not None)
    assert "| entropy | sun ‡ | AUROC ↑ |" in out and "| entropy | paste | AUROC ↑ |" in out
    assert (tmp_path / "run/figures/metrics.png").stat().st_size > 10_000
    assert main(["report", str(tmp_path / "run"), "-q"]) == 0  # a rebuilt report keeps the OE comparison (it was lost)
    assert json.loads((tmp_path / "run/results.json").read_text())["outlier_exposure"] == oe


def test_metrics_command_and_its_errors(tmp_path, capsys):
    acc = PixelOODAccumulator(10).update(np.array([0.1, 0.9, 0.4]), np.array([0, 1, 1], np.uint8))
    acc.save(tmp_path / "state.npz")
    assert main(["metrics", str(tmp_path / "state.npz"), "--curves", str(tmp_path / "curves.csv")]) == 0
    assert "auroc: 1.0" in capsys.readouterr().out
    curves = np.loadtxt(tmp_path / "curves.csv", delimiter=",", skiprows=1)
    assert curves.shape == (10, 5) and curves[0, 1] == 2  # both OOD pixels pass the lowest threshold
    np.savez(tmp_path / "bad.npz", hist=np.zeros(3))
    assert main(["metrics", str(tmp_path / "bad.npz")]) == 2
    assert "lacks" in capsys.readouterr().err


def test_a_list_option_given_twice_lists_both_and_replaces_its_default():
    parse = build_parser(adapters=False).parse_args
    args = parse(["robustness", "--checkpoint", "m.pt", "--sets", "a.h5", "--out", "r", "--sets", "b.h5",
                  "--severities", "1", "--severities", "3", "5"])
    assert [str(p) for p in args.sets] == ["a.h5", "b.h5"] and args.severities == [1, 3, 5]
    assert args.methods == ["all"]  # the default, where the option is not given
    args = parse(["evaluate", "--checkpoint", "m.pt", "--sets", "a.h5", "--out", "r", "--methods", "entropy"])
    assert args.methods == ["entropy"]  # not ["all", "entropy"]


@pytest.mark.parametrize("argv, error", [
    (["convert", "noise", "--out", "n.h5", "--octaves", "0"], "argument --octaves: must be a positive integer, got 0"),
    (["convert", "noise", "--out", "n.h5", "--seed", "-1"], "argument --seed: must be an integer of at least 0"),
    (["convert", "noise", "--out", "n.h5", "--sigma", "nan"],
     "argument --sigma: must be a finite number of at least 0"),
    (["miou", "m.pt", "--data", "d.h5", "--batch-size", "0"], "argument --batch-size: must be a positive integer"),
    (["train", "--train", "t.h5", "--out", "r", "--lr", "nan"],
     "argument --lr: must be a finite number above 0, got nan"),
    (["evaluate", "--checkpoint", "m.pt", "--sets", "s.h5", "--out", "r", "--workers", "-1"],
     "argument --workers: must be an integer of at least 0, got -1")])
def test_values_out_of_range_are_usage_errors_naming_the_option(argv, error, capsys):
    """(They crashed deep in the run, or were taken: noise of 0 octaves was a flat grey set, NaN a learning rate.)"""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and error in capsys.readouterr().err


def test_the_library_refuses_them_too():
    from segood.data.noise import Noise
    from segood.models.train import TrainConfig

    with pytest.raises(ValueError, match="got frequency 0, seed -1"):
        Noise(frequency=0, seed=-1)
    with pytest.raises(ValueError, match=r"--lr must lie in \(0, inf\), got nan"):
        TrainConfig("t.h5", "r", lr=float("nan"))
    with pytest.raises(ValueError, match=r"--dropout-p must lie in \[0, 1\), got 1.0"):
        TrainConfig("t.h5", "r", dropout_p=1.0)


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "segood", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("segood ")


def test_an_installed_wheel_ships_the_demo_checkpoints_and_label_maps():
    """setup.cfg's data files list every shipped checkpoint and label map, and the demo finds its checkpoints
    where they are (the checkout here; <prefix>/share/segood/checkpoints in an installed wheel)."""
    import configparser
    from pathlib import Path

    from segood.demo import _CHECKPOINT_DIRS, CHECKPOINTS

    root = Path(__file__).resolve().parents[1]
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    listed = {line.strip() for value in config["options.data_files"].values()
              for line in value.replace(",", "\n").splitlines() if line.strip()}
    shipped = {str(p.relative_to(root)) for folder in ("checkpoints", "label_maps") for p in (root / folder).iterdir()
               if p.suffix in (".pt", ".json", ".yaml", ".md")}
    assert shipped == listed
    assert CHECKPOINTS == _CHECKPOINT_DIRS[0] and (CHECKPOINTS / "demo_plain.pt").exists()
    assert str(_CHECKPOINT_DIRS[1]).endswith("share/segood/checkpoints")


def test_a_built_wheel_holds_every_data_file_the_package_reads(tmp_path):
    """Every file of segood/ that is not Python (the robustness suite's severity and standard tables) is in the wheel
    built from the checkout: an editable install reads them from the checkout and would not notice one missing."""
    import shutil
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "segood", "checkpoints", "label_maps"):
        copy = shutil.copytree if (root / name).is_dir() else shutil.copy
        copy(root / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                           if (root / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=120)
    [wheel] = (tmp_path / "dist").glob("segood-*.whl")
    data = {p.relative_to(root).as_posix() for p in (root / "segood").rglob("*")
            if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts}
    assert data and data <= set(zipfile.ZipFile(wheel).namelist())
