"""Score maps in and out: export in each layout, score it back, and get the numbers of the run itself (segood,
Fishyscapes) or of its float16-rounded scores (SMIYC stores float16); bad files named."""

import shutil

import h5py
import numpy as np
import pytest

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset
from segood.evaluation import evaluate, evaluate_score_maps
from segood.evaluation.exchange import export_scores, file_ids
from segood.methods import get_method
from segood.metrics import make_accumulator
from segood.models import preprocess, save_checkpoint

from networks import tiny_network


@pytest.fixture(scope="module")
def world(noise_sets):
    root = noise_sets(kinds=("perlin",), seed=3)
    model = tiny_network()
    return root, model


@pytest.mark.parametrize("layout", ["segood", "smiyc", "fishyscapes"])
def test_export_then_score_round_trips(world, tmp_path, layout):
    root, model = world
    sets = {"perlin_mixed": root / "perlin_mixed.h5"}
    written = export_scores(model, sets, [get_method("entropy"), get_method("max_logit")], tmp_path / "out",
                            layout=layout, progress=False)
    run = evaluate(model, sets, ["entropy", "max_logit"], tmp_path / "run", progress=False, figures=False)
    for method in ("entropy", "max_logit"):
        got = evaluate_score_maps(written[(method, "perlin_mixed")], sets["perlin_mixed"], tmp_path / f"s_{method}",
                                  name=method, figures=False)["results"][method]["perlin_mixed"]["pooled"]
        if layout == "smiyc":  # float16 files: equal to the run's scores rounded to float16
            want = make_accumulator()
            for item in H5SegmentationDataset(sets["perlin_mixed"]):
                score = get_method(method).score(model, preprocess(item["image"][None]))[0]
                want.update(score.half(), item["ood_mask"][None])
            want = want.compute()
        else:
            want = run["results"][method]["perlin_mixed"]["pooled"]
        for metric in ("auroc", "auprc", "fpr95", "max_iou"):
            assert got[metric] == pytest.approx(want[metric], abs=1e-12)


def test_exported_monte_carlo_maps_are_the_samples_evaluate_draws(world, tmp_path):
    """Export seeds each frame's dropout masks as segood evaluate does at its seed 0: the same maps, the same
    counts, in batches of another size."""
    root, _ = world
    model, sets = tiny_network("dropout"), {"perlin_mixed": root / "perlin_mixed.h5"}
    written = export_scores(model, sets, [get_method("varsum")], tmp_path / "out", batch_size=3, progress=False)
    got = evaluate_score_maps(written[("varsum", "perlin_mixed")], sets["perlin_mixed"], tmp_path / "s",
                              name="varsum", figures=False)["results"]["varsum"]["perlin_mixed"]["pooled"]
    run = evaluate(model, sets, ["varsum"], None, batch_size=1, progress=False, figures=False, bootstrap=None)
    want = run["results"]["varsum"]["perlin_mixed"]["pooled"]
    for metric in ("auroc", "auprc", "fpr95", "max_iou"):
        assert got[metric] == pytest.approx(want[metric], abs=1e-6)


@pytest.mark.parametrize("layout", ["segood", "smiyc"])
def test_score_maps_read_by_reader_processes_give_the_same_state(world, tmp_path, monkeypatch, layout):
    """Frames and their maps read by two reader processes (each opening the files itself) give the state of reading
    them in the main process, count for count; a bad map read there is named as in the main process."""
    from segood.evaluation import api
    from segood.evaluation.runner import Evaluation

    root, model = world
    data = root / "perlin_mixed.h5"
    maps = export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "out", layout=layout,
                         progress=False)[("entropy", "perlin_mixed")]
    states = []
    for workers in (0, 2):
        monkeypatch.setattr(api, "default_workers", lambda *_, w=workers: w)
        evaluate_score_maps(maps, data, tmp_path / f"w{workers}", name="entropy", figures=False)
        states.append(Evaluation.load(tmp_path / f"w{workers}/state.npz").acc[("entropy", "perlin_mixed")])
    assert states[0].n_images == states[1].n_images == len(H5SegmentationDataset(data))
    np.testing.assert_array_equal(states[0].binades, states[1].binades)
    np.testing.assert_array_equal(states[0].counts, states[1].counts)
    if layout == "segood":  # a map of the wrong size, found in a reader process
        from segood.data.h5 import frame_ids

        key = frame_ids(data)[1]
        with h5py.File(maps, "r+") as f:
            del f[key]
            f[key] = np.zeros((3, 3), np.float32)
        with pytest.raises(ValueError, match=r"scores of shape \(3, 3\), the frame is"):
            evaluate_score_maps(maps, data, tmp_path / "bad", name="entropy", figures=False)


