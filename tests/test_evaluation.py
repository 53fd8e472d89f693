"""The evaluation run end to end on tiny generated sets and tiny real networks."""

import csv
import json
import re
import shutil
import warnings

import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset
from segood.evaluation import evaluate, evaluate_score_maps
from segood.evaluation.layout import RunFolder
from segood.evaluation.runner import Evaluation
from segood.methods import get_method
from segood.metrics import METRIC_NAMES, make_accumulator
from segood.models import preprocess, save_checkpoint

from gloo import run_in_group
from networks import tiny_network
from rawtrees import killed_after


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets(kinds=("perlin",), noise_frames=3, cityscapes_frames=3)


def direct_counts(model, method, path):
    """The reference: the method scored frame by frame straight into a fresh accumulator."""
    acc = make_accumulator()
    dataset = H5SegmentationDataset(path)
    for i in range(len(dataset)):
        item = dataset[i]
        acc.update(method.score(model, preprocess(item["image"][None]))[0], item["ood_mask"][None])
    return acc


def test_results_equal_a_direct_computation(sets, tmp_path):
    model = tiny_network("dropout")
    doc = evaluate(model, {"perlin_mixed": sets / "perlin_mixed.h5"}, ["max_softmax", "entropy", "odin"],
                   tmp_path / "run", batch_size=2, progress=False)
    for name in ("max_softmax", "entropy", "odin"):
        reference = direct_counts(model, get_method(name), sets / "perlin_mixed.h5").compute()
        got = doc["results"][name]["perlin_mixed"]
        for metric in METRIC_NAMES:
            assert got["pooled"][metric] == pytest.approx(reference[metric], abs=1e-12)
        assert (got["n_id"], got["n_ood"]) == (reference["n_id"], reference["n_ood"])
        assert got["per_image_mean"]["n_images_total"] == 6 and "auroc" in got["per_image_mean"]
    saved = json.loads((tmp_path / "run/results.json").read_text())
    assert saved["schema"] == "segood.results/1" and saved["toolkit"]["segood_version"]
    assert saved["sets"]["perlin_mixed"]["ood_sources"] == ["perlin_noise"]
    assert set(saved["timings"]["ms_per_image"]) >= {"data", "forward", "accumulate", "score/entropy"}
    md = (tmp_path / "run/results.md").read_text()
    assert "AUROC ↑ (pooled over all pixels)" in md and "FPR95 ↓ (per-image mean)" in md and "**" in md
    assert "per-image mean" in (tmp_path / "run/results.csv").read_text()
    figures = sorted(p.name for p in (tmp_path / "run/figures").iterdir())
    assert {"metrics.png", "curves_perlin_mixed.png", "examples_perlin_mixed.png",
            "per_class_entropy.png"} <= set(figures)
    assert all((tmp_path / "run/figures" / f).stat().st_size > 5000 for f in figures)
    for left in ("curves_gone.png", "per_class_gone.png", "examples_gone.png", "mine.png"):  # another run's, a user's
        (tmp_path / "run/figures" / left).write_bytes(b"png")
    assert main(["report", str(tmp_path / "run")]) == 0  # rebuilt from the saved state alone
    assert sorted(p.name for p in (tmp_path / "run/figures").iterdir()) == sorted([*figures, "mine.png"])
    assert main(["report", str(tmp_path / "run"), "--resamples", "30", "--seed", "5", "--commit-on", "perlin_mixed",
                 "-q"]) == 0
    saved = json.loads((tmp_path / "run/results.json").read_text())
    assert (saved["bootstrap"]["resamples"], saved["bootstrap"]["seed"], saved["commit_on"]) == (30, 5, "perlin_mixed")
    assert saved["results"]["entropy"]["perlin_mixed"]["committed"]["f1"]["chosen_on"] == "perlin_mixed"


def test_all_methods_share_passes_and_monte_carlo(sets, tmp_path):
    with pytest.warns(UserWarning, match="sml left out: it needs a fit on training data"):
        doc = evaluate(tiny_network("dropout"), [sets / "perlin_mixed.h5", sets / "cs.h5"], None, tmp_path,
                       progress=False)
    # every method the head serves, but those that need a fit (no fit_set given), said so
    assert set(doc["results"]) == {"max_softmax", "odin", "entropy", "varsum", "mutual_info", "max_logit", "energy"}
    assert doc["results"]["entropy"]["cs"]["pooled"]["auroc"] is None  # no OOD pixel: undefined, not made up
    classes = doc["per_class_mean_score"]["entropy"]["cs"]
    assert classes["road"] is not None and classes["car"] is not None and classes["bus"] is None


def test_score_maps_equal_the_model_path(sets, tmp_path):
    model = tiny_network("dropout")
    dataset = H5SegmentationDataset(sets / "perlin_mixed.h5")
    with h5py.File(tmp_path / "scores.h5", "w") as f:
        f.attrs["score_range"] = [0.0, 1.0]
        for i in range(len(dataset)):
            item = dataset[i]
            score = get_method("entropy").score(model, preprocess(item["image"][None]))[0][0]
            f[item["frame_id"]] = score.numpy().astype(np.float32)
    external = evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "ext",
                                   name="entropy", figures=False)
    internal = evaluate(model, [sets / "perlin_mixed.h5"], ["entropy"], tmp_path / "int", progress=False,
                        figures=False)
    for metric in METRIC_NAMES:
        assert external["results"]["entropy"]["perlin_mixed"]["pooled"][metric] == pytest.approx(
            internal["results"]["entropy"]["perlin_mixed"]["pooled"][metric], abs=1e-12)
    with h5py.File(tmp_path / "scores.h5", "a") as f:
        first = dataset[0]["frame_id"]
        del f[first]
        f["somewhere/else"] = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match=f"missing {first}, extra somewhere/else"):
        evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "bad")
    with h5py.File(tmp_path / "scores.h5", "a") as f:
        del f["somewhere"]
        f[first] = np.full((64, 64), 2.0, np.float32)
    with pytest.raises(ValueError, match=f"frame {first}: .*outside"):
        evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "bad2")
    with pytest.raises(ValueError, match=r"holds a different run \(model.config: \{...\} -> \(none\); .* and \d+ more: its "
                                         r"run.json's, then this run's\); the same settings continue it, other ones "
                                         r"need another folder \(--out; in Python out_dir\)$"):  # never overwrite
        evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "int", clip=True,
                            num_thresholds=400)


