"""Faults met while evaluating: bad masks, NaN scores, unreadable or odd score files, infinite scores and bad
grids; each a clear message naming the set, the frame and the file, and never a half-counted saved state."""

import json

import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data import Sample
from segood.data.h5 import H5SegmentationDataset, SetWriter
from segood.evaluation import Evaluation, evaluate, evaluate_score_maps, runner
from segood.evaluation.layout import RunFolder
from segood.methods import Method
from segood.models import build_model

from rawtrees import replace_chunk


def test_big_endian_and_complex_score_maps(small_set, tmp_path, capsys):
    dataset = H5SegmentationDataset(small_set)
    rng = np.random.default_rng(0)
    maps = {dataset[i]["frame_id"]: rng.random((32, 64)).astype(np.float32) for i in range(len(dataset))}
    for name, dtype in (("little", "<f4"), ("big", ">f4"), ("complex", np.complex64)):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            for frame_id, score in maps.items():
                f[frame_id] = score.astype(dtype)
    little, big = (evaluate_score_maps(tmp_path / f"{n}.h5", small_set, tmp_path / n, figures=False)
                   for n in ("little", "big"))
    assert little["results"]["external"]["cs"]["pooled"] == big["results"]["external"]["cs"]["pooled"]
    assert main(["score", "--scores", str(tmp_path / "complex.h5"), "--data", str(small_set), "--out",
                 str(tmp_path / "c")]) == 2
    assert "scores must be real numbers" in capsys.readouterr().err


# 14. Messages name the set, the frame and the file; --skip-bad passes a bad frame.
def test_bad_mask_values_name_the_set_and_frame(small_set, tmp_path):
    mask = H5SegmentationDataset(small_set)[2]["ood_mask"].numpy().copy()
    mask[0, 0] = 2
    replace_chunk(small_set, "ood_mask", 2, mask)
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match=r"cs: cannot read frame 2 .*frame 2 \(.*\): ood_mask holds values \[2\]"):
        evaluate(model, [small_set], ["max_softmax"], tmp_path / "a", progress=False, figures=False, verify=False)
    doc = evaluate(model, [small_set], ["max_softmax"], tmp_path / "b", progress=False, figures=False,
                   verify=False, skip_bad=True)
    assert doc["skipped_frames"][0][:2] == ["cs", 2] and "holds values [2]" in doc["skipped_frames"][0][2]
    with pytest.raises(ValueError, match="x/2: the ood_mask must be uint8 with 0 .* holding \\[2\\]"):
        SetWriter(tmp_path / "bad.h5", (32, 64), {"source": "test"}).append(
            Sample(np.zeros((32, 64, 3), np.uint8), mask, mask, "x/2"))


class NanOnSecondBatch(Method):
    """A toy method whose scores turn NaN on the frames after the first batch."""

    name = "nan_later"
    calls = 0

    def from_output(self, output):
        NanOnSecondBatch.calls += 1
        scores = torch.sigmoid(-output.logits.amax(dim=1))
        return scores if NanOnSecondBatch.calls == 1 else scores * float("nan")


@pytest.mark.parametrize("overlap", [False, True])  # (True: each batch's update beside the next, as on CUDA)
def test_a_failing_batch_names_the_frames_and_never_saves_a_half_counted_state(small_set, tmp_path, monkeypatch,
                                                                               overlap):
    monkeypatch.setattr(runner, "_overlaps", lambda device: overlap)
    NanOnSecondBatch.calls = 0
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match=r"cs: frames \[1\]: nan_later: \d+ counted pixels have NaN scores; .* a run "
                                         r"folder's last save is consistent \(--resume continues from it\)"):
        evaluate(model, [small_set], ["max_softmax", NanOnSecondBatch()], tmp_path / "run", batch_size=1,
                 save_every=1, progress=False, figures=False)
    state = Evaluation.load(tmp_path / "run" / "state.npz")  # the save after batch 0, consistent
    assert state.done == {"cs": 1} and {acc.n_images for acc in state.acc.values()} == {1}


