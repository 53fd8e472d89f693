"""The verified track: private masks, submitted float16 score maps scored by the board, and every unsafe or
wrong map file rejected with its reason."""

import json
import shutil
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset, frame_ids, manifest_path
from segood.evaluation import evaluate_score_maps
from segood.evaluation.exchange import export_scores
from segood.leaderboard import Limits, leaderboard, make_benchmark, submit
from segood.leaderboard.safe import MaintainerError, Rejected
from segood.methods import get_method
from segood.models import build_model

from networks import tiny_network


@pytest.fixture(scope="module")
def world(noise_sets, tmp_path_factory):
    """A benchmark whose set perlin_mixed keeps its masks private, maps exported from its public copy and a
    submission of them; all in a private copy of the sets' folder."""
    root = noise_sets(seed=3, copy_to=tmp_path_factory.mktemp("verified") / "sets")
    sets = {"perlin_mixed": root / "perlin_mixed.h5", "normal_mixed": root / "normal_mixed.h5"}
    (root / "bench").mkdir()
    make_benchmark({"private": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc",
                                "private": ["perlin_mixed"], "verified_only": True}}, root / "bench" / "bench.json")
    model = tiny_network()
    public = root / "bench" / "perlin_mixed.public.h5"
    maps = export_scores(model, {"perlin_mixed": public}, [get_method("max_logit"), get_method("entropy")],
                         root / "exports", progress=False)
    (root / "subs").mkdir()
    for method in ("max_logit", "entropy"):
        submit(None, root / "subs" / f"{method}.zip", name=f"PSPNet {method}",
               score_maps={"perlin_mixed": maps[(method, "perlin_mixed")]})
    return root, sets, maps


def test_the_public_copy_has_the_images_and_frame_ids_but_no_masks(world):
    root, sets, _ = world
    public, private = H5SegmentationDataset(root / "bench" / "perlin_mixed.public.h5"), H5SegmentationDataset(
        sets["perlin_mixed"])
    assert frame_ids(root / "bench" / "perlin_mixed.public.h5") == frame_ids(sets["perlin_mixed"])
    for k in range(len(private)):
        assert torch.equal(public[k]["image"], private[k]["image"])
        assert (public[k]["ood_mask"] == 255).all() and (public[k]["semantic"] == 255).all()


