"""Submissions and the leaderboard: recompute, never believe; every bad file rejected with its reason."""

import html.parser
import io
import json
import os
import pickle
import shutil
import subprocess
import time
import zipfile

import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data import H5SegmentationDataset
from segood.evaluation import evaluate
from segood.leaderboard import Limits, leaderboard, make_benchmark, submit
from segood.methods.tuning import tune
from segood.metrics import grid_spec

from networks import tiny_network


@pytest.fixture(scope="module")
def world(noise_sets, tmp_path_factory):
    """Two sets, a benchmark over them, a run of three methods and their valid submissions: all in a private
    copy of the sets' folder."""
    root = noise_sets(seed=1, copy_to=tmp_path_factory.mktemp("board") / "sets")
    sets = {"perlin_mixed": root / "perlin_mixed.h5", "normal_mixed": root / "normal_mixed.h5"}
    # the paper's linear grid here: the forgeries below edit its state; the float-order grid's board: test_float_order_board
    make_benchmark({"noise": {"sets": sets, "rank_by": "auroc"}}, root / "bench.json", grid=grid_spec(400))
    model = tiny_network()
    loader = torch.utils.data.DataLoader(H5SegmentationDataset(sets["perlin_mixed"]), batch_size=2)
    tuned = tune("odin", model, loader, {"temperature": [1, 1000], "epsilon": [0.0], "form": ["softmax"]},
                 progress=False).method()  # the paper's [0, 1] form: the linear grid below
    doc = evaluate(model, sets, ["max_softmax", "entropy", tuned], root / "run", progress=False, figures=False,
                   num_thresholds=400)
    (root / "subs").mkdir()
    for method in ("max_softmax", "entropy"):
        submit(root / "run", root / "subs" / f"{method}.zip", method=method, name=f"PSPNet {method}")
    return root, doc


def rebuild(src, dst, edit=None, extra=None):
    """Copy a submission zip, optionally editing submission.json (a function) or adding raw members."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            data = a.read(info)
            if info.filename == "submission.json" and edit:
                doc = json.loads(data)
                edit(doc)
                data = json.dumps(doc).encode()
            b.writestr(info.filename, data)
        for name, data in (extra or {}).items():
            b.writestr(name, data)


def test_round_trip_and_ranking(world, tmp_path):
    root, run = world
    board = leaderboard(root / "subs", root / "bench.json", tmp_path)
    entries = board["tracks"]["noise"]["entries"]
    assert [e["name"] for e in entries] == sorted(
        ["PSPNet max_softmax", "PSPNet entropy"],
        key=lambda n: -np.mean([run["results"][n.split()[1]][s]["pooled"]["auroc"] for s in ("perlin_mixed", "normal_mixed")]))
    for entry in entries:
        method = entry["name"].split()[1]
        for set_name in ("perlin_mixed", "normal_mixed"):
            for metric in ("auroc", "auprc", "fpr95", "max_iou"):
                assert entry["sets"][set_name][metric] == run["results"][method][set_name]["pooled"][metric]
    assert board["rejected"] == []
    assert "PSPNet entropy" in (tmp_path / "index.html").read_text()
    notes = [line.split(" | ")[-2] for line in (tmp_path / "leaderboard.md").read_text().splitlines()
             if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert notes == ["self-reported", "self-reported"]  # nothing else to note: no separator left dangling


def test_a_state_of_the_other_grid_is_named_as_such(world, tmp_path):
    root, _ = world
    make_benchmark({"noise": {"sets": {s: root / f"{s}.h5" for s in ("perlin_mixed", "normal_mixed")},
                              "rank_by": "auroc"}}, tmp_path / "float.json")  # (the float-order grid's board)
    board = leaderboard(root / "subs", tmp_path / "float.json", tmp_path / "board")
    assert {r["reason"] for r in board["rejected"]} == {
        "set 'perlin_mixed': binned on the linear grid; the benchmark asks for the float-order grid at 10 mantissa "
        "bits: evaluate on its grid and submit again"}


def test_a_submission_of_any_name_is_judged_and_the_submissions_folder_is_never_the_boards(world, tmp_path):
    root, _ = world
    subs = tmp_path / "subs"
    shutil.copytree(root / "subs", subs)
    (subs / "entropy.zip").rename(subs / ".judge-1-team.zip")  # (a name like the board's own copies')
    board = leaderboard(subs, root / "bench.json", tmp_path / "board")
    assert {e["file"] for e in board["tracks"]["noise"]["entries"]} == {".judge-1-team.zip", "max_softmax.zip"}
    for out, work in ((subs, None), (tmp_path / "board", subs)):
        with pytest.raises(ValueError, match="the board's folder .* is the submissions' folder"):
            leaderboard(subs, root / "bench.json", out, work=work)
    assert sorted(p.name for p in subs.iterdir()) == [".judge-1-team.zip", "max_softmax.zip"]


def test_a_lower_is_better_metric_ranks_ascending_equal_scores_by_name_self_reported_never_tied(world, tmp_path):
    """Ranked by FPR95 (lower is better), the score the mean over the sets; a twin of an entry under another name
    has its score exactly and comes after it by name, whatever the files' order, at a rank of its own."""
    root, run = world
    sets = {s: root / f"{s}.h5" for s in ("perlin_mixed", "normal_mixed")}
    make_benchmark({"noise": {"sets": sets, "rank_by": "fpr95"}}, tmp_path / "bench.json", grid=grid_spec(400))
    (tmp_path / "subs").mkdir()
    for method in ("max_softmax", "entropy"):
        shutil.copy(root / "subs" / f"{method}.zip", tmp_path / "subs" / f"{method}.zip")
    rebuild(root / "subs" / "entropy.zip", tmp_path / "subs" / "a_twin.zip",  # (judged first: files in name order)
            edit=lambda d: d["method"].update(name="Twin of entropy"))
    entries = leaderboard(tmp_path / "subs", tmp_path / "bench.json", tmp_path / "board")["tracks"]["noise"]["entries"]
    fpr95 = {m: [run["results"][m][s]["pooled"]["fpr95"] for s in sets] for m in ("max_softmax", "entropy")}
    assert fpr95["max_softmax"] != fpr95["entropy"]
    for entry in entries:
        assert entry["score"] == pytest.approx(np.mean([entry["sets"][s]["fpr95"] for s in sets]), abs=1e-15)
    order = sorted(["PSPNet max_softmax", "PSPNet entropy"], key=lambda n: np.mean(fpr95[n.split()[1]]))
    order.insert(order.index("PSPNet entropy") + 1, "Twin of entropy")
    assert [e["name"] for e in entries] == order
    assert [e["rank"] for e in entries] == [1, 2, 3]