def test_report_flags_values_the_binning_cannot_resolve(sets, tmp_path):
    """Scores crowded below the first of 400 linear thresholds: results.md marks them ≈; the float-order grid (the
    default) resolves them."""
    dataset = H5SegmentationDataset(sets / "perlin_mixed.h5")
    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "scores.h5", "w") as f:
        f.attrs["score_range"] = [0.0, 1.0]
        for i in range(len(dataset)):
            item = dataset[i]
            ood = item["ood_mask"].numpy() == 1
            f[item["frame_id"]] = (np.where(ood, 0.002, 0.001) + rng.uniform(0, 1e-4, ood.shape)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"^400 linear thresholds on \[0, 1\] cannot pin 4 pooled values down to "
                                         r"0\.01 \(marked ≈\): exact mode may lie anywhere in the bounds, e\.g\. AUROC "
                                         r"of external on perlin_mixed in \[0\.000, 1\.000\], .* and 1 more; rerun on "
                                         r"the float-order grid \(the default: drop --num-thresholds\)\.$"):
        coarse = evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "coarse",
                                     figures=False, num_thresholds=400)
    result = coarse["results"]["external"]["perlin_mixed"]
    assert result["pooled"]["auroc"] == pytest.approx(0.5) and result["bounds"]["auroc"] == [0.0, 1.0]
    markdown = (tmp_path / "coarse" / "results.md").read_text()
    assert "**0.5000** ≈" in markdown and "rerun on the float-order grid" in markdown  # (no zero-width interval)
    assert "Thresholds: 400 linear thresholds on [0, 1]." in markdown.splitlines()  # the grid, named
    rows = list(csv.DictReader((tmp_path / "coarse" / "results.csv").read_text().splitlines()))
    pooled = rows[0]  # the bins' bounds and the bootstrap interval, each in columns of its own
    assert (pooled["aggregation"], float(pooled["auroc_bin_low"]), float(pooled["auroc_bin_high"])) == ("pooled", 0, 1)
    low, high = (float(pooled[f"auroc_ci_{side}"]) for side in ("low", "high"))
    assert [low, high] == result["intervals"]["auroc"] and low <= result["pooled"]["auroc"] <= high
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*cannot pin")
        fine = evaluate_score_maps(tmp_path / "scores.h5", sets / "perlin_mixed.h5", tmp_path / "fine", figures=False)
    assert fine["results"]["external"]["perlin_mixed"]["pooled"]["auroc"] == pytest.approx(1.0)
    assert "≈" not in (tmp_path / "fine" / "results.md").read_text()
    assert "Thresholds: the float-order grid at 10 mantissa bits." in (tmp_path / "fine" / "results.md").read_text()
    with h5py.File(tmp_path / "tight.h5", "w") as f:  # apart, but within 2^-11 of 0.5: one float-order bin
        for i in range(len(dataset)):
            item = dataset[i]
            ood = item["ood_mask"].numpy() == 1
            f[item["frame_id"]] = 0.5 + (np.where(ood, 2e-4, 0.0) + rng.uniform(0, 1e-4, ood.shape)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"rerun with more --mantissa-bits \(at most 14\), or with --grid exact"):
        evaluate_score_maps(tmp_path / "tight.h5", sets / "perlin_mixed.h5", tmp_path / "tight", figures=False)
    markdown = (tmp_path / "tight" / "results.md").read_text()
    assert "≈" in markdown and "rerun with more --mantissa-bits (at most 14), or with --grid exact" in markdown
    with h5py.File(tmp_path / "tied.h5", "w") as f:  # quantised: ID and OOD pixels share values, which tie
        for i in range(len(dataset)):
            ood = dataset[i]["ood_mask"].numpy() == 1
            f[dataset[i]["frame_id"]] = (np.round(rng.uniform(0, 0.3, ood.shape) + 0.2 * ood, 1)).astype(np.float32)
    with pytest.warns(UserWarning, match="14 mantissa bits, the most, leave these bins as they are .*--grid exact"):
        tied = evaluate_score_maps(tmp_path / "tied.h5", sets / "perlin_mixed.h5", tmp_path / "tied", figures=False,
                                   mantissa_bits=14)
    exact = evaluate_score_maps(tmp_path / "tied.h5", sets / "perlin_mixed.h5", tmp_path / "tied_exact",
                                figures=False, grid="exact")
    assert tied["results"]["external"]["perlin_mixed"]["pooled"] == pytest.approx(
        exact["results"]["external"]["perlin_mixed"]["pooled"], abs=1e-4)  # (ties: counted as exact mode does)
    exact = evaluate_score_maps(tmp_path / "tight.h5", sets / "perlin_mixed.h5", tmp_path / "exact", figures=False,
                                grid="exact")
    assert exact["results"]["external"]["perlin_mixed"]["bounds"]["auroc"] == [1.0, 1.0]
    assert "≈" not in (tmp_path / "exact" / "results.md").read_text()


def test_the_exact_grid_end_to_end(sets, tmp_path, capsys, monkeypatch):
    """grid="exact": every pooled value equals exact mode (scikit-learn's) on the scores themselves, with zero-width
    bounds and bootstrap intervals; --grid exact on the command line, for score maps too."""
    from segood.metrics import exact_metrics

    model = tiny_network("dropout")
    doc = evaluate(model, [sets / "perlin_mixed.h5"], ["entropy", "max_logit"], tmp_path / "run", grid="exact",
                   batch_size=1, progress=False, figures=False, save_every=1)  # the reference's batches
    assert json.loads((tmp_path / "run/run.json").read_text())["config"]["grid"] == {"kind": "exact",
                                                                                    "max_pixels": 1 << 28}
    dataset = H5SegmentationDataset(sets / "perlin_mixed.h5")
    items = [dataset[i] for i in range(len(dataset))]
    labels = np.stack([item["ood_mask"].numpy() for item in items])
    with h5py.File(tmp_path / "scores.h5", "w") as f:
        for name in ("entropy", "max_logit"):
            scores = np.stack([get_method(name).score(model, preprocess(item["image"][None]))[0][0].numpy()
                               for item in items])
            reference = exact_metrics(scores, labels)
            got = doc["results"][name]["perlin_mixed"]
            for metric in METRIC_NAMES:
                assert got["pooled"][metric] == pytest.approx(reference[metric], abs=1e-12)
                assert got["bounds"][metric] == [got["pooled"][metric]] * 2
                lo, hi = got["intervals"][metric]
                assert lo <= got["pooled"][metric] <= hi
            if name == "max_logit":
                for item, score in zip(items, scores):
                    f[item["frame_id"]] = score
    from segood.evaluation import report

    monkeypatch.setattr(report, "CURVE_POINTS", 100)  # a curve of a point per distinct score, drawn thinned
    assert main(["report", str(tmp_path / "run")]) == 0 and (tmp_path / "run/figures/curves_perlin_mixed.png").exists()
    assert main(["score", "--scores", str(tmp_path / "scores.h5"), "--data", str(sets / "perlin_mixed.h5"),
                 "--out", str(tmp_path / "cli"), "--grid", "exact", "--max-pixels", "100000"]) == 0
    cli = json.loads((tmp_path / "cli/results.json").read_text())
    assert cli["config"]["grid"] == {"kind": "exact", "max_pixels": 100000}
    assert cli["results"]["external"]["perlin_mixed"]["pooled"] == doc["results"]["max_logit"]["perlin_mixed"]["pooled"]
    assert main(["score", "--scores", str(tmp_path / "scores.h5"), "--data", str(sets / "perlin_mixed.h5"),
                 "--out", str(tmp_path / "small"), "--grid", "exact", "--max-pixels", "1000"]) == 2
    assert "above its cap of 1000 (max_pixels" in capsys.readouterr().err
    assert main(["score", "--scores", str(tmp_path / "scores.h5"), "--data", str(sets / "perlin_mixed.h5"),
                 "--out", str(tmp_path / "mixed"), "--grid", "linear", "--max-pixels", "1000"]) == 2
    assert "max_pixels belong to another grid than the linear one" in capsys.readouterr().err