class NanLogits(torch.nn.Module):
    """A network whose logits are NaN in the top row of every frame."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 19, 1)

    def forward(self, x):
        return self.conv(x).index_fill(2, torch.tensor([0]), float("nan"))


def test_nan_logits_are_named_as_the_networks(small_set, tmp_path):
    with pytest.raises(ValueError, match=r"cs: frames \[0, 1\]: max_logit, energy: the network's logits are NaN at 128 "
                                         r"pixels \(check its weights and its input normalisation\); \d+ counted"):
        evaluate(NanLogits(), [small_set], ["max_logit", "energy"], progress=False, figures=False)


def test_a_run_starting_while_another_process_looks_at_its_folder_is_not_refused(tmp_path):
    """segood report looks whether a run holds its folder with a shared lock for an instant: a run claiming the
    folder in that instant waits for the look to end."""
    import fcntl
    import os
    import threading

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").touch()
    look = os.open(folder / ".lock", os.O_RDONLY)
    fcntl.flock(look, fcntl.LOCK_SH)  # (a look, ending in 0.1 s)
    threading.Timer(0.1, os.close, [look]).start()
    with RunFolder(folder).claimed():
        assert RunFolder(folder).in_use()


def test_a_second_run_into_a_folder_in_use_is_refused(small_set, tmp_path, capsys, monkeypatch):
    """While a run holds its folder, another one into it is an error, never a silent replacement of its files;
    the lock dies with the run."""
    dataset = H5SegmentationDataset(small_set)
    with h5py.File(tmp_path / "maps.h5", "w") as f:
        for i in range(len(dataset)):
            f[dataset[i]["frame_id"]] = np.random.default_rng(i).random((32, 64)).astype(np.float32)
    model = build_model("pspnet", "resnet18").eval()
    assert not RunFolder(tmp_path / "run").in_use() and not (tmp_path / "run").exists()  # (it looks only)
    with RunFolder(tmp_path / "run").claimed():
        assert RunFolder(tmp_path / "run").in_use()
        with pytest.raises(FileExistsError, match=f"another segood run is writing {tmp_path / 'run'} right now"):
            evaluate_score_maps(tmp_path / "maps.h5", small_set, tmp_path / "run", figures=False)
        with pytest.raises(FileExistsError, match="another segood run is writing"):
            evaluate(model, [small_set], ["energy"], tmp_path / "run", progress=False, figures=False)
        assert main(["score", "--scores", str(tmp_path / "maps.h5"), "--data", str(small_set), "--out",
                     str(tmp_path / "run"), "-q"]) == 2
        assert "segood score: error: another segood run is writing" in capsys.readouterr().err
    assert not (tmp_path / "run" / "run.json").exists()
    evaluate_score_maps(tmp_path / "maps.h5", small_set, tmp_path / "run", figures=False)
    assert not (tmp_path / "run" / ".lock").exists() and not list(tmp_path.glob(".*lock"))  # (its own, in it)

    from segood.evaluation import api

    held = []

    def report(out_dir, **options):  # the folder is still held while its report is written
        try:
            with RunFolder(out_dir).claimed():
                held.append(False)
        except FileExistsError:
            held.append(True)
        return write_report(out_dir, **options)

    write_report = api.write_report
    monkeypatch.setattr(api, "write_report", report)
    evaluate(model, [small_set], ["energy"], tmp_path / "held", progress=False, figures=False)
    assert held == [True]


def test_garbage_score_file_and_npz_name_the_file(small_set, tmp_path, capsys):
    (tmp_path / "garbage.h5").write_bytes(b"not hdf5 at all")
    assert main(["score", "--scores", str(tmp_path / "garbage.h5"), "--data", str(small_set), "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'garbage.h5'} is not a readable HDF5 score file" in err
    assert "raised at" not in err  # (h5py's compiled h5f.pyx is no code of the user's)
    np.savez(tmp_path / "objects.npz", hist=np.array([{"a": 1}], dtype=object))
    assert main(["metrics", str(tmp_path / "objects.npz")]) == 2
    err = capsys.readouterr().err
    assert "objects.npz" in err and "pickled Python objects" in err and "allow_pickle" not in err


def test_infinite_scores_report_and_resume(small_set, tmp_path):
    dataset = H5SegmentationDataset(small_set)
    with h5py.File(tmp_path / "inf.h5", "w") as f:
        for i in range(len(dataset)):
            score = np.random.default_rng(i).random((32, 64)).astype(np.float32)
            score[0, 0], score[5, 5] = np.inf, -np.inf
            f[dataset[i]["frame_id"]] = score
    doc = evaluate_score_maps(tmp_path / "inf.h5", small_set, tmp_path / "run", figures=False)
    assert doc["results"]["external"]["cs"]["n_id"] > 0
    assert Evaluation.load(tmp_path / "run" / "state.npz").images == {"cs": 3}  # reloadable


def test_a_damaged_run_json_is_named_with_the_field_that_is_not_an_object(small_set, tmp_path, capsys):
    with h5py.File(tmp_path / "s.h5", "w") as f:
        for item in H5SegmentationDataset(small_set):
            f[item["frame_id"]] = np.random.default_rng(0).random((32, 64)).astype(np.float32)
    evaluate_score_maps(tmp_path / "s.h5", small_set, tmp_path / "run", figures=False)
    good = json.loads((tmp_path / "run" / "run.json").read_text())
    for damage, where in ((5, "the file"), ({**good, "sets": 5}, "'sets'"), ({**good, "methods": "abc"}, "'methods'"),
                          ({**good, "config": None}, "'config'"), ({**good, "sets": {"cs": 7}}, "sets 'cs'"),
                          ({k: v for k, v in good.items() if k != "model"}, "'model'")):
        (tmp_path / "run" / "run.json").write_text(json.dumps(damage))
        assert main(["report", str(tmp_path / "run"), "-q"]) == 2
        assert capsys.readouterr().err == (f"segood report: error: {tmp_path / 'run' / 'run.json'} is damaged: {where} "
                                           "is not a JSON object; rerun the evaluation into a new folder\n")
    assert main(["report", str(tmp_path / "run" / "state.npz"), "-q"]) == 2  # the run's file, not its folder
    assert capsys.readouterr().err == (f"segood report: error: {tmp_path / 'run' / 'state.npz'} is a file, not a run "
                                       "folder: give the folder segood evaluate or segood score wrote\n")


def test_a_bad_grid_writes_nothing_and_old_run_files_still_resume(small_set, tmp_path):
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match="mantissa_bits must be in"):
        evaluate(model, [small_set], ["max_softmax"], tmp_path / "bad", mantissa_bits=20, progress=False)
    assert not (tmp_path / "bad" / "run.json").exists()
    evaluate(model, [small_set], ["max_softmax"], tmp_path / "old", num_thresholds=400, progress=False,
             figures=False)
    run = json.loads((tmp_path / "old" / "run.json").read_text())
    run["config"] = {"num_thresholds": 400, "batch_size": 2}  # as runs before the float-order grid wrote it
    (tmp_path / "old" / "run.json").write_text(json.dumps(run))
    evaluate(model, [small_set], ["max_softmax"], tmp_path / "old", num_thresholds=400, resume=True,
             progress=False, figures=False)


def test_what_differs_between_two_runs_is_shown_where_it_differs():
    from segood.evaluation.layout import _differences

    assert _differences("config", {"c": {"thresholds": [0.1] * 20 + [0.5]}}, {"c": {"thresholds": [0.1] * 20 + [0.6]}}
                        ) == ["config.c.thresholds[20]: 0.5 -> 0.6"]
    assert _differences("config", {"x": None}, {}) == ["config.x: null -> (none)"]  # (null is not absent)
    long = "/a/very/long/path/to/some/folder/deep/inside/the/tree/file_{}.h5"
    assert _differences("model", {"p": long.format("one")}, {"p": long.format("two")}) == [
        'model.p: ...nside/the/tree/file_one.h5" -> ...nside/the/tree/file_two.h5"']
    assert _differences("config", {"grid": {"kind": "float"}}, {"grid": {"kind": "float"}}) == []