def test_claims_must_match_the_recomputed_counts_and_values_within_the_tolerance():
    from segood.leaderboard.board import TOLERANCE, _check, _values
    from segood.leaderboard.safe import Rejected
    from segood.metrics import make_accumulator

    acc = make_accumulator(grid_spec(400)).update(np.array([0.1, 0.4, 0.35, 0.8, 0.9, 0.2]),
                                                  np.array([0, 0, 1, 1, 255, 0], np.uint8))
    pixels = {"id": 3, "ood": 2, "ignore": 1}
    claims = {"n_id": 3, "n_ood": 2, "n_ignored": 1, **_values(acc)[1]}
    assert claims["auroc"] == pytest.approx(5 / 6, abs=1e-12)  # (one ID score above an OOD one of 2 x 3 pairs)
    assert TOLERANCE == 1e-6 and _check("s", acc, {**claims, "auroc": claims["auroc"] + 0.9e-6}, pixels) == \
        _values(acc)[1]
    for change, reason in (({"auroc": claims["auroc"] + 2e-6}, "claimed auroc"),
                           ({"n_ignored": 0}, "claimed n_ignored 0"), ({"n_id": 4}, "claimed n_id 4 but the state")):
        with pytest.raises(Rejected, match=reason):
            _check("s", acc, {**claims, **change}, pixels)
    with pytest.raises(Rejected, match="do not match the set's pixels"):
        _check("s", acc, claims, {**pixels, "ignore": 2})

def test_a_track_a_submission_does_not_cover_leaves_it_to_the_others(world, tmp_path):
    """A self-reported submission cannot enter a track of private masks, but still ranks on the open track;
    covering no track at all, it is rejected with every track's reason."""
    root, _ = world
    tracks = {"open": {"sets": {"perlin_mixed": root / "perlin_mixed.h5"}, "rank_by": "auroc"},
              "hidden": {"sets": {"normal_mixed": root / "normal_mixed.h5"}, "rank_by": "auroc",
                         "private": ["normal_mixed"], "verified_only": True}}
    make_benchmark(tracks, tmp_path / "bench.json", grid=grid_spec(400))
    board = leaderboard(root / "subs", tmp_path / "bench.json", tmp_path / "board")
    assert board["rejected"] == []
    assert len(board["tracks"]["open"]["entries"]) == 2 and board["tracks"]["hidden"]["entries"] == []
    for grid, message in ((grid_spec(0), "num_thresholds must be at least 2"),
                          (grid_spec(mantissa_bits=99), r"mantissa_bits must be in \[1, 14\]")):
        with pytest.raises(ValueError, match=message):  # refused here, not blamed on every submitter later
            make_benchmark(tracks, tmp_path / "bad.json", grid=grid)
    make_benchmark({"hidden": tracks["hidden"]}, tmp_path / "hidden.json", grid=grid_spec(400))
    board = leaderboard(root / "subs", tmp_path / "hidden.json", tmp_path / "board2")
    assert all("keeps its masks private" in r["reason"] for r in board["rejected"]) and len(board["rejected"]) == 2