def test_odin_named_on_the_linear_grid_takes_the_paper_form(sets, tmp_path):
    doc = evaluate(tiny_network("dropout"), [sets / "perlin_mixed.h5"], ["odin"], tmp_path / "linear",
                   num_thresholds=400, progress=False, figures=False)
    assert doc["methods"]["odin"]["params"]["form"] == "softmax"
    spread = evaluate(tiny_network("dropout"), [sets / "perlin_mixed.h5"], ["odin"], tmp_path / "float", progress=False,
                      figures=False)
    assert spread["methods"]["odin"]["params"]["form"] == "spread"
    for metric in METRIC_NAMES:  # the same order: the float-order grid's bounds hold the linear grid's exact values
        lo, hi = spread["results"]["odin"]["perlin_mixed"]["bounds"][metric]
        linear_lo, linear_hi = doc["results"]["odin"]["perlin_mixed"]["bounds"][metric]
        assert max(lo, linear_lo) <= min(hi, linear_hi) + 1e-9, metric
    with pytest.raises(ValueError, match="odin: form='softmax'"):
        evaluate(tiny_network("dropout"), [sets / "perlin_mixed.h5"], [get_method("odin")], tmp_path / "refused",
                 num_thresholds=400, progress=False)
    with pytest.warns(UserWarning, match="max_logit, energy left out: the linear grid bins"):  # the defaults
        every = evaluate(tiny_network("dropout"), [sets / "perlin_mixed.h5"], None, None, num_thresholds=400,
                         progress=False, figures=False, bootstrap=None)
    assert list(every["results"]) == ["max_softmax", "odin", "entropy", "varsum", "mutual_info"]
    assert every["methods"]["odin"]["params"]["form"] == "softmax"


@pytest.mark.parametrize("methods,batch_size", [(["entropy"], 2), (["max_softmax", "varsum", "mutual_info"], 1)])
def test_resume_after_a_kill_equals_an_uninterrupted_run(sets, tmp_path, monkeypatch, capsys, methods, batch_size):
    paths = [sets / "perlin_mixed.h5", sets / "cs.h5"]
    whole = evaluate(tiny_network("dropout"), paths, methods, tmp_path / "whole", batch_size=batch_size, progress=False,
                     figures=False)
    model = tiny_network("dropout")
    original = model.forward
    monkeypatch.setattr(model, "forward", killed_after(model, 4))
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, paths, methods, tmp_path / "killed", batch_size=batch_size, save_every=1, progress=False,
                 figures=False)
    monkeypatch.setattr(model, "forward", original)
    with RunFolder(tmp_path / "killed").claimed(), pytest.warns(UserWarning, match=r"^The run is still running: "):
        assert main(["report", str(tmp_path / "killed"), "--resamples", "0", "-q"]) == 0  # (another process's)
    with pytest.warns(UserWarning, match=r"^The run is unfinished: \d+ of the \d+ frames of (perlin_mixed|cs)"):
        assert main(["report", str(tmp_path / "killed"), "--resamples", "0"]) == 0  # a report of what was counted
    notes = json.loads((tmp_path / "killed" / "results.json").read_text())["notes"]
    assert any(note.startswith("The run is unfinished") for note in notes)
    printed = capsys.readouterr().out  # the images counted, not the set's 6 and 3
    counted = json.loads((tmp_path / "killed" / "results.json").read_text())["timings"]["images_per_set"]
    assert sum(counted.values()) < 9 and f"perlin_mixed (the paper's protocol: AUROC first; {counted['perlin_mixed']} " \
        "images;" in printed
    resumed = evaluate(model, paths, methods, tmp_path / "killed", batch_size=batch_size, resume=True,
                       progress=False, figures=False)
    assert resumed["results"] == whole["results"] and resumed["notes"] == whole["notes"] == []
    assert resumed["timings"]["images"] == whole["timings"]["images"] == 9


def _distributed_worker(rank, world, paths, out_dir):
    evaluate(tiny_network("dropout"), paths, ["max_softmax", "entropy"], out_dir, batch_size=1, progress=False,
             figures=False, skip_bad=True)


def test_two_process_gloo_run_equals_single_process(sets, tmp_path):
    """Two ranks give the counts of one process, skipped frames included (each rank skips its own); their merged
    state, resumed by one process, has no frame left to count again."""
    broken = tmp_path / "broken.h5"  # perlin_mixed with frames 1 (rank 0's) and 4 (rank 1's) damaged
    shutil.copy(sets / "perlin_mixed.h5", broken)
    shutil.copy(sets / "perlin_mixed.manifest.json", tmp_path / "broken.manifest.json")
    with h5py.File(broken, "r+") as f:
        for frame in ("1", "4"):
            f["images"][frame].id.write_direct_chunk((0, 0, 0), b"not a deflate stream")
    paths = [str(broken), str(sets / "cs.h5")]
    single = evaluate(tiny_network("dropout"), paths, ["max_softmax", "entropy"], tmp_path / "single", batch_size=1,
                      progress=False, figures=False, skip_bad=True)
    run_in_group(_distributed_worker, paths, str(tmp_path / "multi"))
    multi = json.loads((tmp_path / "multi/results.json").read_text())
    resumed = evaluate(tiny_network("dropout"), paths, ["max_softmax", "entropy"], tmp_path / "multi", batch_size=1,
                       progress=False, figures=False, skip_bad=True, resume=True)
    for other in (multi, resumed):
        for method in ("max_softmax", "entropy"):
            for set_name in ("broken", "cs"):
                a, b = single["results"][method][set_name], other["results"][method][set_name]
                assert a["pooled"] == b["pooled"] and (a["n_id"], a["n_ood"]) == (b["n_id"], b["n_ood"])
                assert a["per_image_mean"] == b["per_image_mean"]
    one, two = np.load(tmp_path / "single/state.npz"), np.load(tmp_path / "multi/state.npz")
    rows = [k for k in one.files if k.endswith(("/per_image_metrics", "/image_offsets", "/image_keys", "/image_counts"))]
    assert rows
    for key in rows:  # per-image rows in frame order, as one process's: the same resamples for the same seed, and
        np.testing.assert_array_equal(one[key], two[key])  # a paired comparison across runs pairs the same images
        assert other["timings"]["images"] == 7
        assert [entry[:2] for entry in other["skipped_frames"]] == [["broken", 1], ["broken", 4]]


