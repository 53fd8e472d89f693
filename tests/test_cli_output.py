"""What the commands print, read back: a compact table per set with the benchmark's headline metric first (the
set's source decides), -q for nothing and -v for the full report; a line for every file a command writes;
export folders named as the benchmark names its splits; ``segood metrics`` on a run's own state; example panels
whose heat maps each span their method's own percentiles."""

import json
import os
import re

import numpy as np
import pytest

from segood.cli import main
from segood.data import convert
from segood.data.benchmarks import benchmark_of, headline_metrics, split_name
from segood.data.smiyc import RoadAnomaly21
from segood.models import save_checkpoint

from networks import tiny_network
from rawtrees import smiyc_tree
from test_anomaly_benchmarks import ANOMALY_FRAMES

METHODS = ["entropy", "max_logit"]


@pytest.fixture(scope="module")
def world(noise_sets, tmp_path_factory):
    """A checkpoint, the noise sets and a converted SMIYC RoadAnomaly21 validation split."""
    root = tmp_path_factory.mktemp("output")
    save_checkpoint(root / "m.pt", tiny_network())
    smiyc_tree(root / "dataset_AnomalyTrack", "dataset_AnomalyTrack", ANOMALY_FRAMES)
    convert(RoadAnomaly21(root / "dataset_AnomalyTrack", "validation"), root / "ra21_val.h5", size=(64, 64),
            progress=False)
    return {"root": root, "sets": noise_sets(kinds=("perlin",), seed=3)}


@pytest.fixture(scope="module")
def run(world):
    """An evaluation from the command line at the default verbosity, and what it printed."""
    out = world["root"] / "run"
    argv = ["evaluate", "--checkpoint", str(world["root"] / "m.pt"), "--sets", str(world["sets"] / "perlin_mixed.h5"),
            str(world["root"] / "ra21_val.h5"), str(world["sets"] / "cs.h5"), "--methods", *METHODS,
            "--resamples", "0", "--out", str(out)]
    return out, argv


def table(printed, set_name):
    """{method: {column label: value or None}} of the compact table of ``set_name``, rows in printed order."""
    lines = printed.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"{set_name} ("))
    header = lines[start + 1].split()[1:]
    labels = [h for h in header if h not in "↑↓"]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("  "):
            break
        name, *cells = line.split()
        rows[name] = {label: None if c == "–" else float(c.rstrip("*≈")) for label, c in zip(labels, cells)}
    return lines[start], labels, rows


def test_evaluate_prints_one_compact_table_per_set_and_the_report_path(run, capsys):
    out, argv = run
    assert main(argv) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    title, labels, rows = table(printed, "perlin_mixed")  # noise: the paper's protocol, AUROC first
    assert "AUROC first" in title and labels == ["AUROC", "AUPRC", "FPR95", "MaxIoU"]
    assert list(rows) == sorted(METHODS, key=lambda m: -doc["results"][m]["perlin_mixed"]["pooled"]["auroc"])
    title, labels, rows = table(printed, "ra21_val")  # SegmentMeIfYouCan: AUPRC, then FPR95
    assert "SegmentMeIfYouCan: AUPRC, FPR95 first" in title and labels[:2] == ["AUPRC", "FPR95"]
    for m in METHODS:
        pooled = doc["results"][m]["ra21_val"]["pooled"]
        assert rows[m] == {"AUPRC": pytest.approx(pooled["auprc"], abs=5e-5),
                           "FPR95": pytest.approx(pooled["fpr95"], abs=5e-5),
                           "AUROC": pytest.approx(pooled["auroc"], abs=5e-5),
                           "MaxIoU": pytest.approx(pooled["max_iou"], abs=5e-5)}
    assert "cs: no OOD pixels, so no OOD metric is defined" in printed
    # nothing else: the tables, then one line with the full report's path
    assert "##" not in printed and "|" not in printed
    assert printed.rstrip().splitlines()[-1] == (f"wrote {out}/: results.md (the full report), results.json, "
                                                 "results.csv, results.tex, figures/")
    assert len([line for line in printed.splitlines() if line]) == 2 * (2 + len(METHODS)) + 1 + 1 + \
        printed.count("≈ the grid's bins")  # (a footnote under a table whose values the bins leave far from exact)