@pytest.mark.parametrize("layout", ["segood", "smiyc", "fishyscapes"])
def test_a_map_that_claims_a_huge_shape_is_refused_before_it_is_read(world, tmp_path, layout):
    """A file a few kilobytes long can declare a 2^20 × 2^20 map (4 TiB of float32): its shape is checked against
    the frame's before anything is read, in every layout, scoring maps and packaging them alike."""
    from segood.data.h5 import frame_ids, frame_sizes
    from segood.evaluation.exchange import ScoreMaps

    root, model = world
    data = root / "perlin_mixed.h5"
    maps = export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "out", layout=layout,
                         progress=False)[("entropy", "perlin_mixed")]
    key, huge = frame_ids(data)[1], (1 << 20, 1 << 20)
    if layout == "segood":
        with h5py.File(maps, "r+") as f:
            del f[key]
            f.create_dataset(key, shape=huge, dtype="f4", chunks=(64, 64))  # no chunk written: a few bytes
    elif layout == "smiyc":
        with h5py.File(maps / f"{file_ids([key])[key]}.hdf5", "w") as f:
            f.create_dataset("value", shape=huge, dtype="f2", chunks=(64, 64))
    else:
        with open(maps / f"{file_ids([key])[key]}_anomaly.npy", "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": huge})
    message = rf"frame {key}: scores of shape \(1048576, 1048576\), the frame is \(\d+, \d+\)"
    with pytest.raises(ValueError, match=message):
        evaluate_score_maps(maps, data, tmp_path / "run", name="entropy", figures=False)
    with ScoreMaps(maps, frame_ids(data), frame_sizes(data)) as read, pytest.raises(ValueError, match=message):
        read[key]


def test_folder_layouts_name_missing_extra_and_bad_files(world, tmp_path):
    root, model = world
    sets = {"perlin_mixed": root / "perlin_mixed.h5"}
    out = export_scores(model, sets, [get_method("entropy")], tmp_path / "fishy", layout="fishyscapes",
                        progress=False)[("entropy", "perlin_mixed")]
    files = sorted(out.glob("*_anomaly.npy"))
    files[0].rename(out / "somewhere_else_anomaly.npy")
    with pytest.raises(ValueError, match=rf"do not match the set: missing \S+/{files[0].name[:-12]}$"):
        evaluate_score_maps(out, sets["perlin_mixed"], tmp_path / "a")
    shutil.copy(out / "somewhere_else_anomaly.npy", files[0])  # another frame's file beside the set's: unread
    evaluate_score_maps(out, sets["perlin_mixed"], tmp_path / "extra")
    files[1].write_bytes(b"not an npy file")
    with pytest.raises(ValueError, match=f"{files[1].name} is not a readable fishyscapes score file"):
        evaluate_score_maps(out, sets["perlin_mixed"], tmp_path / "b")
    with pytest.raises(ValueError, match="would share the file name"):
        file_ids(["a/x", "b/x"])


def test_export_and_score_from_the_command_line(world, tmp_path):
    root, model = world
    save_checkpoint(tmp_path / "m.pt", model)
    assert main(["export", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(root / "perlin_mixed.h5"),
                 "--methods", "entropy", "--layout", "smiyc", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    folder = tmp_path / "out" / "anomaly_p" / "entropy" / "perlin_mixed"
    with h5py.File(next(folder.glob("*.hdf5")), "r") as f:
        assert f["value"].dtype == np.float16
    assert main(["score", "--scores", str(folder), "--data", str(root / "perlin_mixed.h5"), "--out",
                 str(tmp_path / "run")]) == 0


def test_export_checks_everything_before_fitting_and_fits_on_the_fit_set(world, tmp_path, capsys):
    """A fit is a pass over a training set: an export that cannot be written, or names a method twice, is refused
    before it (it was refused after); SML's maps are those of an evaluation fitted on the same set."""
    root, model = world
    sets = {"perlin_mixed": root / "perlin_mixed.h5"}
    missing = tmp_path / "no_such_fit_set.h5"  # (read only by a fit)
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'taken'} is a file; --out names the folder the maps are "
                                         "written into$"):
        export_scores(model, sets, [get_method("sml")], tmp_path / "taken", fit_set=missing, progress=False)
    with pytest.raises(ValueError, match="named twice"):
        export_scores(model, sets, [get_method("sml"), get_method("sml")], tmp_path / "out", fit_set=missing,
                      progress=False)
    with pytest.raises(FileNotFoundError, match="no set .*nowhere.h5"):  # (in every layout)
        export_scores(model, {"nowhere": tmp_path / "nowhere.h5"}, [get_method("sml")], tmp_path / "out",
                      fit_set=missing, progress=False)
    with pytest.raises(ValueError, match=r"^sml needs its training statistics: pass --fit-set \(fit_set\), a "
                                         "converted training set$"):
        export_scores(model, sets, [get_method("sml")], tmp_path / "out", progress=False)
    save_checkpoint(tmp_path / "m.pt", model)
    assert main(["export", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(sets["perlin_mixed"]), "--methods",
                 "sml", "--fit-set", str(missing), "--out", str(tmp_path / "taken")]) == 2
    assert "is a file; --out names the folder" in capsys.readouterr().err
    written = export_scores(model, sets, [get_method("sml")], tmp_path / "out", fit_set=sets["perlin_mixed"],
                            progress=False)
    run = evaluate(model, sets, ["sml"], tmp_path / "run", fit_set=sets["perlin_mixed"], progress=False,
                   figures=False)
    exported = evaluate_score_maps(written[("sml", "perlin_mixed")], sets["perlin_mixed"], tmp_path / "scored",
                                   figures=False)
    assert exported["results"]["external"]["perlin_mixed"]["pooled"] == run["results"]["sml"]["perlin_mixed"]["pooled"]