def test_bad_inputs_fail_before_any_compute(sets, tmp_path):
    model = tiny_network("dropout")
    with pytest.raises(ValueError, match="needs a network with the 'dimreduce' head"):
        evaluate(model, [sets / "cs.h5"], ["mahalanobis"], tmp_path / "a", progress=False)
    (tmp_path / "not_a_set.h5").write_bytes(b"hello")
    with pytest.raises(ValueError, match="not a segood set"):
        evaluate(model, [tmp_path / "not_a_set.h5"], ["entropy"], tmp_path / "b", progress=False)
    evaluate(model, [sets / "cs.h5"], ["entropy"], tmp_path / "d", progress=False, figures=False)
    with pytest.raises(ValueError, match=r"holds a different run \(methods.entropy: \{...\} -> \(none\); "
                                         r"methods.max_softmax: \(none\) -> \{...\}: its"):
        evaluate(model, [sets / "cs.h5"], ["max_softmax"], tmp_path / "d", progress=False)
    with pytest.raises(ValueError, match=r"different run \(config.batch_size: 2 -> 3: its run.json's, then this run's"):
        evaluate(model, [sets / "cs.h5"], ["entropy"], tmp_path / "d", progress=False, batch_size=3, resume=True)
    torch.manual_seed(1)
    with pytest.raises(ValueError, match="holds a different run"):  # same architecture, other weights
        evaluate(tiny_network("dropout").apply(lambda m: torch.nn.init.zeros_(m.weight)
                                               if isinstance(m, torch.nn.Conv2d) else None),
                 [sets / "cs.h5"], ["entropy"], tmp_path / "d", progress=False)
    with pytest.raises(ValueError, match="file stems must differ"):
        evaluate(model, [sets / "cs.h5", sets / "cs.h5"], ["entropy"], tmp_path / "f", progress=False)
    save_checkpoint(tmp_path / "m.pt", model)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets / "cs.h5"), "--methods",
                 "confidence", "--out", str(tmp_path / "e"), "--quiet"]) == 2


def test_a_corrupt_frame_stops_with_its_id_or_is_skipped(sets, tmp_path):
    import shutil

    shutil.copy(sets / "perlin_mixed.h5", tmp_path / "broken.h5")
    shutil.copy(sets / "perlin_mixed.manifest.json", tmp_path / "broken.manifest.json")
    with h5py.File(tmp_path / "broken.h5", "a") as f:
        f["images"]["4"].id.write_direct_chunk((0, 0, 0), b"not a zlib stream")
    model = tiny_network("dropout")
    with pytest.raises(ValueError, match="cannot read frame 4"):
        evaluate(model, [tmp_path / "broken.h5"], ["entropy"], tmp_path / "run", progress=False, figures=False)
    doc = evaluate(model, [tmp_path / "broken.h5"], ["entropy"], tmp_path / "run", progress=False, figures=False,
                   resume=True, skip_bad=True)
    assert doc["timings"]["images"] == 5 and doc["skipped_frames"][0][:2] == ["broken", 4]


def test_any_torch_module_with_a_feature_hook(sets, tmp_path):
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    external = smp.create_model("fpn", encoder_name="resnet18", encoder_weights=None, classes=19).eval()
    fit = get_method("mahalanobis")
    doc = evaluate(external, [sets / "perlin_mixed.h5"], ["max_softmax", fit], tmp_path, progress=False,
                   figures=False, fit_set=sets / "cs.h5", feature_layer="decoder")
    assert doc["model"]["class"].endswith("FPN") and "dimreduce" in doc["model"]["served_heads"]
    assert 0 <= doc["results"]["mahalanobis"]["perlin_mixed"]["pooled"]["auroc"] <= 1
    assert doc["config"]["fit_set"]["file"] == "cs.h5"
    torch.save(external.state_dict(), tmp_path / "fpn.pt")  # a plain smp state dict: its wrapper is hooked too
    assert main(["evaluate", "--arch", "fpn", "--encoder", "resnet18", "--weights", str(tmp_path / "fpn.pt"),
                 "--feature-layer", "decoder", "--methods", "mahalanobis", "--fit-set", str(sets / "cs.h5"),
                 "--sets", str(sets / "perlin_mixed.h5"), "--out", str(tmp_path / "cli"), "--resamples", "0",
                 "--quiet"]) == 0
    cli = json.loads((tmp_path / "cli" / "results.json").read_text())["results"]["mahalanobis"]["perlin_mixed"]
    assert cli["pooled"]["auroc"] == doc["results"]["mahalanobis"]["perlin_mixed"]["pooled"]["auroc"]
    unfitted = get_method("mahalanobis")

    def no_fit(*args, **kwargs):
        raise AssertionError("a pass over the fit set before the folder was refused")

    unfitted.fit = no_fit
    with pytest.raises(ValueError, match="holds a different run"):  # fitted on another set: not the same run
        evaluate(external, [sets / "perlin_mixed.h5"], ["max_softmax", unfitted], tmp_path, progress=False,
                 figures=False, fit_set=sets / "perlin_mixed.h5", feature_layer="decoder", resume=True)
    with pytest.warns(UserWarning, match=rf"^fit_set \(--fit-set\) {sets / 'cs.h5'} is not used: none of "
                                         r"max_softmax, mahalanobis needs a fit \(or each came fitted\)$"):
        evaluate(external, [sets / "perlin_mixed.h5"], ["max_softmax", fit], None, progress=False, figures=False,
                 fit_set=sets / "cs.h5", feature_layer="decoder")  # (mahalanobis came fitted)