def test_verified_entries_equal_a_local_score_of_the_same_maps(world, tmp_path):
    root, sets, _ = world
    board = leaderboard(root / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["rejected"] == []
    entries = board["tracks"]["private"]["entries"]
    assert {e["name"] for e in entries} == {"PSPNet max_logit", "PSPNet entropy"}
    assert all(e["verified"] for e in entries)
    for entry in entries:
        with zipfile.ZipFile(root / "subs" / f"{entry['name'].split()[1]}.zip") as archive:
            archive.extract("scores/perlin_mixed.h5", tmp_path)
        local = evaluate_score_maps(tmp_path / "scores/perlin_mixed.h5", sets["perlin_mixed"], tmp_path / "local",
                                    figures=False)
        pooled = local["results"]["external"]["perlin_mixed"]["pooled"]
        assert entry["sets"]["perlin_mixed"] == {metric: pooled[metric] for metric in entry["sets"]["perlin_mixed"]}
        shutil.rmtree(tmp_path / "local")
    assert "verified" in (tmp_path / "board" / "leaderboard.md").read_text()
    outputs = sorted(p.name for p in (tmp_path / "board").iterdir())
    assert outputs == ["figures", "index.html", "leaderboard.json", "leaderboard.md"]


def test_finite_scores_beyond_float16_are_refused_not_turned_into_ties(world, tmp_path):
    """Verified maps and SMIYC's are float16: finite scores beyond ±65504 would all become ±inf and tie (an AUROC
    of 0.545 read 0.500 from the packaged maps), so submit and export refuse them, naming the frame."""
    import h5py

    from segood.data.h5 import frame_ids
    from segood.evaluation.exchange import half_precision

    _, sets, maps = world
    with h5py.File(maps[("max_logit", "perlin_mixed")], "r") as f, h5py.File(tmp_path / "big.h5", "w") as big:
        for k, frame_id in enumerate(frame_ids(sets["perlin_mixed"])):
            big[frame_id] = f[frame_id][...] + (1e5 if k == 1 else 6e4)  # 6e4: within float16's range
    first = frame_ids(sets["perlin_mixed"])[1]
    with pytest.raises(ValueError, match=rf"^score maps {tmp_path / 'big.h5'}: frame {first}: \d+ finite scores lie "
                                         r"beyond float16's range \(±65504; the largest magnitude 9\d{4}\.\d\), "
                                         r"where they would all become ±inf and tie: rescale the scores \(e\.g\. "
                                         r"divide them by a constant, which keeps their order\)$"):
        submit(None, tmp_path / "big.zip", name="big", score_maps={"perlin_mixed": tmp_path / "big.h5"})
    assert not (tmp_path / "big.zip").exists()
    np.testing.assert_array_equal(half_precision(np.array([-65504.0, 65504.0, np.inf, -np.inf, 1.0]), "x"),
                                  np.array([-65504.0, 65504.0, np.inf, -np.inf, 1.0], np.float16))  # ±inf as given
    with pytest.raises(ValueError, match="^x: 1 finite scores lie beyond float16's range"):
        half_precision(np.array([65520.0, 1.0]), "x")  # (65520 rounds to inf)

    huge = tiny_network()
    with torch.no_grad():  # logits scaled to reach about 1e6: max logit beyond float16
        huge.classifier.weight.mul_(1e6)
    with pytest.raises(ValueError, match=r"perlin_mixed/\S+\.hdf5: \d+ finite scores lie beyond float16's range .*: "
                                         "export this method in the segood or fishyscapes layout, which keep float32 "
                                         "scores$"):
        export_scores(huge, {"perlin_mixed": sets["perlin_mixed"]}, [get_method("max_logit")], tmp_path / "e",
                      layout="smiyc", progress=False)


def test_one_set_under_two_names_is_refused_by_submit(world, tmp_path):
    """The board judged the second name as a set the benchmark lacks: submit refuses it, naming both."""
    _, sets, maps = world
    public = sets["perlin_mixed"].parent / "bench" / "perlin_mixed.public.h5"
    entropy = maps[("entropy", "perlin_mixed")]
    with pytest.raises(ValueError, match=r"^sets 'perlin_mixed' and 'copy' are one set \(manifest sha256 "
                                         r"[0-9a-f]{12}…\): give it once, under its own name$"):
        submit(None, tmp_path / "two.zip", name="two", data={"perlin_mixed": public, "copy": public},
               score_maps={"perlin_mixed": entropy, "copy": entropy})
    assert not (tmp_path / "two.zip").exists()


def test_component_metrics_of_verified_entries_equal_a_local_computation(world, tmp_path):
    """A track with components: each verified entry's sIoU / PPV / F1* per set, at its best pixel-F1 threshold on
    the set (SMIYC's choice), equal those of the same maps computed here from the set's own masks."""
    from segood.data.h5 import ood_masks
    from segood.metrics import make_accumulator
    from segood.metrics.components import ComponentAccumulator, best_f1_threshold

    root, sets, _ = world
    make_benchmark({"parts": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc",
                              "private": ["perlin_mixed"], "components": "obstacle"}}, tmp_path / "b" / "bench.json")
    board = leaderboard(root / "subs", tmp_path / "b" / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and board["tracks"]["parts"]["components"] == "obstacle"
    masks = list(ood_masks(sets["perlin_mixed"]))
    for entry in board["tracks"]["parts"]["entries"]:
        with zipfile.ZipFile(root / "subs" / f"{entry['name'].split()[1]}.zip") as archive, \
                h5py.File(archive.open("scores/perlin_mixed.h5")) as f:
            maps = [f[frame_id][...] for frame_id, _ in masks]
        pixels = make_accumulator()
        for score, (_, mask) in zip(maps, masks):
            pixels.update(score, mask)
        want = ComponentAccumulator(best_f1_threshold(pixels.compute()), "obstacle")
        for score, (_, mask) in zip(maps, masks):
            want.update(score, mask)
        want = want.compute()
        got = entry["components"]["perlin_mixed"]
        assert got == pytest.approx({k: want[k] for k in ("siou", "ppv", "f1_star", "threshold")}, abs=1e-12)
    text = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "### parts — component metrics" in text and "(obstacle preset)" in text and "ORACLE" in text
    plain = leaderboard(root / "subs", root / "bench" / "bench.json", tmp_path / "plain")  # a track without them
    assert all("components" not in e for e in plain["tracks"]["private"]["entries"])
    with pytest.raises(ValueError, match="components must be one of"):
        make_benchmark({"t": {"sets": sets, "rank_by": "auroc", "components": "roads"}}, tmp_path / "c.json")


def folder_submission(folder, maps, frames, edit=None):
    """A folder submission whose scores/perlin_mixed.h5 is written by ``edit(file, frames)`` (default: valid)."""
    (folder / "scores").mkdir(parents=True)
    doc = {"schema": "segood.submission/1", "method": {"name": "X", "params": {}}, "sets": {
        "perlin_mixed": {"scores": "scores/perlin_mixed.h5", "same_source_tuning": False}}}
    (folder / "submission.json").write_text(json.dumps(doc))
    with h5py.File(maps, "r") as source, h5py.File(folder / "scores/perlin_mixed.h5", "w") as f:
        for frame_id in frames:
            f.create_dataset(frame_id, data=source[frame_id][...].astype(np.float16))
        if edit:
            edit(f, frames)


def replace(f, frame_id, **kwargs):
    data = kwargs.pop("data", f[frame_id][...])
    del f[frame_id]
    f.create_dataset(frame_id, data=data, **kwargs)


def nan_map(f, frames):
    data = f[frames[1]][...]
    data[3, 4] = np.nan
    replace(f, frames[1], data=data)


def virtual(f, frames):
    layout = h5py.VirtualLayout(shape=f[frames[0]].shape, dtype=np.float16)
    layout[...] = h5py.VirtualSource(f[frames[1]])
    del f[frames[0]]
    f.create_virtual_dataset(frames[0], layout)


BAD_MAPS = {
    "missing frame": (lambda f, fr: f.__delitem__(fr[0]), "missing"),
    "extra map": (lambda f, fr: f.create_dataset("not/a/frame", data=np.zeros((2, 2), np.float16)), "extra"),
    "wrong shape": (lambda f, fr: replace(f, fr[0], data=np.zeros((5, 7), np.float16)), "shape"),
    "float32": (lambda f, fr: replace(f, fr[0], data=f[fr[0]][...].astype(np.float32)), "float16"),
    "NaN scores": (nan_map, "1 NaN scores"),
    "shuffle filter": (lambda f, fr: replace(f, fr[0], compression="gzip", shuffle=True), "filter 'shuffle'"),
    "external link": (lambda f, fr: (f.__delitem__(fr[0]), f.__setitem__(fr[0], h5py.ExternalLink("/etc/x.h5", "/y"))),
                      "ExternalLink"),
    "soft link": (lambda f, fr: (f.__delitem__(fr[0]), f.__setitem__(fr[0], h5py.SoftLink("/" + fr[1]))), "SoftLink"),
    "virtual dataset": (virtual, "virtual"),
    # one map in a chunk far larger than its frame: decompressing it would take 32 MiB for a 64×64 frame
    "chunk over a frame": (lambda f, fr: replace(f, fr[0], maxshape=(None, None), chunks=(4096, 4096),
                                                 compression="gzip"), "larger than the 64×64 frame"),
    "damaged gzip chunk": (lambda f, fr: (replace(f, fr[0], chunks=(64, 64), compression="gzip"),
                                          f[fr[0]].id.write_direct_chunk((0, 0), b"not deflate data" * 8)),
                           "frame {}: its stored scores cannot be read"),
    "hard links": (lambda f, fr: [f.__setitem__(f"again_{k}", f[fr[0]]) for k in range(50)], "more than the"),
    "stray dataset": (lambda f, fr: f.create_dataset("junk", data=np.zeros(3)), "need: extra 'junk'"),
}


def test_a_track_a_verified_submission_does_not_cover_leaves_it_to_the_others(world, tmp_path):
    root, sets, _ = world
    make_benchmark({"private": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc",
                                "private": ["perlin_mixed"], "verified_only": True},
                    "open": {"sets": {"normal_mixed": sets["normal_mixed"]}, "rank_by": "auroc"}},
                   tmp_path / "bench" / "two.json")
    board = leaderboard(root / "subs", tmp_path / "bench" / "two.json", tmp_path / "board")
    assert board["rejected"] == [] and len(board["tracks"]["private"]["entries"]) == 2
    assert board["tracks"]["open"]["entries"] == []