def test_same_source_tuning_needs_consent_and_shows_and_a_submission_zip_has_no_dates(world, tmp_path, monkeypatch):
    root, _ = world
    with pytest.raises(ValueError, match="same source"):
        submit(root / "run", tmp_path / "odin.zip", method="odin", name="ODIN")
    submit(root / "run", tmp_path / "subs" / "odin.zip", method="odin", name="ODIN", allow_same_source=True)
    later = time.time() + 86400
    with monkeypatch.context() as clock:  # (a day later: no dates in the zip)
        clock.setattr("time.time", lambda: later)
        submit(root / "run", tmp_path / "again.zip", method="odin", name="ODIN", allow_same_source=True)
    assert (tmp_path / "again.zip").read_bytes() == (tmp_path / "subs" / "odin.zip").read_bytes()
    board = leaderboard(tmp_path / "subs", root / "bench.json", tmp_path / "board")
    assert "| self-reported; OOD data used; same-source tuning |" in (tmp_path / "board/leaderboard.md").read_text()
    assert board["tracks"]["noise"]["entries"][0]["same_source_tuning"]


def replace_member(src, dst, name, data):
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            b.writestr(info.filename, data if info.filename == name else a.read(info))


def bad_submissions(root, folder):
    good = root / "subs" / "entropy.zip"
    rebuild(good, folder / "forged.zip", edit=lambda d: d["sets"]["perlin_mixed"]["claims"].update(auroc=0.999))
    with zipfile.ZipFile(good) as z:
        state = dict(np.load(io.BytesIO(z.read("states/perlin_mixed.npz"))))
    inconsistent = io.BytesIO()  # per-image counts that do not add up to the pooled ones
    np.savez(inconsistent, **{**state, "image_counts": state["image_counts"] * 2})
    replace_member(good, folder / "inconsistent.zip", "states/perlin_mixed.npz", inconsistent.getvalue())
    state["hist"] = state["hist"] * 2  # counts that do not match the set's pixels (the per-image ones agree)
    state["image_counts"] = state["image_counts"] * 2
    tampered = io.BytesIO()
    np.savez(tampered, **state)
    replace_member(good, folder / "tampered.zip", "states/perlin_mixed.npz", tampered.getvalue())
    rebuild(good, folder / "wrong_hash.zip", edit=lambda d: d["sets"]["normal_mixed"].update(manifest_sha256="0" * 64))
    pickled = io.BytesIO()
    np.savez(pickled, **{**state, "hist": np.array([{"evil": 1}], dtype=object)})
    replace_member(good, folder / "pickle.zip", "states/perlin_mixed.npz", pickled.getvalue())
    rebuild(good, folder / "pickle_member.zip", extra={"states/extra.pkl": pickle.dumps({"a": 1})})
    rebuild(good, folder / "traversal.zip", extra={"../../evil.npz": b"x"})
    rebuild(good, folder / "bomb.zip", extra={"states/bomb.npz": b"\0" * (3 << 20)})
    words = "".join(np.random.default_rng(0).choice(list("abcdefghijklmnopqrstuvwxyz "), 1_500_000))
    rebuild(good, folder / "big_json.zip", edit=lambda d: d["method"].update(description=words))
    rebuild(good, folder / "html.zip", edit=lambda d: d["method"].update(name="<script>alert(1)</script>"))
    raw = zipfile.ZipFile(good).read("submission.json").decode().replace('"auroc": ', '"auroc": NaN, "x": ', 1)
    replace_member(good, folder / "nan.zip", "submission.json", raw.encode())
    long_number = '"x": ' + "1" * 5000 + ', "auroc": '  # (beyond Python's 4300 digits of an integer it converts)
    raw = zipfile.ZipFile(good).read("submission.json").decode().replace('"auroc": ', long_number, 1)
    replace_member(good, folder / "digits.zip", "submission.json", raw.encode())
    rebuild(good, folder / "tuning_string.zip", edit=lambda d: d["method"].update(params={"tuning": {"set": "sun"}}))
    rebuild(good, folder / "sources_dicts.zip", edit=lambda d: d["method"].update(
        params={"tuning": {"set": {"ood_sources": [{"a": 1}]}}}))
    for name, change in (("other_thresholds.zip", {"num_thresholds": np.array(401), "hist": np.zeros((2, 401), np.int64)}),
                         ("uint64.zip", {"hist": state["hist"].astype(np.uint64)}),
                         ("extra_array.zip", {"junk": np.zeros(10)})):
        changed = io.BytesIO()
        np.savez(changed, **{**state, **change})
        replace_member(good, folder / name, "states/perlin_mixed.npz", changed.getvalue())
    (folder / "not_a_zip.zip").write_bytes(b"PK nothing")
    (folder / "valid.zip").write_bytes(good.read_bytes())


