"""Unlucky and hostile input to the commands around the board: sets sharing a name, a full disk, two writers
at once, a tuning set that cannot rank, self-reported states whose counts do not add up."""

from pathlib import Path

import numpy as np
import pytest

from segood.cli import main
from segood.labels import OOD


@pytest.mark.parametrize("command", [
    ["benchmark", "--track", "t", "--sets", "{a}", "{b}", "--out", "{out}/bench.json"],
    ["protocol", "--tune-sets", "{a}", "{b}", "--test-sets", "{c}", "--methods", "entropy", "--out", "{out}"],
    ["protocol", "--tune-sets", "{c}", "--test-sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
    ["export", "--sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
    ["evaluate", "--sets", "{a}", "{b}", "--out", "{out}"],
    ["robustness", "--sets", "{a}", "{b}", "--out", "{out}"],
], ids=["benchmark", "protocol tune", "protocol test", "export", "evaluate", "robustness"])
def test_sets_sharing_a_file_name_are_refused_not_dropped(tmp_path, capsys, command):
    paths = {"a": tmp_path / "a" / "t.h5", "b": tmp_path / "b" / "t.h5", "c": tmp_path / "c.h5",
             "out": tmp_path / "out"}
    argv = [part.format(**paths) for part in command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{paths['a']} and {paths['b']} share the name 't'" in err
    assert not (tmp_path / "out").exists()


def tiny_set(path, ood=True, frames=2, side=8, seed=0):
    """A converted set of ``frames`` side x side frames; ``ood``: a 2 x 2 OOD square in each."""
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    rng = np.random.default_rng(seed)
    writer = SetWriter(path, None, {"source": "tiny", "split": "test"}, overwrite=True)
    for k in range(frames):
        mask = np.zeros((side, side), np.uint8)
        if ood:
            mask[2:4, 2:4] = OOD
        writer.append(Sample(rng.integers(0, 255, (side, side, 3), dtype=np.uint8), mask, mask, f"f/{k}"))
    writer.commit()
    return path


def test_a_tuning_set_without_ood_pixels_is_refused_by_name(tmp_path):
    from segood.evaluation.protocol import cross_source

    id_only, test = tiny_set(tmp_path / "id_only.h5", ood=False), tiny_set(tmp_path / "test.h5")
    with pytest.raises(ValueError, match=r"tuning set 'id_only' .* has 128 ID and 0 OOD pixels"):
        cross_source(None, {"id_only": id_only}, {"test": test}, ["max_softmax"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    from segood.data.h5 import H5SegmentationDataset, frame_loader
    from segood.methods.tuning import tune

    from networks import tiny_network

    with pytest.raises(ValueError, match=r"auroc is undefined at every point on the tuning data \(128 ID and 0 OOD "
                                         r"pixels\): tune on a set with both"):  # (tune() itself: no NaN recorded)
        tune("odin", tiny_network(), frame_loader(H5SegmentationDataset(id_only), 2), {"temperature": [1, 10]},
             progress=False)


def self_reported(tmp_path, edit=None):
    """A benchmark of a tiny open set and a self-reported submission of a per-image state of it, the state
    changed by ``edit(state)`` (its claims recomputed, so that only the counts can give it away). Returns the
    board's rejected reasons."""
    import io
    import json
    import zipfile

    from segood.data.h5 import ood_masks, set_identity
    from segood.leaderboard import leaderboard, make_benchmark
    from segood.leaderboard.board import _values
    from segood.metrics import accumulator_from_state, make_accumulator

    path = tiny_set(tmp_path / "t.h5", frames=3, side=32)
    make_benchmark({"open": {"sets": {"t": path}, "rank_by": "auroc"}}, tmp_path / "bench.json")
    rng = np.random.default_rng(1)
    acc = make_accumulator(per_image=True)
    for _, mask in ood_masks(path):
        acc.update((rng.random(mask.shape) + (mask == OOD)).astype(np.float32)[None], mask[None])
    state = {k: np.array(v) for k, v in acc.state_dict().items()}
    if edit:
        edit(state)
    tampered = accumulator_from_state(state)
    result, values = _values(tampered)
    claims = {**values, "n_id": result["n_id"], "n_ood": result["n_ood"], "n_ignored": int(tampered.n_ignored)}
    doc = {"schema": "segood.submission/1", "method": {"name": "m", "params": {}}, "sets": {"t": {
        "manifest_sha256": set_identity(path)["manifest_sha256"], "same_source_tuning": False, "claims": claims}}}
    npz = io.BytesIO()
    np.savez(npz, **state)
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(tmp_path / "subs" / "s.zip", "w") as archive:
        archive.writestr("submission.json", json.dumps(doc))
        archive.writestr("states/t.npz", npz.getvalue())
    board = leaderboard(tmp_path / "subs", tmp_path / "bench.json", tmp_path / "board")
    return [r["reason"] for r in board["rejected"]]


def move_mass(state):
    """One ID pixel moved from the lowest occupied bin to the highest: the same totals, another curve."""
    counts = state["counts"]
    occupied = np.argwhere(counts[:, 0, :] > 0)
    (b0, i0), (b1, i1) = occupied[0], occupied[-1]
    counts[b0, 0, i0] -= 1
    counts[b1, 0, i1] += 1


def overfull_image(state):
    """Image 0 given 7 more ID pixels than its 32 x 32 frame holds, taken from image 1: the same totals."""
    counts, offsets = state["image_counts"], state["image_offsets"]
    surplus = 1024 - int(counts[: offsets[1]].sum()) + 7
    counts[0, 0] += surplus
    first = offsets[1] + np.argmax(counts[offsets[1]: offsets[2], 0] >= surplus)
    counts[first, 0] -= surplus


def test_a_self_reported_state_must_add_up(tmp_path):
    assert self_reported(tmp_path / "plain") == []
    [reason] = self_reported(tmp_path / "moved", move_mass)
    assert "the pooled histogram is not the sum of the per-image counts" in reason
    [reason] = self_reported(tmp_path / "overfull", overfull_image)
    assert "an image of 1031 pixels where at most 1024 fit" in reason


def maps_only_submission(tmp_path):
    """(a tiny set, a segood score file of it) for maps-only submissions."""
    from segood.data.h5 import frame_ids, frame_sizes
    from segood.leaderboard.maps import write_maps

    path = tiny_set(tmp_path / "t.h5")
    ids = frame_ids(path)
    write_maps({f: np.full(size, 0.5, np.float32) for f, size in zip(ids, frame_sizes(path))}, ids,
               tmp_path / "maps.h5")
    return path, tmp_path / "maps.h5"


def test_a_full_disk_during_submit_leaves_the_previous_zip(tmp_path, monkeypatch):
    import errno
    import zipfile

    from segood.leaderboard import submit

    data, maps = maps_only_submission(tmp_path)
    out = tmp_path / "subs" / "s.zip"
    submit(None, out, name="first", score_maps={"t": maps}, data={"t": data})
    before = out.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", full)
    with pytest.raises(OSError, match=f"cannot write {out} .*the previous zip is unchanged"):
        submit(None, out, name="second", score_maps={"t": maps}, data={"t": data})
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["s.zip"]


def test_two_submits_into_one_zip_exactly_one_writes(tmp_path, monkeypatch):
    import threading
    import zipfile

    from segood.leaderboard import submission, submit

    data, maps = maps_only_submission(tmp_path)
    out = tmp_path / "s.zip"
    inside, release, add = threading.Event(), threading.Event(), submission._add_float16_maps

    def slow(*args):  # the first submit waits mid-write until the second has tried
        inside.set()
        release.wait(30)
        return add(*args)

    monkeypatch.setattr(submission, "_add_float16_maps", slow)
    first = threading.Thread(target=submit, args=(None, out), kwargs={"name": "first", "score_maps": {"t": maps}})
    first.start()
    assert inside.wait(30)
    monkeypatch.setattr(submission, "_add_float16_maps", add)
    try:
        with pytest.raises(FileExistsError, match=f"another segood submit is writing {out}"):
            submit(None, out, name="second", score_maps={"t": maps})
    finally:
        release.set()
        first.join()
    with zipfile.ZipFile(out) as archive:
        assert archive.testzip() is None and b'"first"' in archive.read("submission.json")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".s.zip")) == []


def test_two_conversions_into_one_path_exactly_one_wins(tmp_path):
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter, manifest_path, read_manifest
    from segood.io import exclusive

    sample = Sample(np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8), np.zeros((8, 8), np.uint8), "f")
    a, b = (SetWriter(tmp_path / "x.h5", (8, 8), {"source": s}) for s in "ab")
    for writer in (a, b):
        writer.append(sample)
    a.commit()
    with pytest.raises(FileExistsError, match="written by another conversion meanwhile"):
        b.commit()
    assert read_manifest(tmp_path / "x.h5")["source"] == "a"
    assert '"source": "a"' in manifest_path(tmp_path / "x.h5").read_text()
    c = SetWriter(tmp_path / "y.h5", (8, 8), {"source": "c"})
    c.append(sample)
    with exclusive(tmp_path / "y.h5", "conversion"), pytest.raises(FileExistsError, match="another conversion"):
        c.commit()  # another conversion is committing y.h5 at this moment
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.h5", "x.manifest.json"]


@pytest.mark.parametrize("where", ["before a map", "inside HDF5"])
def test_a_full_disk_during_export_leaves_no_partial_file_and_the_old_maps(tmp_path, monkeypatch, where):
    import errno

    import h5py
    import torch

    from segood.evaluation import exchange
    from segood.methods import get_method
    from segood.models import build_model

    data = tiny_set(tmp_path / "t.h5", side=32)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    written = exchange.export_scores(model, {"t": data}, [get_method("entropy")], tmp_path / "out", progress=False)
    before = written[("entropy", "t")].read_bytes()
    if where == "before a map":
        class Full:
            f_bavail, f_frsize = 10, 4096

        monkeypatch.setattr(exchange.os, "statvfs", lambda path: Full)
    else:
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(h5py.Group, "create_dataset", full)
    with pytest.raises(OSError, match=f"cannot write {written[('entropy', 't')]} .*No space left"):
        exchange.export_scores(model, {"t": data}, [get_method("entropy")], tmp_path / "out", progress=False)
    assert written[("entropy", "t")].read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out" / "entropy").iterdir()) == ["t.h5"]


def test_a_state_header_declaring_more_than_it_holds_is_refused_before_allocation():
    import io
    import zipfile

    from segood.leaderboard.safe import Rejected, load_npz

    array = io.BytesIO()
    np.lib.format.write_array_header_1_0(array, {"descr": "<i8", "fortran_order": False, "shape": (1 << 37,)})
    array.write(bytes(64))
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as archive:
        archive.writestr("counts.npy", array.getvalue())
    with pytest.raises(Rejected, match=f"'counts' declares {1 << 40} bytes in its header"):
        load_npz(npz.getvalue(), ("counts",))


def test_a_states_arrays_may_grow_with_its_set_and_no_further():
    """A per-image state of many frames outgrows the fixed cap of a state array; the board allows each growing array
    what a state of the set's frames can hold (here: every pixel in a coarse bin of its own), no more."""
    import io

    from segood.leaderboard.board import _state_sizes
    from segood.leaderboard.safe import Rejected, load_npz
    from segood.metrics import FloatOrderAccumulator, grid_spec, make_accumulator
    from segood.metrics.streaming import OPTIONAL_STATE

    rng = np.random.default_rng(0)
    acc = FloatOrderAccumulator(per_image=True)
    frames = [(8, 8)] * 30
    scores = (2.0 ** rng.uniform(-60, 60, (30, 8, 8))).astype(np.float32)  # nearly every pixel a coarse bin
    acc.update(scores, (rng.random((30, 8, 8)) < 0.5).astype(np.uint8))
    state = acc.state_dict()
    npz = io.BytesIO()
    np.savez(npz, **state)
    keys = tuple(make_accumulator(grid_spec()).state_dict())
    sizes = _state_sizes(grid_spec(), frames)
    assert all(state[name].nbytes <= most for name, most in sizes.items())
    assert state["image_counts"].nbytes > 16 * 30 * 50 and state["counts"].nbytes > 1 << 20
    loaded = load_npz(npz.getvalue(), keys, max_bytes=4096, optional=OPTIONAL_STATE, sizes=sizes)
    assert (loaded["image_counts"] == state["image_counts"]).all()
    too_few = _state_sizes(grid_spec(), frames[:3])
    with pytest.raises(Rejected, match="array 'image_(keys|counts)' has .* bytes, over .*, the most a state of this"):
        load_npz(npz.getvalue(), keys, max_bytes=4096, optional=OPTIONAL_STATE, sizes=too_few)


def test_folder_score_files_with_a_group_or_a_lying_header_are_named(tmp_path):
    import h5py

    from segood.evaluation.exchange import ScoreMaps

    ids = ["f/0", "f/1"]
    (tmp_path / "smiyc").mkdir()
    for k in range(2):
        with h5py.File(tmp_path / "smiyc" / f"{k}.hdf5", "w") as f:
            if k:
                f.create_group("value")
            else:
                f["value"] = np.zeros((4, 4), np.float16)
    with ScoreMaps(tmp_path / "smiyc", ids) as maps:
        assert maps["f/0"].shape == (4, 4)
        with pytest.raises(ValueError, match=r"frame f/1: .*1.hdf5 .*its 'value' is a group"):
            maps["f/1"]
    (tmp_path / "fishy").mkdir()
    for k in range(2):
        with open(tmp_path / "fishy" / f"{k}_anomaly.npy", "wb") as f:
            shape = (1 << 20, 1 << 20) if k else (4, 4)
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
            f.write(bytes(64))
    with ScoreMaps(tmp_path / "fishy", ids) as maps:
        with pytest.raises(ValueError, match=r"frame f/1: .*declares a 1048576×1048576 float32 array"):
            maps["f/1"]


def test_a_score_just_outside_the_range_is_shown_as_it_is():
    from segood.metrics import PixelOODAccumulator

    scores = np.array([[[0.25, 1.0000001]]], np.float32)
    with pytest.raises(ValueError, match=r"min 0\.25, max 1\.0000001\d*\)"):
        PixelOODAccumulator(10).update(scores, np.zeros((1, 1, 2), np.uint8))


def test_a_run_that_failed_before_saving_anything_leaves_no_run_behind(tmp_path, monkeypatch):
    import torch

    from segood.evaluation import api, evaluate
    from segood.models import build_model

    data = tiny_set(tmp_path / "t.h5", side=32)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    run = api.run
    monkeypatch.setattr(api, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, [data], ["entropy"], tmp_path / "run", progress=False, figures=False)
    assert not (tmp_path / "run" / "run.json").exists()
    monkeypatch.setattr(api, "run", run)
    doc = evaluate(model, [data], ["max_softmax"], tmp_path / "run", progress=False, figures=False)  # not refused
    assert list(doc["results"]) == ["max_softmax"]


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path):
    import errno

    from segood.io import atomic_output, write_json

    write_json(tmp_path / "results.json", {"a": 1})
    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'results.json'} .*the previous file is unchanged"):
        with atomic_output(tmp_path / "results.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert (tmp_path / "results.json").read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize("stop, code, said", [("SIGTERM", 143, ""),
                                              ("SIGINT", 130, "segood convert: interrupted\n")])  # (Ctrl-C)