def test_maps_in_chunks_of_a_few_scores_are_refused(world, tmp_path):
    root, sets, maps = world
    folder_submission(tmp_path / "subs" / "tiny_chunks", maps[("entropy", "perlin_mixed")],
                      frame_ids(sets["perlin_mixed"]), lambda f, fr: replace(f, fr[0], chunks=(1, 1)))
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert "stored in chunks of shape (1, 1), of fewer than 1024 scores" in board["rejected"][0]["reason"]


def test_a_map_file_that_is_no_hdf5_is_named_as_the_submission_names_it(tmp_path):
    from segood.leaderboard.maps import read_maps

    (tmp_path / "map0.h5").write_bytes(b"hello")
    with pytest.raises(Rejected, match=r"^scores/perlin_mixed.h5: not a readable HDF5 file"):
        next(read_maps(tmp_path / "map0.h5", [("a", 2, 2)], "scores/perlin_mixed.h5"))


@pytest.mark.parametrize("case", sorted(BAD_MAPS))
def test_every_bad_map_file_is_rejected_with_its_reason(world, tmp_path, case):
    root, sets, maps = world
    edit, reason = BAD_MAPS[case]
    folder_submission(tmp_path / "subs" / "bad", maps[("entropy", "perlin_mixed")], frame_ids(sets["perlin_mixed"]),
                      edit)
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["tracks"]["private"]["entries"] == []
    assert len(board["rejected"]) == 1 and reason.format(frame_ids(sets["perlin_mixed"])[0]) in \
        board["rejected"][0]["reason"], board["rejected"]


