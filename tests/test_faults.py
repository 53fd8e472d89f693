"""Unlucky and hostile input to the commands around the board: sets sharing a name, a full disk, two writers
at once, a tuning set that cannot rank, self-reported states whose counts do not add up."""

import numpy as np
import pytest

from segood.cli import main
from segood.labels import OOD


@pytest.mark.parametrize("command", [
    ["benchmark", "--track", "t", "--sets", "{a}", "{b}", "--out", "{out}/bench.json"],
    ["protocol", "--tune-sets", "{a}", "{b}", "--test-sets", "{c}", "--methods", "entropy", "--out", "{out}"],
    ["protocol", "--tune-sets", "{c}", "--test-sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
    ["export", "--sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
], ids=["benchmark", "protocol tune", "protocol test", "export"])
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
    return [r["reason"] for r in leaderboard(tmp_path / "subs", tmp_path / "bench.json", tmp_path / "board")["rejected"]]


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