EXPECTED_REASONS = {
    "forged.zip": "claimed auroc 0.999 but the counts give",
    "tampered.zip": "do not match the set's pixels",
    "inconsistent.zip": "the per-image counts sum to",
    "wrong_hash.zip": "another version of the set",
    "pickle.zip": "holds pickled objects",
    "pickle_member.zip": "unexpected members",
    "traversal.zip": "climbs out of the archive",
    "bomb.zip": "zip bomb",
    "big_json.zip": "more than the limit",
    "html.zip": "is not allowed",
    "nan.zip": "NaN, which is not a number",
    "not_a_zip.zip": "not a readable zip",
    "other_thresholds.zip": "the benchmark asks for 400",
    "uint64.zip": "counts must be int64",
    "extra_array.zip": "expected exactly",
    "digits.zip": "a number of more digits than any value it holds needs",
    "tuning_string.zip": "method.params.tuning.set must be an object",
    "sources_dicts.zip": "ood_sources must be a list of the tuning set's OOD source names",
}


def test_every_bad_submission_is_rejected_with_its_reason(world, tmp_path):
    root, _ = world
    folder = tmp_path / "incoming"
    folder.mkdir()
    bad_submissions(root, folder)
    limits = Limits(member_bytes=2 << 20, ratio=100)
    board = leaderboard(folder, root / "bench.json", tmp_path / "board", limits)
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    for name, expected in EXPECTED_REASONS.items():
        assert expected in reasons[name], (name, reasons[name])
    assert [e["file"] for e in board["tracks"]["noise"]["entries"]] == ["valid.zip"]  # the good one still ranks
    page = (tmp_path / "board/index.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def zip_of(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("name, reason", [
    ("states/../../evil.npz", "climbs out of the archive"),  # '..' anywhere, not only first
    ("states/./../evil.npz", "climbs out of the archive"),
    ("/etc/evil.npz", "absolute or non-POSIX"),
    ("C:/evil.npz", "absolute or non-POSIX"),
    ("states\\evil.npz", "absolute or non-POSIX"),
])
def test_member_names_that_leave_the_archive_are_refused(tmp_path, name, reason):
    from segood.leaderboard.safe import Rejected, read_submission_files

    with pytest.raises(Rejected, match=reason):
        read_submission_files(zip_of(tmp_path / "s.zip", {"submission.json": b"{}", name: b"x"}))


def test_size_and_count_limits_hold_at_their_bounds(tmp_path):
    """Each limit admits exactly its bound and refuses one more."""
    from segood.leaderboard.safe import Rejected, read_submission_files, strict_json

    files = {"a": b"x" * 10, "b": b"y" * 10, "c": b"z" * 5}
    sub = zip_of(tmp_path / "s.zip", files)
    assert read_submission_files(sub, Limits(members=3, member_bytes=10, total_bytes=25)) == files
    for limits, reason in ((Limits(members=2), "3 members, more than the limit 2"),
                           (Limits(member_bytes=9), "member 'a' would expand to 10 bytes"),
                           (Limits(total_bytes=24), "members expand beyond 24 bytes in all")):
        with pytest.raises(Rejected, match=reason):
            read_submission_files(sub, limits)
    assert strict_json(b"[1, 2]", Limits(json_bytes=6)) == [1, 2]
    with pytest.raises(Rejected, match="submission.json has 6 bytes, more than the limit 5"):
        strict_json(b"[1, 2]", Limits(json_bytes=5))

def test_validate_takes_zero_counts_and_names_of_80_characters_at_most():
    from segood.leaderboard.safe import Rejected
    from segood.leaderboard.submission import SCHEMA, validate

    def doc(name="m", **counts):
        claims = {"n_id": 0, "n_ood": 0, "n_ignored": 0, "auroc": None, "fpr95": 0.0, **counts}
        return {"schema": SCHEMA, "method": {"name": name},
                "sets": {"s": {"manifest_sha256": "0" * 64, "same_source_tuning": False, "claims": claims}}}

    validate(doc())  # an empty set: every count 0 (a set without ignored pixels has n_ignored 0)
    validate(doc("m" * 80))
    for bad, reason in ((doc("m" * 81), "is not allowed: 1-80"), (doc(n_ignored=-1), "claimed n_ignored -1"),
                        (doc(n_id=True), "claimed n_id True"), (doc(fpr95=1.5), r"claimed fpr95 1.5 .* in \[0, 1\]")):
        with pytest.raises(Rejected, match=reason):
            validate(bad)


def test_the_same_source_mark_follows_the_tuning_provenance_not_the_submitted_flag():
    from segood.leaderboard.board import _same_source

    official = {"ood_sources": ["perlin_noise"]}

    def doc(flag, sources):
        return {"method": {"params": {"tuning": {"set": {"ood_sources": sources}}}},
                "sets": {"s": {"same_source_tuning": flag}}}
    assert _same_source(doc(False, ["perlin_noise"]), "s", official)  # a flag turned off is overruled
    assert not _same_source(doc(True, ["coco"]), "s", official)  # tuned on another source: not same-source
    assert _same_source(doc(True, []), "s", {})  # a benchmark without recorded sources: the flag counts