def test_results_tex_holds_the_tables_of_results_md(sets, tmp_path):
    """results.tex against results.md, cell for cell: the same values, intervals and bold, user names escaped,
    every environment closed."""
    import re

    names = {"perlin_50%&co": sets / "perlin_mixed.h5", "[plain] <copy> ≈": sets / "perlin_mixed.h5"}
    evaluate(tiny_network("dropout"), names, ["max_softmax", "entropy"], tmp_path / "run", progress=False,
             figures=False)
    tex = (tmp_path / "run/results.tex").read_text()
    md = (tmp_path / "run/results.md").read_text()
    assert tex.count("\\begin{") == tex.count("\\end{") == 2 * 2 * len(METRIC_NAMES)  # table and tabular, 8 tables
    assert "Method & perlin\\_50\\%\\&co & {[}plain{]} \\textless{}copy\\textgreater{} U+2248 \\\\" in tex
    assert "95\\% image-level" in tex
    md_rows = [line for line in md.splitlines() if line.startswith(("| max_softmax |", "| entropy |"))]
    tex_rows = [line for line in tex.splitlines() if line.startswith(("max\\_softmax &", "entropy &"))]
    assert len(tex_rows) == 2 * 2 * len(METRIC_NAMES)
    numbers = 0
    for md_row, tex_row in zip(md_rows, tex_rows):  # the pixel tables come first in both, in the same order
        md_cells = [c.strip() for c in md_row.strip("|").split("|")][1:]
        tex_cells = tex_row.removesuffix(" \\\\").split(" & ")[1:]
        assert len(md_cells) == len(tex_cells) == 2
        for m, t in zip(md_cells, tex_cells):
            assert re.findall(r"-?\d+\.\d+", m) == re.findall(r"-?\d+\.\d+", t)
            assert m.startswith("**") == t.startswith("\\textbf{")
            numbers += len(re.findall(r"-?\d+\.\d+", t))
    # a value per cell (2 cells, 2 aggregations, every metric) and intervals where they have width at 3 decimals
    assert 2 * 2 * len(METRIC_NAMES) < numbers <= 3 * 2 * 2 * len(METRIC_NAMES)


def test_combined_runs_count_the_same_frames_and_keep_each_methods_model(sets, tmp_path, monkeypatch):
    from segood.evaluation import combine_runs

    paths, options = [sets / "perlin_mixed.h5"], {"progress": False, "figures": False, "bootstrap": None}
    for method in ("entropy", "max_softmax", "energy"):
        evaluate(tiny_network(), paths, [method], tmp_path / method, **options)
    combine_runs([tmp_path / "entropy", tmp_path / "max_softmax"], tmp_path / "c1", figures=False, bootstrap=None)
    combine_runs([tmp_path / "c1", tmp_path / "energy"], tmp_path / "c2", figures=False, bootstrap=None)
    run = json.loads((tmp_path / "c2" / "run.json").read_text())  # (a combined run's models were nested away)
    examples = Evaluation.load(tmp_path / "c2" / "state.npz").examples  # one network: one prediction
    assert examples and all([f for f in ex if f.startswith("classes")] == ["classes"] for ex in examples.values())
    assert run["method_models"] == {m: str(tmp_path / m) for m in ("entropy", "max_softmax", "energy")}
    assert set(run["model"]) == {str(tmp_path / m) for m in ("entropy", "max_softmax", "energy")}
    with pytest.raises(ValueError, match="holds a run of its own, which the combined report would replace"):
        combine_runs([tmp_path / "entropy", tmp_path / "max_softmax"], tmp_path / "energy", figures=False)
    model = tiny_network()
    monkeypatch.setattr(model, "forward", killed_after(model, 2))
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, paths, ["max_logit"], tmp_path / "killed", batch_size=1, save_every=1, **options)
    with pytest.raises(ValueError, match="the runs counted other frames"):  # (mixed 4 frames with 2, silently)
        combine_runs([tmp_path / "entropy", tmp_path / "killed"], tmp_path / "c3", figures=False)


def test_the_report_says_which_pixels_each_set_has(sets, tmp_path):
    evaluate(tiny_network(), [sets / "perlin.h5", sets / "cs.h5", sets / "perlin_mixed.h5"], ["entropy"],
             tmp_path / "run", progress=False, figures=False, bootstrap=None)
    line = next(x for x in (tmp_path / "run" / "results.md").read_text().splitlines() if x.startswith("Sets: "))
    assert line.startswith("Sets: perlin (OOD pixels only), cs (no OOD pixels), perlin_mixed (ID:OOD = ")
    assert main(["report", str(tmp_path / "run"), "--commit-on", "cs"]) == 2  # (its committed tables were empty)
    assert main(["report", str(tmp_path / "run"), "--commit-on", "perlin_mixed", "-q"]) == 0


def test_latex_captions_say_what_each_table_bolds_and_the_csv_carries_both_flags(sets, tmp_path):
    from segood.metrics.bootstrap import Bootstrap

    evaluate(tiny_network(), [sets / "perlin_mixed.h5"], ["entropy", "max_softmax"], tmp_path / "run",
             progress=False, figures=False, bootstrap=Bootstrap(20))
    captions = [x for x in (tmp_path / "run" / "results.tex").read_text().splitlines() if x.startswith(r"\caption")]
    pooled = [c for c in captions if "pooled" in c]
    per_image = [c for c in captions if "per-image" in c]
    assert pooled and per_image
    assert all("not significantly worse (paired bootstrap)" in c for c in pooled)
    assert not any("significantly" in c for c in per_image)  # (they bold the best value only)
    header = (tmp_path / "run" / "results.csv").read_text().splitlines()[0].split(",")
    assert header[header.index("same_source_tuning") + 1] == "same_source_oe"


def test_a_name_with_a_bar_keeps_the_markdown_tables_whole(sets, tmp_path):
    evaluate(tiny_network(), {"a|b": sets / "perlin_mixed.h5", "cs": sets / "cs.h5"}, ["entropy"], tmp_path / "run",
             progress=False, figures=False, bootstrap=None, commit_on="a|b")
    for table in (tmp_path / "run" / "results.md").read_text().split("\n\n"):
        rows = [r for r in table.splitlines() if r.startswith("|")]
        cells = {len(re.split(r"(?<!\\)\|", r)) for r in rows}
        assert len(cells) <= 1, table  # (the header had a cell more than its rows)


