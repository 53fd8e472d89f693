"""The generated raw trees: deterministic, in the published layouts, through the real converters."""

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from segood.data import IDD, Cityscapes, Sun, convert
from segood.data.synthetic import tree_sha256, write_cityscapes_tree, write_idd_tree, write_sun_tree
from segood.labels import NUM_CLASSES
from segood.models import load_model

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
TREE_SHA256 = {  # fixed seed -> fixed bytes on every machine
    "cityscapes": "d89996a0f6c2e07c5ad9f3398a7cedbb812023ca4cff44761a5a256bc507dd15",
    "idd": "6fc7baf831e1c826ca0f3829bf1b8d2304cb5da481bfebb3be6ab6414a978d40",
    "sun": "a6a2bf512f75b6a076204b53b7255278da5fcecf2b58b7abfa1adeb3d7307a59",
}


def small_trees(root):
    write_cityscapes_tree(root / "cs", 0, (("train", 3), ("val", 2)), (64, 128))
    truth = write_idd_tree(root / "idd", 1, 3, (64, 128))
    write_sun_tree(root / "sun", 2, 3, size=(700, 700), small=1)
    return truth


def test_generated_trees_are_deterministic(tmp_path):
    small_trees(tmp_path / "a")
    small_trees(tmp_path / "b")
    for name, folder in (("cityscapes", "cs"), ("idd", "idd"), ("sun", "sun")):
        digest = tree_sha256(tmp_path / "a" / folder)
        assert digest == tree_sha256(tmp_path / "b" / folder)
        assert digest == TREE_SHA256[name]


def test_generated_trees_through_the_real_converters(tmp_path):
    truth = small_trees(tmp_path)
    cs = convert(Cityscapes(tmp_path / "cs", "train"), tmp_path / "cs.h5", size=(64, 128), progress=False)
    assert cs["frames"] == 3 and cs["pixels"]["id"] + cs["pixels"]["ignore"] == 3 * 64 * 128
    with h5py.File(tmp_path / "cs.h5") as f:
        classes = set(np.unique([f["semantic"][str(k)][()] for k in range(3)]).tolist())
    assert {0, 1, 2, 8, 10, 13} <= classes  # road, sidewalk, building, vegetation, sky, car at least

    idd = convert(IDD(tmp_path / "idd", "val"), tmp_path / "idd.h5", size=(64, 128), progress=False)
    with h5py.File(tmp_path / "idd.h5") as f:
        for k, frame_id in enumerate(s.decode() for s in f["frame_id"]):
            semantic, ood_mask = truth[frame_id]
            ood = f["ood_mask"][str(k)][()]
            # polygons traced from the raster truth rasterise back to within a pixel per object
            assert abs(int((ood == 1).sum()) - int((ood_mask == 1).sum())) <= 0.02 * (ood_mask == 1).sum() + 4
            assert abs(int((ood == 0).sum()) - int((semantic == 13).sum())) <= 0.02 * (semantic == 13).sum() + 4
    assert idd["pixels"]["ood"] > 0

    sun = convert(Sun(tmp_path / "sun", "all"), tmp_path / "sun.h5", size=(64, 128), progress=False)
    assert sun["frames"] == 3 and any("640x640" in u["reason"] for u in sun["unused_files"])
    rules = {row["name"]: row["rule"] for row in sun["coverage"]}
    assert rules.get("wall", "ambiguous") == "ambiguous" and "default" in rules.values() and "class" in rules.values()


@pytest.mark.parametrize("head", ["plain", "dimreduce", "dropout", "confidence", "plain_oe"])
def test_shipped_checkpoints_reproduce_their_frozen_output(head):
    frozen = json.loads((CHECKPOINTS / "frozen.json").read_text())[head]
    path = CHECKPOINTS / f"demo_{head}.pt"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == frozen["sha256"]
    model, state = load_model(path)
    model = model.float()
    assert state["config"]["head"] == head.removesuffix("_oe") and state["config"]["num_classes"] == NUM_CLASSES
    if head == "plain_oe":  # fine-tuned from the shipped plain network on SUN objects, never the test sets' own
        record = state["outlier_exposure"]
        assert record["parent"]["sha256"] == hashlib.sha256((CHECKPOINTS / "demo_plain.pt").read_bytes()).hexdigest()
        assert record["object_sources"] == ["sun2012"] and record["loss"] == "entropy" and record["weight"] == 0.9
    torch.manual_seed(0)
    x = torch.rand(1, 3, 64, 128) * 2 - 1
    with torch.no_grad():
        out = model(x)
    np.testing.assert_allclose(out.logits[0, :, 31, 63].numpy(), frozen["logits_at_31_63"], rtol=1e-4, atol=1e-4)
    assert float(out.logits.mean()) == pytest.approx(frozen["logits_mean"], rel=1e-4, abs=1e-5)