def test_big_endian_float16_maps_score_as_the_native_ones(world, tmp_path):
    root, sets, maps = world
    frames = frame_ids(sets["perlin_mixed"])

    def big_endian(f, fr):
        for frame_id in fr:
            replace(f, frame_id, data=f[frame_id][...].astype(">f2"))

    folder_submission(tmp_path / "subs" / "native", maps[("entropy", "perlin_mixed")], frames)
    folder_submission(tmp_path / "subs" / "swapped", maps[("entropy", "perlin_mixed")], frames, big_endian)
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["rejected"] == []
    native, swapped = (e["sets"] for e in board["tracks"]["private"]["entries"])
    assert native == swapped


def private_world(world, tmp_path):
    """A benchmark of a copy of the private set (to damage), and the entropy submission."""
    root, sets, _ = world
    shutil.copy(sets["perlin_mixed"], tmp_path / "perlin_mixed.h5")
    shutil.copy(manifest_path(sets["perlin_mixed"]), manifest_path(tmp_path / "perlin_mixed.h5"))
    (tmp_path / "bench").mkdir()
    make_benchmark({"private": {"sets": {"perlin_mixed": tmp_path / "perlin_mixed.h5"}, "rank_by": "auroc",
                                "private": ["perlin_mixed"], "verified_only": True}}, tmp_path / "bench" / "bench.json")
    (tmp_path / "subs").mkdir()
    shutil.copy(root / "subs" / "entropy.zip", tmp_path / "subs" / "entropy.zip")
    return tmp_path / "perlin_mixed.h5", tmp_path / "bench" / "bench.json", tmp_path / "subs"