def test_the_same_methods_of_two_networks_combine_named_by_their_runs(sets, tmp_path):
    from segood.evaluation import combine_runs

    paths, methods = [sets / "perlin_mixed.h5"], ["entropy", "max_softmax"]
    runs = {name: evaluate(network, paths, methods, tmp_path / name, progress=False, figures=False, bootstrap=None)
            for name, network in (("plain", tiny_network()), ("mcd", tiny_network("dropout", seed=1)))}
    doc = combine_runs([tmp_path / "plain", tmp_path / "mcd"], tmp_path / "both", bootstrap=None)
    assert list(doc["results"]) == [f"{m} ({name})" for name in runs for m in methods]  # (refused before)
    for name, run in runs.items():
        for m in methods:
            assert doc["results"][f"{m} ({name})"] == run["results"][m]
            assert doc["method_models"][f"{m} ({name})"] == str(tmp_path / name)
            assert doc["timings"]["per_method"][f"{m} ({name})"]["inference_ms_per_image"] == pytest.approx(
                run["timings"]["per_method"][m]["inference_ms_per_image"], rel=1e-12)  # its own network's time
    assert (tmp_path / "both" / "figures" / "examples_perlin_mixed.png").exists()
    assert main(["report", str(tmp_path / "both"), "-q"]) == 0  # rebuilt from the combined state alone
    # the example frames keep each network's predicted classes (the panels showed the last run's for both)
    examples = Evaluation.load(tmp_path / "both" / "state.npz").examples
    assert examples and all(sorted(f for f in ex if f.startswith("classes")) == ["classes (mcd)", "classes (plain)"]
                            for ex in examples.values())
    for name, run in runs.items():
        for key, ex in run.state.examples.items():
            assert np.array_equal(examples[key][f"classes ({name})"], ex["classes"])
    assert not all(np.array_equal(ex["classes (mcd)"], ex["classes (plain)"]) for ex in examples.values())


