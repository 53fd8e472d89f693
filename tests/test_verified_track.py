"""The verified track: private masks, submitted float16 score maps scored by the board, and every unsafe or
wrong map file rejected with its reason."""

import json
import shutil
import zipfile

import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset, frame_ids
from segood.evaluation import evaluate_score_maps
from segood.evaluation.exchange import export_scores
from segood.leaderboard import Limits, leaderboard, make_benchmark, submit
from segood.methods import get_method
from segood.models import build_model

from rawtrees import mixed_noise_sets


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A benchmark whose set perlin_mixed keeps its masks private, maps exported from its public copy and a
    submission of them."""
    root = mixed_noise_sets(tmp_path_factory.mktemp("verified"), seed=3)
    sets = {"perlin_mixed": root / "perlin_mixed.h5", "normal_mixed": root / "normal_mixed.h5"}
    (root / "bench").mkdir()
    make_benchmark({"private": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc",
                                "private": ["perlin_mixed"], "verified_only": True}}, root / "bench" / "bench.json")
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
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
    assert outputs == ["index.html", "leaderboard.json", "leaderboard.md"]


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
}


@pytest.mark.parametrize("case", sorted(BAD_MAPS))
def test_every_bad_map_file_is_rejected_with_its_reason(world, tmp_path, case):
    root, sets, maps = world
    edit, reason = BAD_MAPS[case]
    folder_submission(tmp_path / "subs" / "bad", maps[("entropy", "perlin_mixed")], frame_ids(sets["perlin_mixed"]),
                      edit)
    board = leaderboard(tmp_path / "subs", root / "bench" / "bench.json", tmp_path / "board")
    assert board["tracks"]["private"]["entries"] == []
    assert len(board["rejected"]) == 1 and reason in board["rejected"][0]["reason"], board["rejected"]


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
    assert "maps are read only for its own sets" in reasons["foreign.zip"]
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
    assert "1 entries, 0 rejected" in capsys.readouterr().out
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