def test_quiet_prints_nothing_and_verbose_the_whole_report(run, capsys):
    out, argv = run
    assert main([*argv, "--resume", "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "evaluate perlin_mixed" not in captured.err  # no progress bars either
    assert main([*argv, "--resume", "-v"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith((out / "results.md").read_text()) and "## AUROC ↑ (pooled over all pixels)" in printed
    assert main(["report", str(out), "--resamples", "0"]) == 0  # report and score print alike
    printed = capsys.readouterr().out
    assert "ra21_val (SegmentMeIfYouCan" in printed and "##" not in printed
    assert main(["report", str(out), "--resamples", "0", "-q"]) == 0 and capsys.readouterr().out == ""
    assert main(["report", str(out), "--out", str(out.parent / "elsewhere")]) == 2  # (it was ignored)
    assert "--out names the folder of a combined report" in capsys.readouterr().err


def test_metrics_reads_a_run_state(run, capsys):
    out, argv = run
    if not (out / "state.npz").exists():
        assert main([*argv, "-q"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert main(["metrics", str(out / "state.npz")]) == 0
    printed = capsys.readouterr().out
    for set_name in ("perlin_mixed", "ra21_val"):
        _, labels, rows = table(printed, set_name)
        assert set(rows) == set(METHODS)
        for m in METHODS:
            pooled = doc["results"][m][set_name]["pooled"]
            assert rows[m]["AUROC"] == pytest.approx(pooled["auroc"], abs=5e-5)
            assert rows[m]["FPR95"] == pytest.approx(pooled["fpr95"], abs=5e-5)
    assert "SegmentMeIfYouCan" in printed  # the sets' sources from run.json beside the state
    from segood.evaluation.report import summary_text

    assert printed == summary_text(doc)  # what evaluate printed, with its ≈ marks
    assert main(["metrics", str(out / "state.npz"), "--curves", str(out / "c.csv")]) == 2
    assert "is an evaluation state" in capsys.readouterr().err


def test_headline_metrics_follow_the_benchmark_of_the_sets_source():
    metrics = ["auroc", "auprc", "fpr95", "max_iou"]
    assert headline_metrics(["smiyc_roadobstacle21"], metrics) == ["auprc", "fpr95", "auroc", "max_iou"]
    assert headline_metrics(["fishyscapes_static"], metrics) == ["auprc", "fpr95", "auroc", "max_iou"]
    assert headline_metrics(["sun2012"], metrics) == metrics and headline_metrics(None, metrics) == metrics
    assert benchmark_of(["lostandfound"]).label == "SegmentMeIfYouCan"
    assert benchmark_of(["fishyscapes_laf"]).label == "Fishyscapes"
    assert benchmark_of(["perlin_noise"]).label == "the paper's protocol"
    assert benchmark_of(["streethazards"]).label == benchmark_of(["bdd_anomaly"]).label == "CAOS"


@pytest.mark.parametrize("manifest, layout, name", [
    # SegmentMeIfYouCan's name_for_persistence: the folder its Evaluation reads a split's maps from
    ({"source": "smiyc_roadanomaly21", "split": "validation"}, "smiyc", "AnomalyTrack-all"),
    ({"source": "smiyc_roadobstacle21", "split": "night"}, "smiyc", "ObstacleTrack-all"),
    ({"source": "lostandfound", "split": "testNoKnown"}, "smiyc", "LostAndFound-test"),
    ({"source": "lostandfound", "split": "train"}, "smiyc", "LostAndFound-train"),
    ({"source": "fishyscapes_laf", "split": "val"}, "fishyscapes", "LostAndFound"),
    ({"source": "fishyscapes_static", "split": "val"}, "fishyscapes", "Static"),
    ({"source": "smiyc_roadanomaly21", "split": "validation"}, "fishyscapes", None),
    ({"source": "mix", "split": "eval"}, "smiyc", None),
])
def test_split_names(manifest, layout, name):
    assert split_name(manifest, layout) == name
    with pytest.raises(ValueError, match="reads the maps of Fishyscapes Lost & Found from its LostAndFound-train"):
        split_name({"source": "fishyscapes_laf", "split": "val"}, "smiyc")


def test_export_folders_carry_the_benchmarks_names_and_every_write_is_said(world, tmp_path, capsys):
    checkpoint, ra21 = str(world["root"] / "m.pt"), str(world["root"] / "ra21_val.h5")
    perlin = str(world["sets"] / "perlin_mixed.h5")
    export = ["export", "--checkpoint", checkpoint, "--sets", ra21, perlin, "--methods", "entropy", "--layout", "smiyc"]
    assert main([*export, "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""  # (-q: nothing but warnings and errors)
    assert main([*export, "--out", str(tmp_path / "ex")]) == 0
    printed = capsys.readouterr().out.splitlines()
    folder = tmp_path / "ex" / "anomaly_p" / "entropy" / "AnomalyTrack-all"
    assert sorted(p.name for p in folder.iterdir()) == ["validation0000.hdf5", "validation0001.hdf5"]
    assert (tmp_path / "ex" / "anomaly_p" / "entropy" / "perlin_mixed").is_dir()  # not a benchmark's split
    assert printed == [f"wrote {folder}: entropy scores of ra21_val",
                       f"wrote {tmp_path / 'ex' / 'anomaly_p' / 'entropy' / 'perlin_mixed'}: entropy scores of "
                       "perlin_mixed"]
    assert main(["score", "--scores", str(folder), "--data", ra21, "--out", str(tmp_path / "scored"),
                 "--name", "entropy"]) == 0
    assert "ra21_val (SegmentMeIfYouCan: AUPRC, FPR95 first" in capsys.readouterr().out

    bench = tmp_path / "b" / "bench.json"
    assert main(["benchmark", "--track", "t", "--sets", perlin, "--private", "perlin_mixed", "--out", str(bench)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {bench}: track t, 1 set, ranked by auroc",
        f"wrote {bench.parent / 'perlin_mixed.public.h5'}: the public copy of perlin_mixed (images, no masks)"]
    assert bench.exists() and (bench.parent / "perlin_mixed.public.h5").exists()

    from segood.metrics import PixelOODAccumulator

    PixelOODAccumulator(10).update(np.array([0.1, 0.9, 0.4]), np.array([0, 1, 1], np.uint8)).save(tmp_path / "a.npz")
    curves = tmp_path / "new" / "c.csv"  # (into a folder not there yet: made, as every output's)
    assert main(["metrics", str(tmp_path / "a.npz"), "--curves", str(curves)]) == 0
    assert re.search(rf"wrote {re.escape(str(curves))}: the counts at each of \d+ thresholds",
                     capsys.readouterr().out)
    assert curves.read_text().splitlines()[0] == "threshold,tp,fp,fn,tn" and os.listdir(curves.parent) == ["c.csv"]


# example panels: every method's heat map on its own scale

def test_heat_limits_are_each_methods_own_percentiles():
    from segood.evaluation.report import heat_limits

    rng = np.random.default_rng(0)
    small = [rng.uniform(0, 0.002, (8, 8)) for _ in range(3)]  # VarSum-like: far below 1
    assert heat_limits(small) == pytest.approx(tuple(np.percentile(np.concatenate([m.ravel() for m in small]),
                                                                   [1, 99])))
    assert heat_limits(small)[1] < 0.002
    logits = [rng.normal(-5, 3, (8, 8)), np.array([[np.inf, np.nan]])]  # unbounded, non-finite values left out
    assert heat_limits(logits) == pytest.approx(tuple(np.percentile(logits[0], [1, 99])))
    assert heat_limits([np.full((4, 4), 0.3)]) == pytest.approx((-0.2, 0.8))  # constant: a unit-wide range
    assert heat_limits([np.array([np.nan])]) == (0.0, 1.0)
    assert heat_limits(small, (5, 95)) == pytest.approx(tuple(np.percentile(np.concatenate(small), [5, 95])))


def test_example_panels_draw_each_method_on_its_own_scale_and_say_so(run, tmp_path, monkeypatch):
    import matplotlib.axes
    import matplotlib.figure

    from segood.evaluation import Evaluation, report
    from segood.evaluation.report import heat_limits, write_figures

    out, argv = run
    if not (out / "state.npz").exists():
        assert main([*argv, "-q"]) == 0
    doc = json.loads((out / "results.json").read_text())
    ev = Evaluation.load(out / "state.npz")
    drawn, captions, saved = [], [], {}
    imshow, text, save = matplotlib.axes.Axes.imshow, matplotlib.figure.Figure.text, report._save
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", lambda ax, panel, **kw: (
        drawn.append((ax.figure, panel, kw.get("vmin"), kw.get("vmax"))), imshow(ax, panel, **kw))[1])
    monkeypatch.setattr(matplotlib.figure.Figure, "text", lambda fig, x, y, s, **kw: (
        captions.append((fig, s)), text(fig, x, y, s, **kw))[1])
    monkeypatch.setattr(report, "_save", lambda fig, path, **kw: (saved.update({id(fig): path.name}),
                                                                  save(fig, path, **kw))[1])
    write_figures(tmp_path / "figures", doc, ev)
    assert (tmp_path / "figures" / "examples_ra21_val.png").stat().st_size > 5000
    for s in ("perlin_mixed", "ra21_val"):
        keys = sorted(k for k in ev.examples if k[0] == s)
        panels = [(panel, vmin, vmax) for fig, panel, vmin, vmax in drawn if saved[id(fig)] == f"examples_{s}.png"]
        for m in METHODS:
            maps = [ev.examples[k][f"score_{m}"] for k in keys]
            limits = heat_limits(maps)
            low, high = np.percentile(np.concatenate([x.ravel() for x in maps]), [1, 99])
            assert limits == pytest.approx((low, high))
            shown = [(vmin, vmax) for panel, vmin, vmax in panels
                     if any(np.array_equal(panel, x.astype(np.float32)) for x in maps)]
            assert len(shown) == len(keys) and all(v == pytest.approx(limits) for v in shown), (s, m)
        assert [c for fig, c in captions if saved[id(fig)] == f"examples_{s}.png"] == [
            "Heat maps: each method's scale spans the 1st to 99th percentile of its own scores on these frames "
            "(dark: most in-distribution, bright: most OOD)."]


def test_a_per_image_protocol_is_summarised_by_its_per_image_means():
    from segood.evaluation.report import summary_text

    def cell(pooled, per_image):
        return {"pooled": {"auroc": pooled, "auprc": 0.5, "fpr95": 0.5, "max_iou": 0.5}, "n_ood": 10,
                "per_image_mean": {"auroc": per_image, "auprc": 0.4, "fpr95": 0.6, "max_iou": None}}

    doc = {"results": {"a": {"sh": cell(0.9, 0.6)}, "b": {"sh": cell(0.8, 0.7)}},
           "sets": {"sh": {"ood_sources": ["streethazards"], "frames": 2,
                           "per_image_headline": "per-image mean, StreetHazards' protocol"}}}
    title, labels, rows = table(summary_text(doc), "sh")
    assert title == "sh (CAOS: AUROC, AUPRC, FPR95 first; 2 images; per-image mean, StreetHazards' protocol, " \
                    "* the best)"
    assert list(rows) == ["b", "a"] and rows["b"]["AUROC"] == 0.7 and rows["a"]["MaxIoU"] is None
    del doc["sets"]["sh"]["per_image_headline"]
    title, labels, rows = table(summary_text(doc), "sh")
    assert "pooled, * the best" in title and list(rows) == ["a", "b"] and rows["a"]["AUROC"] == 0.9


def test_a_benchmark_headed_by_auprc_ranks_its_methods_by_auprc():
    """SegmentMeIfYouCan's headline is AUPRC: its table leads with it and ranks by it, though AUROC says otherwise."""
    from segood.evaluation.report import summary_text

    def cell(auroc, auprc):
        return {"pooled": {"auroc": auroc, "auprc": auprc, "fpr95": 0.5, "max_iou": 0.5}, "n_ood": 10}

    doc = {"results": {"a": {"ra": cell(0.9, 0.2)}, "b": {"ra": cell(0.8, 0.6)}},
           "sets": {"ra": {"ood_sources": ["smiyc_roadanomaly21"], "frames": 2}}}
    title, labels, rows = table(summary_text(doc), "ra")
    assert labels == ["AUPRC", "FPR95", "AUROC", "MaxIoU"] and list(rows) == ["b", "a"]


def test_an_output_named_like_an_input_is_refused_before_any_work(world, tmp_path, capsys):
    """``--out SET.h5`` (a slip of the fingers) would have replaced the set with a zip, a benchmark or a generator,
    and ``--curves STATE.npz`` the state with a CSV: each output must be of its own kind."""
    import hashlib
    import shutil

    from segood.metrics import PixelOODAccumulator

    perlin = tmp_path / "perlin_mixed.h5"
    shutil.copy(world["sets"] / "perlin_mixed.h5", perlin)
    state = tmp_path / "a.npz"
    PixelOODAccumulator(10).update(np.array([0.1, 0.9]), np.array([0, 1], np.uint8)).save(state)
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (perlin, state)}
    for argv, expected in [
            (["benchmark", "--track", "t", "--sets", str(perlin), "--out", str(perlin)], "give a .json file"),
            (["benchmark", "--track", "", "--sets", str(perlin), "--out", str(tmp_path / "b.json")],
             "a track's name must be printable text, not blank, got '' (--track NAME)"),
            (["benchmark", "--track", "a\tb", "--sets", str(perlin), "--out", str(tmp_path / "b.json")],
             "got 'a\\tb'"),
            (["submit", "--scores", f"perlin_mixed={perlin}", "--method-name", "E", "--out", str(perlin)],
             "give a .zip file for the submission"),
            (["attack-generator", "--out", str(perlin), "--quiet"], "give a .pt file for the generator"),
            (["metrics", str(state), "--curves", str(state)], "--curves " + str(state) + ": give a .csv file"),
            (["convert", "noise", "--kind", "normal", "--count", "1", "--size", "8", "8", "--out", str(state),
              "--overwrite", "--quiet"], f"--out {state}: give a .h5 file for the set"),
            (["convert", "mix", "--ood", str(perlin), "--id", str(perlin), "--out", str(tmp_path / "mixed"),
              "--quiet"], f"--out {tmp_path / 'mixed'}: give a .h5 file for the set")]:
        assert main(argv) == 2
        assert expected in capsys.readouterr().err
    assert digests == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (perlin, state)}
    assert not (tmp_path / "b.json").exists()


def test_the_command_prints_segoods_warnings_in_one_line_and_a_librarys_as_python_does(world, tmp_path):
    """``segood`` (the process's own arguments) prints a warning of segood's as its errors, ``segood COMMAND:
    warning: ...``, without the source line Python shows; a library's warning as Python prints it."""
    import subprocess
    import sys

    argv = ["evaluate", "--checkpoint", str(world["root"] / "m.pt"), "--sets", str(world["sets"] / "perlin_mixed.h5"),
            "--methods", "all", "--resamples", "0", "-q", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "segood", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "segood evaluate: warning: sml left out: it needs a fit on training data (fit_set, --fit-set)" in lines
    assert not [line for line in lines if "UserWarning" in line or line.startswith("  ")]
    script = ("import warnings, torch, segood.cli as cli; cli._warnings_in_one_line(['x']); "
              "warnings.warn_explicit('a library warns', UserWarning, torch.__file__, 7)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "__init__.py:7: UserWarning: a library warns" in done.stderr


def test_an_argument_no_command_takes_is_refused_by_the_command_given(capsys):
    """argparse's top-level parser said "segood: error: unrecognized arguments", naming no command."""
    for argv, where in ((["export", "--sets", "a.h5", "--methods", "entropy", "--out", "x", "-x"], "segood export"),
                        (["convert", "noise", "--out", "x.h5", "--bogus"], "segood convert noise"),
                        (["convert", "mix", "--ood", "a.h5", "--id", "b.h5", "--out", "noise", "--bogus"],
                         "segood convert mix")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert err.startswith(f"usage: {where} ") and err.endswith(f"{where}: error: unrecognized arguments: "
                                                                    f"{argv[-1]}\n")
