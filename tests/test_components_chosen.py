"""Component metrics at thresholds the run chooses itself: committed on a tuning set of the run by a rule, or
tuned on each test set (the oracle), in a components pass after the pixel pass. The references: the rule applied
to the saved pixel accumulators (thresholds.commit, best_f1_threshold) and a run given the same thresholds in a
file, whose component metrics are counted in the pixel pass."""

import json

import pytest

from segood.cli import main
from segood.evaluation import Evaluation, evaluate, runner
from segood.evaluation.report import combine_runs
from segood.metrics.components import best_f1_threshold
from segood.metrics.thresholds import commit
from segood.models import save_checkpoint

from gloo import run_in_group
from networks import tiny_network
from rawtrees import killed_after

METHODS = ["entropy", "mutual_info"]  # one from the forward pass, one from Monte-Carlo dropout samples
OPTIONS = {"batch_size": 2, "progress": False, "figures": False, "bootstrap": None}


@pytest.fixture(scope="module")
def sets(noise_sets):
    root = noise_sets(kinds=("perlin", "normal"), seed=2, side=64)
    return [root / "perlin_mixed.h5", root / "normal_mixed.h5", root / "cs.h5"]  # cs: ID pixels only


def components_of(doc):
    return {(m, s): cell.get("components") for m, by_set in doc["results"].items() for s, cell in by_set.items()}


def test_committed_thresholds_equal_the_rule_and_a_run_given_them_in_a_file(sets, tmp_path):
    model = tiny_network("dropout")
    doc = evaluate(model, sets, METHODS, tmp_path / "chosen", components={"preset": "obstacle"},
                   commit_on="perlin_mixed", **OPTIONS)
    ev = Evaluation.load(tmp_path / "chosen" / "state.npz")
    want = {m: commit(ev.acc[(m, "perlin_mixed")].compute(), "f1") for m in METHODS}
    got = components_of(doc)
    for (m, s), cell in got.items():  # applied unchanged to every set, the ID-only one included
        assert (cell["threshold"], cell["threshold_source"], cell["chosen_on"], cell["rule"]) == \
            (want[m], "committed", "perlin_mixed", "f1")
        pixel_table = doc["results"][m]["perlin_mixed"]["committed"]["f1"]
        assert cell["threshold"] == pixel_table["threshold"]
        assert cell["n_frames"] == (2 if s == "cs" else 4)
    assert ev.components_done == {"perlin_mixed": 4, "normal_mixed": 4, "cs": 2}
    assert got[("entropy", "perlin_mixed")]["n_gt_components"] > 0 and "components" in doc["timings"]["ms_per_image"]
    assert "thresholds committed on perlin_mixed by the f1 rule, applied unchanged to every set" in \
        (tmp_path / "chosen" / "results.md").read_text()

    given = evaluate(model, sets, METHODS, tmp_path / "file", components={"preset": "obstacle", "thresholds": want},
                     **OPTIONS)
    for key, cell in components_of(given).items():
        assert {**cell, "chosen_on": "perlin_mixed", "rule": "f1"} == got[key]
        assert (cell["chosen_on"], cell["rule"]) == (None, None)
    chosen_pixels = {m: {s: c["pooled"] for s, c in r.items()} for m, r in doc["results"].items()}
    assert chosen_pixels == {m: {s: c["pooled"] for s, c in r.items()} for m, r in given["results"].items()}


def test_oracle_thresholds_are_each_sets_best_pixel_f1(sets, tmp_path):
    doc = evaluate(tiny_network("dropout"), sets, METHODS, tmp_path / "oracle",
                   components={"preset": "obstacle", "source": "oracle"}, **OPTIONS)
    ev = Evaluation.load(tmp_path / "oracle" / "state.npz")
    for (m, s), cell in components_of(doc).items():
        if s == "cs":  # no OOD pixels: no best F1, no components, and not scored again
            assert cell is None and ev.components_done["cs"] == 0
            continue
        assert cell["threshold"] == best_f1_threshold(ev.acc[(m, s)].compute())
        assert (cell["threshold_source"], cell["chosen_on"]) == ("oracle", "tuned on the test set (oracle)")
    assert len({components_of(doc)[("entropy", s)]["threshold"] for s in ("perlin_mixed", "normal_mixed")}) == 2
    assert "thresholds ORACLE: tuned on the test set itself (each set's own, by the f1 rule)" in \
        (tmp_path / "oracle" / "results.md").read_text()