def test_a_set_that_averages_per_image_is_ranked_by_its_per_image_means(tmp_path):
    """A set converted with a protocol that averages per image (StreetHazards' original) is scored on the board by
    its per-image means, as its own report heads it; a self-reported state must hold them, its images the frames'
    pixels, its per-image values what its counts allow."""
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    headline = "per-image mean, a test protocol"
    writer = SetWriter(tmp_path / "avg.h5", (32, 64), {"source": "test", "split": "val", "per_image_headline": headline})
    rng = np.random.default_rng(5)
    for k in range(4):  # OOD patches of four sizes: per-image means differ from the pooled values
        ood = np.zeros((32, 64), np.uint8)
        ood[4 : 8 + 5 * k, 8:40] = 1
        image = rng.integers(0, 128, (32, 64, 3), np.uint8)
        image[ood == 1] += rng.integers(0, 128, (int(ood.sum()), 3), np.uint8)
        writer.append(Sample(image, ood, np.zeros_like(ood), f"frame/{k}"))
    writer.commit()
    run = evaluate(tiny_network(), {"avg": tmp_path / "avg.h5"}, ["max_softmax", "entropy"], tmp_path / "run",
                   progress=False, figures=False)
    (tmp_path / "subs").mkdir()
    for method in ("max_softmax", "entropy"):
        submit(tmp_path / "run", tmp_path / "subs" / f"{method}.zip", method=method, name=method)
    make_benchmark({"t": {"sets": {"avg": tmp_path / "avg.h5"}, "rank_by": "auroc"}}, tmp_path / "bench.json")
    good = tmp_path / "subs" / "entropy.zip"
    with zipfile.ZipFile(good) as z:
        state = dict(np.load(io.BytesIO(z.read("states/avg.npz"))))
    forged = io.BytesIO()  # one image's AUROC beyond what its counts allow (there: 0.56 to 1)
    values = state["image_values"].copy()
    values[0, list(state["per_image_metrics"]).index("auroc")] = 0.0
    np.savez(forged, **{**state, "image_values": values})
    replace_member(good, tmp_path / "subs" / "forged.zip", "states/avg.npz", forged.getvalue())
    offsets, keys, counts = state["image_offsets"], state["image_keys"], state["image_counts"].copy()
    row = [{key: offsets[k] + j for j, key in enumerate(keys[offsets[k] : offsets[k + 1]].tolist())} for k in (0, 1)]
    shared = sorted(set(row[0]) & set(row[1]))
    for kind, source in ((1, 0), (0, 1)):  # an OOD pixel from image 0 to 1 and an ID pixel back, each within one
        key = next(key for key in shared if counts[row[source][key], kind])  # coarse bin: the pooled counts and
        counts[row[source][key], kind] -= 1  # each image's size unchanged, its (ID, OOD) pixels not its frame's
        counts[row[1 - source][key], kind] += 1
    moved = io.BytesIO()
    np.savez(moved, **{**state, "image_counts": counts})
    replace_member(good, tmp_path / "subs" / "moved.zip", "states/avg.npz", moved.getvalue())
    pooled_only = io.BytesIO()  # a state without per-image counts
    np.savez(pooled_only, **{k: v for k, v in state.items() if not k.startswith("image_")})
    replace_member(good, tmp_path / "subs" / "pooled_only.zip", "states/avg.npz", pooled_only.getvalue())

    board = leaderboard(tmp_path / "subs", tmp_path / "bench.json", tmp_path / "board")
    entries = board["tracks"]["t"]["entries"]
    means = {m: run["results"][m]["avg"]["per_image_mean"] for m in ("max_softmax", "entropy")}
    assert [e["name"] for e in entries] == sorted(means, key=lambda m: -means[m]["auroc"])
    for entry in entries:
        for metric in ("auroc", "auprc", "fpr95", "max_iou"):
            assert entry["sets"]["avg"][metric] == pytest.approx(means[entry["name"]][metric], abs=1e-12)
        assert entry["score"] == pytest.approx(means[entry["name"]]["auroc"], abs=1e-12)
        assert entry["interval"][0] <= entry["score"] <= entry["interval"][1]
    assert board["tracks"]["t"]["per_image"] == {"avg": headline}
    assert f"| avg ({headline}) |" in (tmp_path / "board" / "leaderboard.md").read_text()
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    assert "image 0's auroc is" in reasons["forged.zip"] and "which its counts do not allow" in reasons["forged.zip"]
    assert "must hold the per-image counts of every frame" in reasons["pooled_only.zip"]
    assert "other (ID, OOD) pixels than the set's frames" in reasons["moved.zip"]