def test_a_conversion_stopped_by_sigterm_leaves_no_temporary_file(tmp_path, stop, code, said):
    """SIGTERM ends a command as Ctrl-C does: the set's temporary file is removed, nothing is put in place; Ctrl-C
    says so in one line, no traceback."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "writing"
    child = """
import pathlib, sys, time
from segood.cli import main
from segood.data import h5
append = h5.SetWriter.append
def slow(self, frame):
    append(self, frame)
    pathlib.Path(sys.argv[1]).write_text(str(self.tmp))
    time.sleep(120)
h5.SetWriter.append = slow
sys.exit(main(["convert", "noise", "--out", sys.argv[2], "--count", "3", "--size", "32", "64", "--quiet"]))
"""
    process = subprocess.Popen([sys.executable, "-c", child, str(marker), str(tmp_path / "out" / "noise.h5")],
                               stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if marker.exists() and marker.read_text():
                break
            assert process.poll() is None
            subprocess.run(["sleep", "0.1"])
        assert Path(marker.read_text()).exists()
        process.send_signal(getattr(signal, stop))
        assert process.wait(60) == code
        assert process.stderr.read() == said
    finally:
        process.kill()
    assert list((tmp_path / "out").iterdir()) == []


def test_ctrl_c_says_resume_only_where_a_save_is_there_to_resume(tmp_path, monkeypatch, capsys):
    from segood.evaluation import api
    from segood.models import build_model, save_checkpoint

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    save_checkpoint(tmp_path / "m.pt", build_model("pspnet", "resnet18"))
    monkeypatch.setattr(api, "run", interrupted)
    argv = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(tiny_set(tmp_path / "t.h5", side=32)),
            "--methods", "energy", "--out", str(tmp_path / "run"), "-q"]
    assert main(argv) == 130
    assert capsys.readouterr().err == "segood evaluate: interrupted\n"  # (nothing saved: nothing to resume)
    (tmp_path / "run" / "state.npz").write_bytes(b"")  # (as a run stopped after its first save leaves it)
    assert main(argv) == 130
    assert capsys.readouterr().err == ("segood evaluate: interrupted; the same command with --resume continues from "
                                       "its last save\n")
    from segood.attack import run

    monkeypatch.setattr(run, "attack", interrupted)  # the attack's saves: a record per method and frame
    attack = ["attack", "--target", f"energy={tmp_path / 'm.pt'}", "--frames", str(tmp_path / "t.h5"), "--out",
              str(tmp_path / "attack"), "-q"]
    assert main(attack) == 130 and capsys.readouterr().err == "segood attack: interrupted\n"
    (tmp_path / "attack" / "state" / "energy").mkdir(parents=True)
    (tmp_path / "attack" / "state" / "energy" / "frame0.json").write_text("{}")
    assert main(attack) == 130 and "--resume continues from its last save" in capsys.readouterr().err
    monkeypatch.setenv("SEGOOD_TRACEBACK", "1")
    with pytest.raises(KeyboardInterrupt):
        main(argv)


def test_an_output_behind_a_file_or_in_an_unwritable_folder_is_named(tmp_path, monkeypatch, capsys):
    """A file where an output's folder should be, or a folder that cannot be written: the error names that path
    (the system's names the deepest missing folder, or a temporary file segood made up)."""
    import errno
    import tempfile

    from segood.io import write_json

    path = tiny_set(tmp_path / "t.h5", side=32)
    assert main(["benchmark", "--track", "open", "--sets", str(path), "--out", str(tmp_path / "bench.json")]) == 0
    (tmp_path / "subs").mkdir()
    (tmp_path / "taken").write_text("a file")
    for out in (tmp_path / "taken", tmp_path / "taken" / "board"):
        assert main(["leaderboard", str(tmp_path / "subs"), "--benchmark",
                     str(tmp_path / "bench.json"), "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"segood leaderboard: error: cannot make the folder {out}: "
                                           f"{tmp_path / 'taken'} is a file; choose another path\n")
    assert main(["convert", "noise", "--kind", "normal", "--count", "1", "--size", "8", "8", "--out",
                 str(tmp_path / "taken" / "n.h5"), "--quiet"]) == 2
    assert f"cannot make the folder {tmp_path / 'taken'}: {tmp_path / 'taken'} is a file" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "a file"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(NotADirectoryError, match=rf"cannot make the folder {tmp_path / 'dangling' / 'x'}: "
                                                 rf"{tmp_path / 'dangling'} is a broken link; choose another path$"):
        write_json(tmp_path / "dangling" / "x" / "y.json", {})

    def read_only(*args, **kwargs):  # (tests run as root, for whom no folder is unwritable)
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro" / ".x.json.abc.tmp"))

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(PermissionError, match=rf"^\[Errno 13\] cannot write into {tmp_path / 'ro'} \(Permission "
                                              r"denied\); choose a folder you can write, or give yourself write "
                                              "permission$"):
        write_json(tmp_path / "ro" / "x.json", {})

    def cannot_make(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", cannot_make)
    with pytest.raises(PermissionError, match=rf"^\[Errno 13\] cannot write into {tmp_path / 'ro'} "):  # (the
        write_json(tmp_path / "ro" / "new" / "deeper" / "x.json", {})  # deepest folder there, not one to make)


def test_a_conversion_pools_workers_end_at_sigterm_as_multiprocessing_expects(tmp_path):
    """The command's SIGTERM handler (SystemExit) is not inherited by a conversion's pool workers: one that died
    holding the task queue's lock when Pool.terminate signalled it left the command waiting for ever (1 run in 20
    at --workers 4)."""
    import signal

    from segood.data import SkipFrame, convert
    from segood.data.noise import Noise
    from segood.io import exit_on_sigterm

    class Telling(Noise):
        def load(self, index):
            if index == 0:
                raise SkipFrame(f"SIGTERM: {signal.getsignal(signal.SIGTERM)!r}")
            return super().load(index)

    with exit_on_sigterm():
        manifest = convert(Telling("normal", 3, size=(8, 8)), tmp_path / "n.h5", workers=2, progress=False)
    assert manifest["skipped"] == [{"frame_id": "normal/000000", "reason": "SIGTERM: <Handlers.SIG_DFL: 0>"}]