def test_a_damaged_private_mask_stops_the_board_and_blames_no_submission(world, tmp_path, capsys):
    private, bench, subs = private_world(world, tmp_path)
    with h5py.File(private, "r+") as f:  # a mask chunk rewritten; the manifest unchanged
        mask = f["ood_mask"]["1"][...]
        f["ood_mask"]["1"][...] = np.where(mask == 1, 0, mask)
    with pytest.raises(MaintainerError, match=f"the maintainer's set {private}"):
        leaderboard(subs, bench, tmp_path / "board")
    assert not (tmp_path / "board" / "leaderboard.json").exists()
    assert main(["leaderboard", str(subs), "--benchmark", str(bench), "--out", str(tmp_path / "board")]) == 2
    err = capsys.readouterr().err
    assert str(private) in err and "unreadable submission" not in err
    assert sorted(p.name for p in (tmp_path / "board").iterdir()) == []  # nothing published, nothing left


def test_a_full_disk_stops_the_board_naming_the_file_it_could_not_write(world, tmp_path, monkeypatch):
    import errno

    from segood.leaderboard import safe

    _, bench, subs = private_world(world, tmp_path)

    class Full:
        def __init__(self, path, mode):
            self.path = path

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(safe, "open", Full, raising=False)
    with pytest.raises(MaintainerError, match=r"cannot write .*map0\.h5 .*No space left"):
        leaderboard(subs, bench, tmp_path / "board")
    assert sorted(p.name for p in (tmp_path / "board").iterdir()) == []