def test_cli_round_trip(world, tmp_path, capsys):
    root, _ = world
    assert main(["submit", str(root / "run"), "--method", "entropy", "--method-name", "Entropy (cli)",
                 "--out", str(tmp_path / "subs" / "e.zip")]) == 0
    assert main(["benchmark", "--track", "noise", "--sets", str(root / "perlin_mixed.h5"), str(root / "normal_mixed.h5"),
                 "--num-thresholds", "400", "--out", str(tmp_path / "bench.json")]) == 0
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads((root / "bench.json").read_text())
    assert main(["leaderboard", str(tmp_path / "subs"), "--benchmark", str(tmp_path / "bench.json"), "--out",
                 str(tmp_path / "board")]) == 0
    assert "| 1 | Entropy \\(cli\\) |" in capsys.readouterr().out
    assert main(["submit", str(root / "run"), "--method", "entropy", "--method-name", "Declared", "--uses-ood-data",
                 "--out", str(tmp_path / "declared.zip")]) == 0  # (the declaration was dropped with a run)
    with zipfile.ZipFile(tmp_path / "declared.zip") as z:
        assert json.loads(z.read("submission.json"))["method"]["uses_ood_data"] is True


def perlin(doc):
    return doc["tracks"]["noise"]["sets"]["perlin_mixed"]


BROKEN_BENCHMARKS = {  # a hand-edited BENCH.json: (edit, what the board says of it)
    "tracks a number": (lambda d: d.update(tracks=5), "tracks must be a non-empty object {track name: track}"),
    "a blank track name": (lambda d: d["tracks"].update({" ": d["tracks"].pop("noise")}),
                           "the track name ' ' must be printable text, not blank"),
    "no tracks": (lambda d: d.update(tracks={}), "tracks must be a non-empty object {track name: track}"),
    "sets a number": (lambda d: d["tracks"]["noise"].update(sets=5),
                      "tracks.noise.sets must be a non-empty object {set name: the set's record}"),
    "sets a list": (lambda d: d["tracks"]["noise"].update(sets=[1, 2]),
                    "tracks.noise.sets must be a non-empty object {set name: the set's record}"),
    "frame ids a number": (lambda d: perlin(d).update(frame_ids=7),
                           "tracks.noise.sets.perlin_mixed.frame_ids must be a list of frame ids (strings)"),
    "grid a string": (lambda d: d.update(grid="x"), "grid must be the float-order or the linear grid as segood "
                                                    "benchmark writes it (got 'x')"),
    "mantissa bits a word": (lambda d: d.update(grid={"kind": "float", "mantissa_bits": "ten"}),
                             "(mantissa_bits must be an int, got 'ten')"),
    "grid with a key more": (lambda d: d["grid"].update(clip=True), "(its keys ['clip', 'kind', 'num_thresholds', "
                                                                    "'score_range'] are not ['kind', "
                                                                    "'num_thresholds', 'score_range'])"),
    "pixels null": (lambda d: perlin(d).update(pixels=None), "tracks.noise.sets.perlin_mixed.pixels must be an "
                                                             "object of non-negative integers {id, ood, ignore}"),
    "a frame size of one number": (lambda d: perlin(d).update(frame_sizes=[[1]]),
                                   "tracks.noise.sets.perlin_mixed.frame_sizes must be a list of 4 [height, width] "
                                   "pairs of positive integers, one a frame"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_BENCHMARKS))