def test_the_printed_table_marks_values_the_grid_cannot_pin_down(sets, tmp_path, capsys):
    """ODIN at T = 1000 on the paper's linear grid saturates into one bin: its AUROC of 0.5 is marked ≈ where it is
    printed, as results.md marks it (the printed table gave no hint)."""
    assert main(["evaluate", "--checkpoint", str(_checkpoint(tmp_path)), "--sets", str(sets / "perlin_mixed.h5"),
                 "--methods", "odin", "--num-thresholds", "400", "--resamples", "0", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.strip().startswith("odin"))
    assert "≈" in row and "≈ the grid's bins leave the value more than" in printed


def _checkpoint(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny_network())
    return tmp_path / "m.pt"


def hand_run(seed=0, frames=(6, 4), size=(4, 4)):
    """A run accumulated by hand, without a network: sets "a" and "b" of ``frames`` frames with ID, OOD and ignore
    pixels in each and pixels of three classes and of none; methods "good" (every OOD pixel above every ID pixel)
    and "poor" (random), scores k/64 (thresholds of the float-order grid: exact values), batches of two frames.
    Returns the evaluation, the run description build_results reads and {set: (ood masks, classes, {method:
    scores})} for the references."""
    rng = np.random.default_rng(seed)
    ev = Evaluation(["good", "poor"], ["a", "b"])
    pixels = {}
    for s, n in zip(("a", "b"), frames):
        ood = rng.choice(np.array([0, 1, 255], np.uint8), (n, *size), p=[0.5, 0.3, 0.2])
        ood[:, 0, 0], ood[:, 0, 1] = 0, 1
        semantic = rng.choice(np.array([0, 1, 13, 255], np.uint8), (n, *size))
        scores = {"good": (rng.integers(0, 32, (n, *size)) + 32 * (ood == 1)) / 64,
                  "poor": rng.integers(0, 64, (n, *size)) / 64}
        scores = {m: v.astype(np.float32) for m, v in scores.items()}
        for k in range(0, n, 2):
            part = slice(k, k + 2)
            batch = {"image": torch.zeros((len(ood[part]), 3, *size), dtype=torch.uint8),
                     "ood_mask": torch.from_numpy(ood[part]), "semantic": torch.from_numpy(semantic[part])}
            ev.process(s, list(range(n))[part], batch, {m: torch.from_numpy(v[part]) for m, v in scores.items()})
        pixels[s] = ood, semantic, scores
    run = {"toolkit": {"segood_version": "test"}, "config": {"grid": ev.grid},
           "methods": {m: {"params": {}} for m in ev.method_names},
           "sets": {s: {"ood_sources": ["noise"], "frames": n} for s, n in zip(("a", "b"), frames)}}
    return ev, run, pixels


def test_a_report_by_hand_counts_each_sets_pixels_under_its_own_method_and_set_once():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from segood.evaluation.report import build_results

    ev, run, pixels = hand_run()
    ev.seconds.update({"data": 0.5, "forward": 1.8, "accumulate": 0.25, "score/good": 0.6, "score/poor": 0.2})
    doc = build_results(run, ev, bootstrap=None)
    for s, (ood, semantic, scores) in pixels.items():
        counted = ood <= 1
        n_id, n_ood = int((ood == 0).sum()), int((ood == 1).sum())
        for m, score in scores.items():
            r = doc["results"][m][s]
            assert (r["n_id"], r["n_ood"], r["n_ignored"]) == (n_id, n_ood, int((ood == 255).sum()))
            assert r["id_to_ood_ratio"] == n_id / n_ood
            assert r["pooled"]["auroc"] == pytest.approx(roc_auc_score(ood[counted], score[counted]), abs=1e-12)
            assert r["pooled"]["auprc"] == pytest.approx(average_precision_score(ood[counted], score[counted]),
                                                         abs=1e-12)
            per_image = [roc_auc_score(o[o <= 1], x[o <= 1]) for o, x in zip(ood, score)]
            assert r["per_image_mean"]["auroc"] == pytest.approx(np.mean(per_image), abs=1e-12)
            assert r["per_image_mean"]["n_images_total"] == len(ood)
            # the mean score of each class's pixels, whatever their OOD label; a class without pixels: None
            means = doc["per_class_mean_score"][m][s]
            for c, name in ((0, "road"), (1, "sidewalk"), (13, "car")):
                assert means[name] == pytest.approx(float(score[semantic == c].astype(np.float64).mean()), abs=1e-12)
            assert means["bus"] is None
        assert doc["results"]["good"][s]["pooled"]["auroc"] == 1.0
        for i in range(3):  # the first three frames of each set are kept as examples, as they are
            example = ev.examples.pop((s, i))
            assert np.array_equal(example["ood_mask"], ood[i])
            assert np.array_equal(example["score_poor"], scores["poor"][i])
    assert not ev.examples
    timings = doc["timings"]
    assert timings["images"] == 10 and timings["images_per_set"] == {"a": 6, "b": 4}
    assert timings["ms_per_image"]["forward"] == pytest.approx(180.0)
    assert timings["ms_per_image"]["score/good"] == pytest.approx(60.0)
    # per megapixel: every pixel of the frames (ignored ones too, as the network sees them): 10 frames of 16
    assert timings["per_method"]["good"] == pytest.approx({
        "inference_ms_per_image": 180.0, "scoring_ms_per_image": 60.0,
        "inference_ms_per_megapixel": 1e9 * 1.8 / 160, "scoring_ms_per_megapixel": 1e9 * 0.6 / 160})
    assert timings["per_method"]["poor"]["scoring_ms_per_image"] == pytest.approx(20.0)
    assert build_results(run, Evaluation.from_arrays(ev.arrays()), bootstrap=None) == doc  # (what a report reads)


def test_bold_intervals_ranks_and_csv_rows_follow_each_metrics_direction_and_aggregation():
    """"good" beats "poor" on every set and metric: it ranks first, and it alone is bold, in the tables of the
    higher-is-better AUROC and of the lower-is-better FPR95, pooled and per image. The intervals are those of the
    paired bootstrap with the settings given (resamples, seed, confidence); each table and CSV row shows its own
    aggregation's; ≈ marks pooled values only."""
    import csv as csv_module
    import io

    from segood.evaluation.report import build_results, metric_tables, results_csv, too_coarse
    from segood.metrics import METRICS
    from segood.metrics.bootstrap import Bootstrap, compare

    ev, run, _ = hand_run(seed=1, frames=(8, 8))
    settings = Bootstrap(60, seed=3, confidence=0.8)
    doc = build_results(run, ev, bootstrap=settings)
    assert {k: doc["bootstrap"][k] for k in ("resamples", "seed", "confidence")} == \
        {"resamples": 60, "seed": 3, "confidence": 0.8}
    for s in ("a", "b"):
        results = {m: doc["results"][m][s] for m in ("good", "poor")}
        expected = compare({m: ev.acc[(m, s)].images for m in results}, settings,
                           points={m: {k: r["pooled"][k] for k in METRICS} for m, r in results.items()})
        for m, r in results.items():
            assert r["intervals"] == expected["intervals"][m]
            assert r["per_image_intervals"] == expected["per_image_intervals"][m]
        for metric in ("auroc", "auprc", "fpr95"):
            assert doc["comparisons"][s]["ranks"][metric] == {"good": 1, "poor": 2}, metric
    assert doc["results"]["poor"]["a"]["intervals"] != build_results(run, ev, bootstrap=Bootstrap(60))[
        "results"]["poor"]["a"]["intervals"]  # (another seed, other resamples)
    doc["results"]["poor"]["a"]["bounds"]["auroc"] = [0.0, 1.0]  # a pooled value the binning leaves far from exact
    for metric, title, columns, rows in metric_tables(doc):
        assert columns == ["a", "b"]
        cells = dict(rows)
        aggregation = "pooled" if title.startswith("pooled") else "per_image_mean"
        intervals = "intervals" if aggregation == "pooled" else "per_image_intervals"
        for m, row in cells.items():
            for s, cell in zip(columns, row):
                r = doc["results"][m][s]
                assert cell.value == r[aggregation][metric]
                if metric in ("auroc", "auprc", "fpr95"):
                    assert cell.top == (m == "good"), (metric, title, m, s)
                if (metric, m, s) == ("auroc", "poor", "a"):
                    assert cell.coarse == (aggregation == "pooled")
                lo, hi = r[intervals][metric]
                assert cell.interval == (None if f"{lo:.3f}" == f"{hi:.3f}" else (lo, hi)), (metric, title, m, s)
                assert cell.coarse == (aggregation == "pooled" and too_coarse(metric, r))
    # per-image tables bold the best per-image mean (the paired ranks are of pooled values)
    doc["results"]["good"]["b"]["per_image_mean"]["auroc"] = 0.25
    tables = {(metric, title.startswith("pooled")): dict(rows) for metric, title, _, rows in metric_tables(doc)}
    assert [tables[("auroc", pooled)][m][1].top for pooled in (True, False) for m in ("good", "poor")] == \
        [True, False, False, True]
    rows = list(csv_module.DictReader(io.StringIO(results_csv(doc))))
    assert [(row["method"], row["set"], row["aggregation"]) for row in rows] == [
        (m, s, a) for m in ("good", "poor") for s in ("a", "b") for a in ("pooled", "per-image mean")]
    for row in rows:
        r = doc["results"][row["method"]][row["set"]]
        pooled = row["aggregation"] == "pooled"
        values, intervals = (r["pooled"], r["intervals"]) if pooled else (r["per_image_mean"], r["per_image_intervals"])
        for metric in METRICS:
            assert float(row[metric]) == values[metric]
            assert [float(row[f"{metric}_ci_low"]), float(row[f"{metric}_ci_high"])] == intervals[metric]
            assert [float(row[f"{metric}_bin_low"]), float(row[f"{metric}_bin_high"])] == r["bounds"][metric] \
                if pooled else row[f"{metric}_bin_low"] == row[f"{metric}_bin_high"] == ""
        assert (row["n_id"], row["n_ood"]) == ((str(r["n_id"]), str(r["n_ood"])) if pooled else ("", ""))
        assert row["n_images"] == ("" if pooled else str(r["per_image_mean"]["n_images"]))


def test_monte_carlo_dropout_is_seeded_by_the_seed_the_set_and_the_frame_in_any_batch(sets, tmp_path):
    """Each frame draws its own dropout masks, from sha256 of (seed, set, frame), so a run in batches of another size,
    with its sets in another order, resumed or sharded draws the same; the same masks for every frame would score
    alike frames alike."""
    from segood.methods.schedule import frame_seeds, score_frames

    model, paths = tiny_network("dropout"), {"cs": sets / "cs.h5", "perlin_mixed": sets / "perlin_mixed.h5"}
    assert frame_seeds(0, "cs", [0, 1]) == [464411759021519098, 6835149610321464522]  # (its literal values)
    doc = evaluate(model, paths, ["varsum"], tmp_path / "run", batch_size=1, progress=False, figures=False,
                   bootstrap=None)
    described = json.loads((tmp_path / "run" / "run.json").read_text())
    assert described["config"]["mc_seeds"] == "per frame"  # (a run of the per-batch seeds, without it: not resumed)
    del described["config"]["mc_seeds"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text(json.dumps(described))
    with pytest.raises(ValueError, match=r"holds a different run \(config.mc_seeds: \(none\) -> \"per frame\""):
        evaluate(model, paths, ["varsum"], tmp_path / "old", batch_size=1, progress=False, resume=True)
    for name, path in paths.items():
        data = H5SegmentationDataset(path)
        for frame in range(2):
            want = score_frames(model, data[frame]["image"][None], [get_method("varsum")],
                                mc_seeds=frame_seeds(0, name, [frame])).scores[0][0]
            np.testing.assert_array_equal(doc.state.examples[(name, frame)]["score_varsum"], want.float().numpy())
        called = get_method("varsum")(model, data[1]["image"], seeds=frame_seeds(0, name, [1]))  # (the Python API)
        np.testing.assert_array_equal(doc.state.examples[(name, 1)]["score_varsum"], called.float().numpy())
    both = score_frames(model, torch.stack([data[0]["image"], data[1]["image"]]), [get_method("varsum")],
                        mc_seeds=frame_seeds(0, name, [0, 1])).scores[0]
    assert not torch.equal(both[0], both[1])
    for frame in range(2):  # the frame's samples in a batch of two: its own, to the network's last bits
        np.testing.assert_allclose(both[frame].numpy(), doc.state.examples[(name, frame)]["score_varsum"],
                                   rtol=1e-4, atol=1e-6)
    other = evaluate(model, dict(reversed(paths.items())), ["varsum"], None, batch_size=3, progress=False,
                     figures=False, bootstrap=None)
    for name in paths:
        assert other["results"]["varsum"][name]["pooled"]["auroc"] == pytest.approx(
            doc["results"]["varsum"][name]["pooled"]["auroc"], abs=1e-6)


def test_a_pooled_value_is_too_coarse_where_either_bound_lies_beyond_a_hundredth():
    from segood.evaluation.report import too_coarse

    def result(lo, hi):
        return {"pooled": {"auroc": 0.5}, "bounds": {"auroc": [lo, hi]}}

    assert too_coarse("auroc", result(0.499, 0.52)) and too_coarse("auroc", result(0.48, 0.5))  # one side is enough
    assert not too_coarse("auroc", result(0.495, 0.505)) and not too_coarse("auroc", result(0.4925, 0.5075))
    assert not too_coarse("auroc", {"pooled": {"auroc": 0.5}}) and not too_coarse("auprc", result(0.0, 1.0))


def test_the_command_line_passes_batch_size_and_skip_bad_on(sets, tmp_path):
    broken = tmp_path / "broken.h5"  # perlin_mixed with frame 1 damaged
    shutil.copy(sets / "perlin_mixed.h5", broken)
    shutil.copy(sets / "perlin_mixed.manifest.json", tmp_path / "broken.manifest.json")
    with h5py.File(broken, "r+") as f:
        f["images"]["1"].id.write_direct_chunk((0, 0, 0), b"not a deflate stream")
    argv = ["evaluate", "--checkpoint", str(_checkpoint(tmp_path)), "--sets", str(broken), "--methods", "entropy",
            "--resamples", "0", "--batch-size", "3", "-q"]
    assert main([*argv, "--out", str(tmp_path / "strict")]) == 2  # (the damaged frame stops the run)
    with pytest.warns(UserWarning, match=r"^1 unreadable frame was passed over \(--skip-bad\) and is in no number "
                                         r"here: 1 of broken \(e\.g\. frame 1 of broken: .*\); results\.json lists "
                                         r"them \(skipped_frames\)\.$"):
        assert main([*argv, "--skip-bad", "--out", str(tmp_path / "run")]) == 0
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["config"]["batch_size"] == 3 and [entry[:2] for entry in doc["skipped_frames"]] == [["broken", 1]]
    assert "1 unreadable frame was passed over" in (tmp_path / "run" / "results.md").read_text()
    assert not any(note.startswith("The run is unfinished") for note in doc["notes"])  # (a skipped frame is done)


def test_a_run_in_memory_reports_as_a_run_in_a_folder(sets, tmp_path):
    """Without out_dir the bootstrap and the committed thresholds are those asked for, as in a folder's report."""
    from segood.metrics.bootstrap import Bootstrap

    paths = {"perlin_mixed": sets / "perlin_mixed.h5", "cs": sets / "cs.h5"}
    options = {"progress": False, "bootstrap": Bootstrap(20, seed=3, confidence=0.8), "commit_on": "perlin_mixed"}
    memory = evaluate(tiny_network(), paths, ["entropy", "max_softmax"], **options)
    folder = evaluate(tiny_network(), paths, ["entropy", "max_softmax"], tmp_path / "run", figures=False, **options)
    assert memory["bootstrap"] == folder["bootstrap"] and memory["bootstrap"]["resamples"] == 20
    assert memory["commit_on"] == "perlin_mixed" and memory["results"] == folder["results"]
    assert memory["results"]["entropy"]["perlin_mixed"]["intervals"]["auroc"][0] is not None


def test_a_method_named_twice_is_refused_before_anything_is_written(sets, tmp_path):
    from segood.evaluation.exchange import export_scores

    model = tiny_network()
    for run in (lambda out: evaluate(model, [sets / "perlin_mixed.h5"], ["entropy", "max_logit", "entropy"], out,
                                     progress=False),
                lambda out: export_scores(model, {"p": sets / "perlin_mixed.h5"}, [get_method("entropy")] * 2, out,
                                          progress=False)):
        with pytest.raises(ValueError, match=r"^entropy named twice: give each method once"):
            run(tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_a_folder_holding_another_commands_output_is_refused(sets, tmp_path):
    """An evaluation, a protocol and an attack each refuse an --out that holds another one's output."""
    from segood.attack.run import attack
    from segood.evaluation.protocol import cross_source

    model = tiny_network()
    runs = {"run.json": lambda out: evaluate(model, [sets / "perlin_mixed.h5"], ["entropy"], out, progress=False),
            "protocol.json": lambda out: cross_source(model, {"t": sets / "perlin_mixed.h5"},
                                                      {"n": sets / "normal_mixed.h5"}, ["entropy"], out),
            "attack.json": lambda out: attack(["entropy=m.pt"], sets / "perlin_mixed.h5", out)}
    for own, run in runs.items():
        for other, what in (("run.json", r"an evaluation \(segood evaluate, score or robustness\)"),
                            ("protocol.json", r"a protocol \(segood protocol\)"),
                            ("attack.json", r"an attack \(segood attack\)")):
            if other != own:
                out = tmp_path / f"{own}-{other}"
                out.mkdir()
                (out / other).write_text("{}")
                with pytest.raises(ValueError, match=rf"^{out} holds {what} \({other}\); choose another --out$"):
                    run(out)
                assert sorted(p.name for p in out.iterdir()) == [other]


def test_resuming_a_folder_with_nothing_saved_says_so(sets, tmp_path):
    with pytest.warns(UserWarning, match=rf"^nothing to resume in {tmp_path / 'run'} \(no state.npz\): the run starts "
                                         "afresh$"):
        evaluate(tiny_network(), [sets / "perlin_mixed.h5"], ["entropy"], tmp_path / "run", resume=True,
                 progress=False, figures=False)
    assert (tmp_path / "run" / "state.npz").exists()


def test_an_out_that_is_a_file_is_refused(sets, tmp_path):
    from segood.models.train import TrainConfig, train

    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'taken'} is a file; --out names the folder a run writes$"):
        evaluate(tiny_network(), [sets / "perlin_mixed.h5"], ["entropy"], tmp_path / "taken", progress=False)
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'taken'} is a file; --out names the folder a training"):
        train(TrainConfig(str(sets / "perlin_mixed.h5"), str(tmp_path / "taken")), progress=False)
    assert (tmp_path / "taken").read_text() == "a file"