def test_the_board_copies_maps_under_its_own_folder_and_removes_them(world, tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from segood.leaderboard import safe

    root = world[0]
    system_temp = tmp_path / "system_temp"
    system_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "board" / f".judge-{int(dead.stdout)}-killed"  # left by a board that was killed
    stale.mkdir(parents=True)
    (stale / "scores_perlin_mixed.h5").write_bytes(b"x")
    spilled, spill = [], safe._spill
    monkeypatch.setattr(safe, "_spill", lambda *a: spilled.append(spill(*a)) or spilled[-1])
    board = leaderboard(root / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and len(spilled) == 2
    assert all((tmp_path / "board") in p.parents for p in spilled)
    assert list(system_temp.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "board").iterdir()) == ["figures", "index.html", "leaderboard.json",
                                                                      "leaderboard.md"]


def test_a_set_name_too_long_for_a_file_name_is_judged_like_any_other(world, tmp_path):
    """Copies of maps are named by position, not by the submitted set name (300 characters made the copy fail as
    the maintainer's fault, and no board was written)."""
    root = world[0]
    (tmp_path / "subs").mkdir()
    long = "x" * 300
    with zipfile.ZipFile(root / "subs" / "entropy.zip") as a, \
            zipfile.ZipFile(tmp_path / "subs" / "long.zip", "w") as b:
        doc = json.loads(a.read("submission.json"))
        entry = doc["sets"].pop("perlin_mixed")
        bench = json.loads((root / "bench" / "bench.json").read_text())
        digest = next(t["sets"]["perlin_mixed"]["manifest_sha256"] for t in bench["tracks"].values()
                      if "perlin_mixed" in t["sets"])
        doc["sets"][long] = {**entry, "scores": f"scores/{long}.h5", "manifest_sha256": digest}  # matched by it
        b.writestr("submission.json", json.dumps(doc))
        b.writestr(f"scores/{long}.h5", a.read("scores/perlin_mixed.h5"))
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and all(len(track["entries"]) == 1 for track in board["tracks"].values())


def test_maps_of_sets_the_benchmark_lacks_are_refused_before_any_is_copied(world, tmp_path, monkeypatch):
    from segood.leaderboard import safe

    root = world[0]
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(root / "subs" / "entropy.zip") as a, \
            zipfile.ZipFile(tmp_path / "subs" / "many.zip", "w") as b:
        for info in a.infolist():
            b.writestr(info, a.read(info))
        for k in range(20):  # maps for sets the benchmark lacks: none may reach the disk
            b.writestr(f"scores/other_{k}.h5", a.read("scores/perlin_mixed.h5"))
    spilled = []
    monkeypatch.setattr(safe, "_spill", lambda *a: spilled.append(a))
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert spilled == [] and ("scores/other_0.h5: no set of the benchmark that submission.json gives score maps "
                              "for ('scores' in its entry)") in board["rejected"][0]["reason"]


def test_a_map_larger_than_its_frames_need_is_refused_while_copied(world, tmp_path):
    """A real map followed by 64 MiB of zeros deflates to a small member; it is stopped at what the set's frames can
    need (twice each float16 frame, 64 KiB each, 1 MiB in all), not copied to the 4 GiB map limit."""
    root = world[0]
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(root / "subs" / "entropy.zip") as a, \
            zipfile.ZipFile(tmp_path / "subs" / "padded.zip", "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            if info.filename == "scores/perlin_mixed.h5":
                with b.open(info.filename, "w", force_zip64=True) as member:
                    member.write(a.read(info))
                    for _ in range(64):
                        member.write(bytes(1 << 20))
            else:
                b.writestr(info, a.read(info))
    assert (tmp_path / "subs" / "padded.zip").stat().st_size < 1 << 20
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    bench = json.loads((root / "bench" / "bench.json").read_text())
    sizes = next(t["sets"]["perlin_mixed"]["frame_sizes"] for t in bench["tracks"].values()
                 if "perlin_mixed" in t["sets"])
    need = sum(4 * h * w + (64 << 10) for h, w in sizes) + (1 << 20)
    size = zipfile.ZipFile(root / "subs" / "entropy.zip").getinfo("scores/perlin_mixed.h5").file_size + (64 << 20)
    assert [r["reason"] for r in board["rejected"]] == [
        f"member 'scores/perlin_mixed.h5' would expand to {size} bytes, over the limit {need}"]


def test_the_maps_of_one_submission_are_capped_in_all(world, tmp_path):
    root = world[0]
    size = zipfile.ZipFile(root / "subs" / "entropy.zip").getinfo("scores/perlin_mixed.h5").file_size
    board = leaderboard(root / "subs", root / "bench" / "bench.json", tmp_path / "board",
                        Limits(maps_bytes=size - 1))
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    assert reasons["entropy.zip"] == f"score maps of {size} bytes in all, over the limit {size - 1}"
    assert len(reasons) == 2 and "in all, over the limit" in reasons["max_logit.zip"]


@pytest.mark.parametrize("flag, reason", [(0x1, "submit an unencrypted zip"), (None, "compression method")])
def test_encrypted_and_unknown_compression_members_are_refused_with_a_reason(world, tmp_path, flag, reason):
    root = world[0]
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(root / "subs" / "entropy.zip") as a, zipfile.ZipFile(tmp_path / "subs" / "x.zip", "w") as b:
        for info in a.infolist():
            b.writestr(info, a.read(info))
    data = bytearray((tmp_path / "subs" / "x.zip").read_bytes())
    with zipfile.ZipFile(tmp_path / "subs" / "x.zip") as archive:
        info = archive.getinfo("submission.json")
    # the central directory entry of submission.json: flag bits at +8, compression method at +10
    central = data.index(b"PK\x01\x02" + data[data.index(b"PK\x01\x02") + 4:][:0], data.rindex(b"submission.json")
                         - 46)
    if flag:
        data[central + 8] |= flag
    else:
        data[central + 10:central + 12] = (99).to_bytes(2, "little")
    (tmp_path / "subs" / "x.zip").write_bytes(bytes(data))
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert reason in board["rejected"][0]["reason"], board["rejected"]


def test_sizes_foreign_sets_and_states_for_private_sets_are_refused(world, tmp_path):
    root, sets, maps = world
    good = root / "subs" / "entropy.zip"
    bench = root / "bench" / "bench.json"
    limits = Limits(map_bytes=1000)  # smaller than the map: refused before it is copied
    board = leaderboard(root / "subs", bench, tmp_path / "small", limits)
    assert all("over the limit 1000" in r["reason"] for r in board["rejected"]) and len(board["rejected"]) == 2
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(good) as a, zipfile.ZipFile(tmp_path / "subs" / "foreign.zip", "w") as b:
        for info in a.infolist():
            b.writestr(info, a.read(info))
        b.writestr("scores/normal_mixed.h5", a.read("scores/perlin_mixed.h5"))
    state_only = tmp_path / "subs" / "state.zip"
    with zipfile.ZipFile(state_only, "w") as b:
        b.writestr("submission.json", json.dumps({"schema": "segood.submission/1", "method": {"name": "S"}, "sets": {
            "perlin_mixed": {"manifest_sha256": "0" * 64, "same_source_tuning": False, "claims": {
                "auroc": 0.9, "auprc": 0.5, "fpr95": 0.1, "max_iou": 0.5, "n_id": 1, "n_ood": 1, "n_ignored": 0}}}}))
    board = leaderboard(tmp_path / "subs", bench, tmp_path / "board")
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    assert "maps are read only for those" in reasons["foreign.zip"]
    assert "keeps its masks private" in reasons["state.zip"]


def test_verified_only_tracks_and_self_reported_marks(world, tmp_path):
    root, sets, maps = world
    run = root / "run"
    torch.manual_seed(0)
    from segood.evaluation import evaluate

    evaluate(build_model("pspnet", "resnet18").eval(), {"normal_mixed": sets["normal_mixed"]}, ["entropy"], run,
             progress=False, figures=False)
    for verified_only in (False, True):
        bench = tmp_path / f"bench_{verified_only}.json"
        make_benchmark({"open": {"sets": {"normal_mixed": sets["normal_mixed"]}, "rank_by": "auroc",
                                 "verified_only": verified_only}}, bench)
        subs = tmp_path / f"subs_{verified_only}"
        submit(run, subs / "states.zip", method="entropy", name="states")
        maps = export_scores(build_model("pspnet", "resnet18").eval(), {"normal_mixed": sets["normal_mixed"]},
                             [get_method("entropy")], tmp_path / "exp", progress=False)
        submit(run, subs / "maps.zip", method="entropy", name="maps",
               score_maps={"normal_mixed": maps[("entropy", "normal_mixed")]})
        board = leaderboard(subs, bench, tmp_path / f"board_{verified_only}")
        marks = {e["name"]: e["verified"] for e in board["tracks"]["open"]["entries"]}
        if verified_only:
            assert marks == {"maps": True} and "ranks verified entries only" in board["rejected"][0]["reason"]
        else:
            assert marks == {"states": False, "maps": True}
            assert "self-reported" in (tmp_path / "board_False" / "leaderboard.md").read_text()


def test_cli_private_benchmark_and_maps_only_submission(world, tmp_path, capsys):
    root, sets, maps = world
    assert main(["benchmark", "--track", "t", "--sets", str(sets["perlin_mixed"]), "--private", "perlin_mixed",
                 "--verified-only", "--out", str(tmp_path / "b" / "bench.json")]) == 0
    assert (tmp_path / "b" / "perlin_mixed.public.h5").exists()
    assert main(["submit", "--scores", f"perlin_mixed={maps[('entropy', 'perlin_mixed')]}", "--method-name", "E",
                 "--out", str(tmp_path / "subs" / "e.zip")]) == 0
    assert main(["leaderboard", str(tmp_path / "subs"), "--benchmark", str(tmp_path / "b" / "bench.json"), "--out",
                 str(tmp_path / "board")]) == 0
    assert "1 entry, 0 rejected" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["submit", "--scores", "no-equals-sign", "--method-name", "E", "--out", str(tmp_path / "x.zip")])
    assert "write SET=FILE" in capsys.readouterr().err


def test_a_changed_maintainer_set_stops_the_board(world, tmp_path):
    root = world[0]
    bench = json.loads((root / "bench" / "bench.json").read_text())
    bench["tracks"]["private"]["sets"]["perlin_mixed"]["manifest_sha256"] = "f" * 64
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    with pytest.raises(ValueError, match="not the one the benchmark was written for"):
        leaderboard(root / "subs", tmp_path / "bench.json", tmp_path / "board")


def test_verified_entries_get_intervals_and_share_ranks_only_when_not_significantly_different(world, tmp_path):
    from segood.data.h5 import ood_masks
    from segood.leaderboard.maps import write_maps

    root, sets, _ = world
    rng = np.random.default_rng(0)
    masks = dict(ood_masks(sets["perlin_mixed"]))
    informed = {f: (m == 1) + rng.normal(0, 0.8, m.shape) for f, m in masks.items()}  # a good detector
    noise = {f: rng.normal(0, 1, m.shape) for f, m in masks.items()}  # a useless one
    (tmp_path / "subs").mkdir()
    for name, maps in (("good", informed), ("good again", informed), ("noise", noise)):
        write_maps(maps, list(maps), tmp_path / "maps.h5")
        submit(None, tmp_path / "subs" / f"{name}.zip", name=name, score_maps={"perlin_mixed": tmp_path / "maps.h5"})
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    entries = {e["name"]: e for e in board["tracks"]["private"]["entries"]}
    assert entries["good"]["rank"] == entries["good again"]["rank"] == 1 and entries["noise"]["rank"] == 3
    for entry in entries.values():
        lo, hi = entry["interval"]
        assert lo <= entry["score"] <= hi
    assert "image-level bootstrap interval" in (tmp_path / "board" / "leaderboard.md").read_text()


def test_the_same_zip_under_two_names_is_ranked_once(world, tmp_path):
    root = world[0]
    (tmp_path / "subs").mkdir()
    for name in ("a.zip", "b.zip"):
        shutil.copy(root / "subs" / "entropy.zip", tmp_path / "subs" / name)
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert [e["file"] for e in board["tracks"]["private"]["entries"]] == ["a.zip"]
    [rejected] = board["rejected"]
    assert rejected["file"] == "b.zip" and rejected["reason"].startswith("the same submission as a.zip")


def test_a_board_stopped_by_sigterm_leaves_no_copies_and_no_board(world, tmp_path):
    import signal
    import subprocess
    import sys

    root = world[0]
    marker = tmp_path / "judging"
    child = """
import pathlib, sys, time
from segood.leaderboard import leaderboard, safe
spill = safe._spill
def slow(*args):
    path = spill(*args)
    pathlib.Path(sys.argv[4]).write_text(str(path))
    time.sleep(120)
safe._spill = slow
leaderboard(sys.argv[1], sys.argv[2], sys.argv[3])
"""
    process = subprocess.Popen([sys.executable, "-c", child, str(root / "subs"), str(root / "bench" / "bench.json"),
                                str(tmp_path / "board"), str(marker)])
    try:
        for _ in range(600):
            if marker.exists() and marker.read_text():
                break
            process.poll()
            assert process.returncode is None
            subprocess.run(["sleep", "0.1"])
        copied = Path(marker.read_text())
        assert copied.exists() and (tmp_path / "board") in copied.parents
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) != 0
    finally:
        process.kill()
    assert list((tmp_path / "board").iterdir()) == []