def test_a_broken_benchmark_file_stops_the_board_naming_its_field(world, tmp_path, capsys, case):
    """The maintainer's own file, never blamed on the submitters: one line naming the field, exit 2, no board."""
    root, _ = world
    edit, reason = BROKEN_BENCHMARKS[case]
    bench = json.loads((root / "bench.json").read_text())
    edit(bench)
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert main(["leaderboard", str(root / "subs"), "--benchmark", str(tmp_path / "bench.json"), "--out",
                 str(tmp_path / "board")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"segood leaderboard: error: {tmp_path / 'bench.json'}: ") and err.count("\n") == 1
    assert f"{reason}; write it again with segood benchmark\n" in err
    assert not (tmp_path / "board" / "leaderboard.md").exists()


def test_a_combined_reports_method_is_submitted_with_its_own_runs_network(world, tmp_path):
    """Submitted from ``segood report --combine``, a method records the network of the run it came from (it
    recorded every combined run's)."""
    from segood.evaluation import combine_runs

    root, _ = world
    evaluate(tiny_network("dropout"), [root / "perlin_mixed.h5", root / "normal_mixed.h5"], ["entropy"],
             tmp_path / "other", progress=False, figures=False, num_thresholds=400)
    combined = combine_runs([root / "run", tmp_path / "other"], tmp_path / "both", figures=False, bootstrap=None)
    own = json.loads((root / "run" / "run.json").read_text())["model"]
    [method] = [m for m in combined["results"] if m.startswith("entropy") and "run" in m]
    document = submit(tmp_path / "both", tmp_path / "s.zip", method=method, name="Combined entropy")
    assert document["model"] == own and own != json.loads((tmp_path / "other" / "run.json").read_text())["model"]


def test_judge_checks_the_benchmark_it_is_given(world):
    """judge() (public) takes the file or its content, checked as the board checks it: a broken field is the
    maintainer's error, never a submission rejected as unreadable."""
    from segood.leaderboard import judge
    from segood.leaderboard.safe import MaintainerError

    root, _ = world
    bench = json.loads((root / "bench.json").read_text())
    entry = root / "subs" / "entropy.zip"
    for given in (root / "bench.json", str(root / "bench.json"), bench):
        rows, reason = judge(entry, given)
        assert reason is None and rows["noise"]["name"] == "PSPNet entropy" and rows["noise"]["score"] > 0.5
    bench["tracks"]["noise"]["sets"] = 5
    with pytest.raises(MaintainerError, match=r"^the benchmark given: tracks\.noise\.sets must be a non-empty object "):
        judge(entry, bench)
    with pytest.raises(ValueError, match="^the benchmark given is not a segood benchmark file"):
        judge(entry, {"tracks": {}})


def score_file(path, data, nan_in=None):
    """Score maps of the set ``data`` in segood's layout (float32, one pixel +inf), a NaN in frame ``nan_in``."""
    import h5py

    from segood.data.h5 import frame_ids, frame_sizes

    with h5py.File(path, "w") as f:
        for k, (frame_id, size) in enumerate(zip(frame_ids(data), frame_sizes(data))):
            scores = np.random.default_rng(k).random(size, dtype=np.float32)
            scores[0, 0] = np.inf if k != nan_in else np.nan
            f.create_dataset(frame_id, data=scores)
    return path


def test_submit_refuses_nan_scores_as_the_board_would(world, tmp_path, capsys):
    root, _ = world
    data = root / "perlin_mixed.h5"
    args = ["--data", f"perlin_mixed={data}", "--method-name", "M", "--out", str(tmp_path / "m.zip")]
    assert main(["submit", "--scores", f"perlin_mixed={score_file(tmp_path / 'ok.h5', data)}", *args]) == 0
    (tmp_path / "m.zip").unlink()
    bad = score_file(tmp_path / "nan.h5", data, nan_in=1)
    assert main(["submit", "--scores", f"perlin_mixed={bad}", *args]) == 2
    from segood.data.h5 import frame_ids

    assert capsys.readouterr().err == (f"segood submit: error: score maps {bad}: frame {frame_ids(data)[1]}: 1 NaN "
                                       "scores; every pixel needs a score (±inf are allowed); the leaderboard would "
                                       "refuse them\n")
    assert not (tmp_path / "m.zip").exists()


@pytest.mark.parametrize("option", ["--scores", "--data"])
def test_submit_refuses_a_set_named_twice(world, tmp_path, capsys, option):
    root, _ = world
    data = root / "perlin_mixed.h5"
    a, b = (score_file(tmp_path / f"{name}.h5", data) for name in "ab")
    given = {"--scores": [a, b], "--data": [data, data]}[option]
    args = [item for path in given for item in (option, f"perlin_mixed={path}")]
    args += ["--scores", f"perlin_mixed={a}"] if option == "--data" else []
    assert main(["submit", *args, "--method-name", "M", "--out", str(tmp_path / "m.zip")]) == 2
    assert capsys.readouterr().err == (f"segood submit: error: {option}: set 'perlin_mixed' is given twice "
                                       f"({given[0]} and {given[1]}); give each set once\n")
    assert not (tmp_path / "m.zip").exists()


def test_submissions_from_before_states_named_their_metrics_are_judged(world, tmp_path):
    root, _ = world
    good = root / "subs" / "entropy.zip"
    (tmp_path / "subs").mkdir()
    with zipfile.ZipFile(good) as z:
        for set_name in ("perlin_mixed", "normal_mixed"):
            state = dict(np.load(io.BytesIO(z.read(f"states/{set_name}.npz"))))
            state.pop("per_image_metrics")
            old = io.BytesIO()
            np.savez(old, **state)
            source = tmp_path / "subs" / "old.zip" if set_name == "normal_mixed" else good
            replace_member(source, tmp_path / "tmp.zip", f"states/{set_name}.npz", old.getvalue())
            (tmp_path / "tmp.zip").replace(tmp_path / "subs" / "old.zip")
    board = leaderboard(tmp_path / "subs", root / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and len(board["tracks"]["noise"]["entries"]) == 1


def test_hostile_strings_forged_flags_and_malformed_files(world, tmp_path):
    """Issue 18's forgeries: every one rejected with what is wrong, or shown harmlessly."""
    import subprocess
    import sys

    root, _ = world
    good = root / "subs" / "entropy.zip"
    subs = tmp_path / "subs"
    subs.mkdir()
    # control characters (ESC/OSC/BEL, bidi) in the file name and a Markdown link in the method's name
    rebuild(good, subs / "evil\x1b]0;owned\x07\u202e.zip", edit=lambda d: d["method"].update(name="Entropy (x)"))
    rebuild(good, subs / "linked.zip", edit=lambda d: d["method"].update(description="[click](http://x.y)"))
    rebuild(good, subs / "autolinked.zip", edit=lambda d: d["method"].update(name="www.evil-site.example/login"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa_backup.txt").write_text("secret")
    (subs / "escape").symlink_to(outside)  # a link out of the submissions' folder is not followed
    os.mkfifo(subs / "stall.zip")  # a pipe would block the board forever
    # the same-source flag flipped off although the tuning provenance names the test set's source
    def flip(d):
        d["method"]["params"]["tuning"] = {"set": {"ood_sources": ["perlin_noise"]}}
        for entry in d["sets"].values():
            entry["same_source_tuning"] = False
    rebuild(good, subs / "flipped.zip", edit=flip)
    raw = zipfile.ZipFile(good).read("submission.json").decode()
    replace_member(good, subs / "dupkeys.zip", "submission.json", raw.replace('{', '{"schema": "x", ', 1).encode())
    replace_member(good, subs / "deep.zip", "submission.json", ("[" * 40 + "]" * 40).encode())
    with zipfile.ZipFile(good) as a, zipfile.ZipFile(subs / "crc.zip", "w") as b:  # stored: bytes flipped below
        for info in a.infolist():
            b.writestr(info.filename, a.read(info))
    data = bytearray((subs / "crc.zip").read_bytes())
    at = data.find(b'"schema"')
    data[at + 2] ^= 1
    (subs / "crc.zip").write_bytes(bytes(data))
    with zipfile.ZipFile(good) as z:
        state = dict(np.load(io.BytesIO(z.read("states/perlin_mixed.npz"))))
    state["hist"] = np.full_like(state["hist"], 2**62)  # sums that wrap around int64
    wrapped = io.BytesIO()
    np.savez(wrapped, **state)
    replace_member(good, subs / "wrap.zip", "states/perlin_mixed.npz", wrapped.getvalue())
    board = leaderboard(subs, root / "bench.json", tmp_path / "board")
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    assert "repeats the keys ['schema']" in reasons["dupkeys.zip"]
    assert "nests deeper than" in reasons["deep.zip"]
    assert "is corrupt" in reasons["crc.zip"] and "CRC" in reasons["crc.zip"]
    assert "below 2^58" in reasons["wrap.zip"]
    assert "a symbolic link" in reasons["escape"] and "neither a zip file nor a folder" in reasons["stall.zip"]
    assert "id_rsa" not in json.dumps(board)
    entries = {e["file"]: e for e in board["tracks"]["noise"]["entries"]}
    assert entries["flipped.zip"]["same_source_tuning"]
    evil = next(name for name in entries if name.startswith("evil"))
    assert "\x1b" not in evil and "\u202e" not in evil and "\x07" not in evil
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "\x1b" not in markdown
    assert "[click](http" not in markdown and "http://" not in markdown and "www.evil" not in markdown
    assert "www\\.evil-site\\.example/login" in markdown  # CommonMark shows the name as it is
    assert len({e["sha256"] for e in entries.values()}) == len(entries)  # entries told apart by content hash
    assert entries["linked.zip"]["sha256"] in markdown
    run = subprocess.run([sys.executable, "-c", "import sys, segood.leaderboard; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"  # judging never imports torch


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Tables(html.parser.HTMLParser):
    """The cells of each row of the page's sortable tables, as a browser rendered them."""

    def __init__(self):
        super().__init__()
        self.rows, self.inside, self.cell = [], False, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.inside = ("class", "sortable") in attrs
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None
        elif tag == "table":
            self.inside = False


def rendered(page):
    """The page's sortable table after Chromium loaded it and ran its scripts (--dump-dom)."""
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    tables = _Tables()
    tables.feed(done.stdout)
    return tables.rows


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (Debian: apt-get install chromium)")
def test_the_board_page_renders_and_sorts_in_a_browser(world, tmp_path):
    root, _ = world
    board = leaderboard(root / "subs", root / "bench.json", tmp_path)
    track = board["tracks"]["noise"]
    header, *rows = rendered(tmp_path / "index.html")
    assert header == ["rank", "method", "score", *track["sets"], "notes", "file (sha256)", "curves"]
    assert [row[1] for row in rows] == [entry["name"] for entry in track["entries"]]  # in rank order
    for row, entry in zip(rows, track["entries"]):
        assert row[2].startswith(f"{entry['score']:.4f} [")  # the score with its bootstrap interval
        assert row[-3].split("; ")[0] == ("verified" if entry.get("verified") else "self-reported")  # marked either way
        assert row[-1] == "ROC" and (tmp_path / entry["figure"]).stat().st_size > 5000  # its figure, linked
    assert f"<a href='{track['entries'][0]['figure']}'>ROC</a>" in (tmp_path / "index.html").read_text()
    page = (tmp_path / "index.html").read_text()
    names = sorted(entry["name"] for entry in track["entries"])
    for clicks, want in ((1, names), (2, names[::-1])):  # clicks on the "method" header, as a reader makes them
        clicked = tmp_path / f"clicked{clicks}.html"
        clicked.write_text(page.replace("</body>", "<script>" + "document.querySelectorAll('table.sortable th')[1]"
                                        ".click();" * clicks + "</script></body>"))
        _, *by_name = rendered(clicked)
        assert [row[1] for row in by_name] == want