def test_missing_or_unusable_thresholds_are_errors_that_say_what_to_give(sets, tmp_path, capsys):
    model = tiny_network("dropout")
    with pytest.raises(ValueError, match=r"--commit-on SET.*--component-thresholds FILE.json.*--component-thresholds "
                                         r"oracle"):
        evaluate(model, sets, METHODS, tmp_path / "a", components={"preset": "obstacle"}, **OPTIONS)
    with pytest.raises(ValueError, match=r"'tune' is not a set of the run; choose one of \['perlin_mixed'"):
        evaluate(model, sets, METHODS, tmp_path / "b", components={"preset": "obstacle"}, commit_on="tune", **OPTIONS)
    with pytest.raises(ValueError, match=r"commit_on \(--commit-on\) 'cs': a threshold needs ID and OOD pixels on the "
                                         r"tuning set, and it has \d+ ID and 0 OOD"):  # (its thresholds were None)
        evaluate(model, sets, METHODS, tmp_path / "b", commit_on="cs", **OPTIONS)
    with pytest.raises(ValueError, match="unknown threshold rule 'best'"):
        evaluate(model, sets, METHODS, tmp_path / "c", components={"preset": "obstacle", "rule": "best"},
                 commit_on="cs", **OPTIONS)
    with pytest.raises(ValueError, match=r"'cs': a threshold needs ID and OOD pixels on the tuning set, and it has "
                                         r"\d+ ID and 0 OOD"):  # (refused before the run, not after it)
        evaluate(model, sets[2:], ["entropy"], tmp_path / "d", components={"preset": "obstacle"}, commit_on="cs",
                 **OPTIONS)
    save_checkpoint(tmp_path / "m.pt", model)
    base = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets[0]), "--methods", "entropy",
            "-v", "--resamples", "0", "--components", "obstacle"]
    assert main([*base, "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "need a threshold per method: commit it on a tuning set of the run (--commit-on SET" in err
    assert "--component-thresholds oracle" in err
    assert main([*base, "--commit-on", "perlin_mixed", "--oracle-thresholds", "--out", str(tmp_path / "e")]) == 2
    assert "--oracle-thresholds says that the thresholds of --component-thresholds FILE.json" in \
        capsys.readouterr().err
    assert main([*base, "--commit-on", "perlin_mixed", "--out", str(tmp_path / "f")]) == 0
    assert "committed on perlin_mixed by the f1 rule" in capsys.readouterr().out
    assert main([*base, "--component-thresholds", "oracle", "--out", str(tmp_path / "g")]) == 0
    assert "ORACLE: tuned on the test set itself" in capsys.readouterr().out
    oracle = json.loads((tmp_path / "g" / "results.json").read_text())["results"]["entropy"]["perlin_mixed"]
    assert oracle["components"]["threshold"] == oracle["oracle"]["f1"]["threshold"]  # the pixel oracle's, by F1
    assert main([*base, "--commit-on", "perlin_mixed", "--component-rule", "iou", "--out", str(tmp_path / "h")]) == 0
    by_iou = json.loads((tmp_path / "h" / "results.json").read_text())["results"]["entropy"]["perlin_mixed"]
    assert by_iou["components"]["rule"] == "iou"
    assert by_iou["components"]["threshold"] == by_iou["committed"]["iou"]["threshold"]
    (tmp_path / "t.json").write_text(json.dumps({"entropy": 0.5}))
    assert main([*base, "--component-thresholds", str(tmp_path / "t.json"), "--component-rule", "iou",
                 "--out", str(tmp_path / "i")]) == 2
    assert "given thresholds ('thresholds', --component-thresholds FILE) are used as they are" in \
        capsys.readouterr().err
    without = [a for a in base if a not in ("--components", "obstacle")]
    assert main([*without, "--component-rule", "iou", "--out", str(tmp_path / "j")]) == 2
    assert "add --components anomaly|obstacle" in capsys.readouterr().err


@pytest.mark.parametrize("overlap", [False, True])  # (True: each batch's update beside the next, as on CUDA)
def test_a_run_killed_in_the_components_pass_resumes_to_the_same_numbers(sets, tmp_path, monkeypatch, overlap):
    monkeypatch.setattr(runner, "_overlaps", lambda device: overlap)
    components = {"preset": "obstacle"}
    whole = evaluate(tiny_network("dropout"), sets, METHODS, tmp_path / "whole", components=components,
                     commit_on="normal_mixed", **OPTIONS)
    model = tiny_network("dropout")
    original = model.forward
    monkeypatch.setattr(model, "forward", killed_after(model, 5 + 3))  # 5 batches per pass: dies in the second
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, sets, METHODS, tmp_path / "killed", components=components, commit_on="normal_mixed",
                 save_every=1, **OPTIONS)
    saved = Evaluation.load(tmp_path / "killed" / "state.npz")
    assert saved.done == {"perlin_mixed": 4, "normal_mixed": 4, "cs": 2}  # the pixel pass was complete,
    assert saved.components["thresholds"] and saved.components_done == {"perlin_mixed": 4, "normal_mixed": 2, "cs": 0}
    monkeypatch.setattr(model, "forward", original)
    resumed = evaluate(model, sets, METHODS, tmp_path / "killed", components=components, commit_on="normal_mixed",
                       resume=True, **OPTIONS)
    assert resumed["results"] == whole["results"]
    assert components_of(resumed)[("mutual_info", "cs")]["n_frames"] == 2

    monkeypatch.setattr(model, "forward", killed_after(model, 2))  # dies in the pixel pass: no thresholds yet
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, sets, ["max_softmax"], tmp_path / "early", components=components, commit_on="normal_mixed",
                 save_every=1, **OPTIONS)
    with pytest.raises(ValueError, match="stopped before choosing their component thresholds.*--resume first"):
        combine_runs([tmp_path / "whole", tmp_path / "early"], tmp_path / "combined", figures=False, bootstrap=None)


def _distributed_worker(rank, world, paths, out_dir):
    evaluate(tiny_network("dropout"), paths, ["entropy"], out_dir,
             components={"preset": "obstacle", "source": "oracle"}, **{**OPTIONS, "batch_size": 1})


def test_two_process_gloo_run_chooses_the_thresholds_of_the_whole_sets(sets, tmp_path):
    single = evaluate(tiny_network("dropout"), sets[:2], ["entropy"], tmp_path / "single",
                      components={"preset": "obstacle", "source": "oracle"}, **{**OPTIONS, "batch_size": 1})
    run_in_group(_distributed_worker, [str(p) for p in sets[:2]], str(tmp_path / "multi"))
    multi = json.loads((tmp_path / "multi/results.json").read_text())
    assert components_of(multi) == components_of(single)


def test_a_frame_passed_over_is_listed_once_though_both_passes_meet_it(sets, tmp_path):
    import shutil

    import h5py

    broken = tmp_path / "broken.h5"  # perlin_mixed with frame 1 damaged
    shutil.copy(sets[0], broken)
    shutil.copy(sets[0].with_suffix(".manifest.json"), tmp_path / "broken.manifest.json")
    with h5py.File(broken, "r+") as f:
        f["images"]["1"].id.write_direct_chunk((0, 0, 0), b"not a deflate stream")
    doc = evaluate(tiny_network("dropout"), [broken], ["entropy"], tmp_path / "run", skip_bad=True,
                   components={"preset": "obstacle", "source": "oracle"}, **OPTIONS)
    assert [entry[:2] for entry in doc["skipped_frames"]] == [["broken", 1]]
    assert doc["results"]["entropy"]["broken"]["components"]["n_frames"] == 3
    assert doc["timings"]["images_per_set"] == {"broken": 3}
    [note] = doc["notes"]  # (said once)
    assert note.startswith("1 unreadable frame was passed over (--skip-bad) and is in no number here: 1 of broken")