def test_score_checks_its_run_folder_before_reading_the_maps(world, tmp_path):
    """A folder holding another run, or lying in the maps' own folder (whose digest the run's files then changed),
    is refused before any frame is read (it was refused after every frame, or not at all)."""
    root, model = world
    data = root / "perlin_mixed.h5"
    written = export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "out",
                            layout="fishyscapes", progress=False)
    folder = written[("entropy", "perlin_mixed")]
    for out in (folder, folder / "run"):
        with pytest.raises(ValueError, match=rf"^{out} is in the score maps {folder} \(their digest would change "
                                             r"with the run's files\): write the run into another folder$"):
            evaluate_score_maps(folder, data, out, figures=False)
    assert {p.suffix for p in folder.iterdir()} == {".npy"}  # (nothing written among the maps)
    evaluate_score_maps(folder, data, tmp_path / "run", figures=False)
    broken = next(folder.iterdir())
    np.save(broken, np.full(np.load(broken).shape, np.nan, np.float32))  # (read only after the check)
    with pytest.raises(ValueError, match="holds a different run"):
        evaluate_score_maps(folder, data, tmp_path / "run", figures=False)


def test_score_folders_of_two_layouts_a_root_folder_and_a_set_given_as_scores_are_named(world, tmp_path):
    root, model = world
    data = root / "perlin_mixed.h5"
    written = export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "out",
                            layout="smiyc", progress=False)
    folder = written[("entropy", "perlin_mixed")]
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'out'} holds neither <fid>\.hdf5 files \(SegmentMeIfYouCan\) "
                                         r"nor <fid>_anomaly\.npy files \(Fishyscapes\); anomaly_p/entropy/perlin_mixed "
                                         r"inside it holds \S+\.hdf5: give the folder of one method and set$"):
        evaluate_score_maps(tmp_path / "out", data, tmp_path / "a", figures=False)
    export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "seg", progress=False)
    with pytest.raises(ValueError, match=r"\(Fishyscapes\); it holds segood's file perlin_mixed\.h5: give that "
                                         "file$"):
        evaluate_score_maps(tmp_path / "seg" / "entropy", data, tmp_path / "a", figures=False)
    np.save(folder / "stray_anomaly.npy", np.zeros((2, 2), np.float32))  # (taken for a Fishyscapes folder)
    with pytest.raises(ValueError, match=r"holds both <fid>\.hdf5 files \(SegmentMeIfYouCan\) and <fid>_anomaly\.npy "
                                         r"files \(Fishyscapes\): keep one layout's maps in a folder$"):
        evaluate_score_maps(folder, data, tmp_path / "b", figures=False)
    with pytest.raises(ValueError, match=rf"^{data} is a converted set, not score maps: give it as --data, and as "
                                         "--scores the maps of its frames$"):
        evaluate_score_maps(data, data, tmp_path / "c", figures=False)
    written = export_scores(model, {"perlin_mixed": data}, [get_method("entropy")], tmp_path / "fs",
                            layout="fishyscapes", progress=False)
    pickled = next(written[("entropy", "perlin_mixed")].iterdir())
    np.save(pickled, np.load(pickled).astype(object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"is not a readable fishyscapes score file \(ValueError: it holds an array "
                                         r"of dtype object \(pickled Python objects, never read here\): save the "
                                         r"scores as a float array\)$"):
        evaluate_score_maps(written[("entropy", "perlin_mixed")], data, tmp_path / "d", figures=False)
