"""Outlier exposure: each loss against a literal computation on tiny tensors, the object sources of converted sets,
fine-tuning (resumable to the same weights, the OE record in the checkpoint), the same-source flag of an
evaluation, and the command line's checks."""

import json
import math
import warnings

import pytest
import torch

from segood.cli import main
from segood.data import Noise, Sun, convert, mix
from segood.data.h5 import object_sources, read_manifest
from segood.data.paste import Paste
from segood.data.synthetic import write_cityscapes_tree, write_sun_tree
from segood.evaluation import evaluate
from segood.models import build_model, load_model, save_checkpoint
from segood.models.checkpoint import read_checkpoint
from segood.models.losses import energy_oe_loss, entropy_oe_loss, rba_oe_loss
from segood.models.train import TrainConfig, finetune_config, train

from networks import tiny_network

SIZE = (64, 128)

# one image, K = 3 classes, 2 x 2 pixels: (0, 0) ID class 0, (0, 1) ID class 2, (1, 0) OOD, (1, 1) void
LOGITS = torch.tensor([[[[2.0, -1.0], [0.5, 0.0]],
                        [[0.0, 1.0], [0.5, 3.0]],
                        [[1.0, 2.0], [-0.5, 1.0]]]])
TARGET = torch.tensor([[[0, 2], [255, 255]]])
OOD_MASK = torch.tensor([[[0, 0], [1, 255]]])


def log_softmax_at(y, x):
    """log p_k at pixel (y, x), one class at a time."""
    column = [float(LOGITS[0, k, y, x]) for k in range(3)]
    total = math.log(sum(math.exp(v) for v in column))
    return [v - total for v in column]


@pytest.mark.parametrize("reduction", ["sets", "pixels"])
def test_entropy_oe_loss_by_hand(reduction):
    nll_00 = -log_softmax_at(0, 0)[0]
    nll_01 = -log_softmax_at(0, 1)[2]
    uniform_10 = -sum(log_softmax_at(1, 0)) / 3
    lam = 0.9
    if reduction == "sets":  # the paper: each expectation over its own pixels
        expected = (1 - lam) * (nll_00 + nll_01) / 2 + lam * uniform_10 / 1
    else:  # the authors' code: one mean over the ID and OOD pixels
        expected = ((1 - lam) * (nll_00 + nll_01) + lam * uniform_10) / 3
    found = entropy_oe_loss(LOGITS, TARGET, OOD_MASK, lam=lam, reduction=reduction)
    assert found.item() == pytest.approx(expected, rel=1e-6)


def test_entropy_oe_loss_is_least_where_the_softmax_is_uniform():
    target, ood = torch.full((1, 2, 2), 255), torch.ones(1, 2, 2, dtype=torch.long)
    flat = entropy_oe_loss(torch.zeros(1, 3, 2, 2), target, ood)
    assert flat.item() == pytest.approx(0.9 * math.log(3), rel=1e-6)  # λ · log K, its minimum
    assert entropy_oe_loss(LOGITS, target, ood).item() > flat.item()


def test_entropy_oe_loss_without_ood_pixels_is_the_weighted_cross_entropy():
    ood = torch.where(OOD_MASK == 1, 0, OOD_MASK)
    expected = 0.1 * (-log_softmax_at(0, 0)[0] - log_softmax_at(0, 1)[2]) / 2
    assert entropy_oe_loss(LOGITS, TARGET, ood).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="reduction"):
        entropy_oe_loss(LOGITS, TARGET, ood, reduction="mean")


def test_energy_oe_loss_by_hand():
    def energy_at(y, x):
        return -math.log(sum(math.exp(float(LOGITS[0, k, y, x])) for k in range(3)))

    # energies: ID -2.41 and -2.35, OOD -1.36; m_in between the ID ones: one ID hinge acts, the other not
    m_in, m_out, weight = -2.38, -1.0, 0.1
    ce = (-log_softmax_at(0, 0)[0] - log_softmax_at(0, 1)[2]) / 2
    hinge_in = (max(0.0, energy_at(0, 0) - m_in) ** 2 + max(0.0, energy_at(0, 1) - m_in) ** 2) / 2
    hinge_out = max(0.0, m_out - energy_at(1, 0)) ** 2
    assert energy_at(0, 0) < m_in < energy_at(0, 1) and hinge_out > 0
    expected = ce + weight * (hinge_in + hinge_out)
    found = energy_oe_loss(LOGITS, TARGET, OOD_MASK, weight=weight, m_in=m_in, m_out=m_out)
    assert found.item() == pytest.approx(expected, rel=1e-6)


def rba_reference(scores, ood_mask, m_in, m_out):
    """The authors' squared hinges on R = -Σ tanh(s_k), one pixel at a time."""
    inliers, outliers = [], []
    n, k, h, w = scores.shape
    for i in range(n):
        for y in range(h):
            for x in range(w):
                r = -sum(math.tanh(float(scores[i, c, y, x])) for c in range(k))
                if ood_mask[i, y, x] == 0:
                    inliers.append(max(0.0, r - m_in) ** 2)
                elif ood_mask[i, y, x] == 1:
                    outliers.append(max(0.0, m_out - r) ** 2)
    loss = sum(inliers) / len(inliers)
    return 0.5 * (loss + sum(outliers) / len(outliers)) if outliers else loss


def test_rba_oe_loss_by_hand_on_mask_aggregated_scores():
    # a mask model's per-class scores s_k = Σ_q softmax(class_q)[k] σ(mask_q), over Q = 2 queries, K = 3 + no-object
    class_logits = torch.tensor([[[2.0, 0.0, -1.0, 0.5], [-1.0, 1.0, 0.0, 0.0]]])
    mask_logits = torch.tensor([[[[3.0, -2.0], [0.0, -4.0]], [[-1.0, 2.0], [1.0, 0.5]]]])
    probs = class_logits.softmax(dim=-1)
    scores = torch.zeros(1, 3, 2, 2)
    for q in range(2):
        for c in range(3):
            for y in range(2):
                for x in range(2):
                    scores[0, c, y, x] += probs[0, q, c] * (1 / (1 + math.exp(-float(mask_logits[0, q, y, x]))))
    # scores lie in [0, 1]: R in [-3, 0]; margins chosen so that both hinges act
    m_in, m_out = -1.0, -0.2
    expected = rba_reference(scores, OOD_MASK, m_in, m_out)
    assert rba_oe_loss(scores, OOD_MASK, m_in=m_in, m_out=m_out).item() == pytest.approx(expected, rel=1e-6)
    no_ood = torch.where(OOD_MASK == 1, 0, OOD_MASK)  # no OOD pixel: the inlier term alone, not halved
    assert rba_oe_loss(scores, no_ood, m_in=m_in, m_out=m_out).item() == pytest.approx(
        rba_reference(scores, no_ood, m_in, m_out), rel=1e-6)


def test_rba_oe_loss_with_the_authors_margins_by_hand():
    expected = rba_reference(LOGITS, OOD_MASK, 0.0, 5.0)
    assert rba_oe_loss(LOGITS, OOD_MASK).item() == pytest.approx(expected, rel=1e-6)


def test_training_takes_each_loss_with_the_weight_margins_and_reduction_given():
    from segood.models.train import oe_loss

    def settings(loss, **kw):
        return TrainConfig(train_set="t.h5", out_dir="out", init="parent.pt", outlier_exposure="oe.h5", oe_loss=loss,
                           **kw)

    ce = (-log_softmax_at(0, 0)[0] - log_softmax_at(0, 1)[2]) / 2  # the ID pixels' cross-entropy
    cases = {  # the losses themselves are checked by hand above
        "entropy": (settings("entropy", oe_weight=0.3, oe_reduction="pixels"),
                    entropy_oe_loss(LOGITS, TARGET, OOD_MASK, lam=0.3, reduction="pixels")),
        "energy": (settings("energy", oe_weight=0.2, oe_margins=[-2.38, -1.0]),
                   energy_oe_loss(LOGITS, TARGET, OOD_MASK, weight=0.2, m_in=-2.38, m_out=-1.0)),
        "rba": (settings("rba", oe_weight=0.5, oe_margins=[-1.0, 2.0]),
                ce + 0.5 * rba_oe_loss(LOGITS, OOD_MASK, m_in=-1.0, m_out=2.0)),
    }
    for name, (config, expected) in cases.items():
        assert oe_loss(config, LOGITS, TARGET, OOD_MASK).item() == pytest.approx(float(expected), rel=1e-6), name
    # the defaults differ from those settings, so each setting counted
    assert entropy_oe_loss(LOGITS, TARGET, OOD_MASK).item() != pytest.approx(float(cases["entropy"][1]))
    assert energy_oe_loss(LOGITS, TARGET, OOD_MASK, m_in=-1.0, m_out=-2.38, weight=0.2).item() != pytest.approx(
        float(cases["energy"][1]))


# ---------------------------------------------------------------------------------------------- sets and training


@pytest.fixture(scope="module")
def oe_sets(tmp_path_factory):
    """A training set, pasted-object sets of SUN objects (train frames) and of generated objects (val frames), and
    noise and SUN-image test sets mixed with val frames."""
    root = tmp_path_factory.mktemp("oe")
    write_cityscapes_tree(root / "cs", 0, (("train", 8), ("val", 4)), SIZE)
    write_sun_tree(root / "sun", 2, count=6, small=0)
    from segood.data import Cityscapes

    sets = {"train": convert(Cityscapes(root / "cs", "train"), root / "train.h5", size=SIZE, progress=False),
            "oe_sun": convert(Paste(root / "cs", "train", root / "sun", per_frame=2), root / "oe_sun.h5", size=SIZE,
                              progress=False),
            "paste_demo": convert(Paste(root / "cs", "val", "demo"), root / "paste_demo.h5", size=SIZE,
                                  progress=False),
            "val": convert(Cityscapes(root / "cs", "val"), root / "val.h5", size=SIZE, progress=False),
            "perlin": convert(Noise("perlin", 2, size=SIZE), root / "perlin.h5", progress=False),
            "sun_images": convert(Sun(root / "sun", "all"), root / "sun_images.h5", size=SIZE, progress=False)}
    mix(root / "oe_sun.h5", root / "val.h5", root / "mixed_sun_objects.h5", progress=False)
    mix(root / "perlin.h5", root / "val.h5", root / "mixed_perlin.h5", progress=False)
    mix(root / "sun_images.h5", root / "val.h5", root / "mixed_sun_images.h5", progress=False)
    paths = {name: root / f"{name}.h5" for name in (*sets, "mixed_sun_objects", "mixed_perlin", "mixed_sun_images")}
    parent = tiny_network()
    save_checkpoint(root / "parent.pt", parent)
    paths["parent"] = root / "parent.pt"
    return paths


def test_object_sources_name_where_the_ood_pixels_come_from(oe_sets):
    assert object_sources(read_manifest(oe_sets["oe_sun"])) == ["sun2012"]
    assert object_sources(read_manifest(oe_sets["paste_demo"])) == ["generated objects"]
    assert object_sources(read_manifest(oe_sets["mixed_sun_objects"])) == ["sun2012"]  # through the mix
    assert object_sources(read_manifest(oe_sets["mixed_perlin"])) == ["perlin_noise"]
    assert object_sources(read_manifest(oe_sets["mixed_sun_images"])) == ["sun2012"]  # SUN objects, SUN images
    assert object_sources(read_manifest(oe_sets["train"])) == []


def oe_config(oe_sets, out, **kw):
    return finetune_config(oe_sets["parent"], train_set=str(oe_sets["train"]), out_dir=str(out),
                           outlier_exposure=str(oe_sets["oe_sun"]), batch_size=4, lr=0.01, crop=list(SIZE),
                           scale=[0.75, 1.25], **kw)


@pytest.mark.parametrize("loss", ["entropy", "energy", "rba"])
def test_fine_tuning_resumes_to_the_same_weights_and_records_its_source(oe_sets, tmp_path, loss):
    options = {"epochs": 2, "oe_loss": loss, **({"oe_margins": [-8.0, -2.0]} if loss == "energy" else {})}
    train(oe_config(oe_sets, tmp_path / "straight", **options), progress=False)
    train(oe_config(oe_sets, tmp_path / "resumed", **options), progress=False, stop_after=1)
    train(oe_config(oe_sets, tmp_path / "resumed", **options), progress=False, resume=True)
    a, b = read_checkpoint(tmp_path / "straight/final.pt"), read_checkpoint(tmp_path / "resumed/final.pt")
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0)
    assert all(math.isfinite(row["loss"]) for row in a["log"])
    assert a["iteration"] == 2 * ((8 + 8) // 4)  # the train frames and the pasted frames, every epoch
    record = a["outlier_exposure"]
    assert record["loss"] == loss and record["object_sources"] == ["sun2012"]
    assert record["set"]["manifest_sha256"] and record["parent"]["checkpoint"] == "parent.pt"
    parent = read_checkpoint(oe_sets["parent"])["model"]
    assert any(not torch.equal(parent[k], v) for k, v in a["model"].items())  # it did fine-tune the parent
    if loss == "entropy":  # the OE loss is what it minimised: the OOD pixels' softmax moved towards uniform
        before, after = (uniform_excess(load_model(path)[0], oe_sets["oe_sun"])
                         for path in (oe_sets["parent"], tmp_path / "straight/final.pt"))
        assert after < 0.5 * before


def uniform_excess(model, path):
    """Mean over the OOD pixels of the set at ``path`` of the cross-entropy to the uniform distribution,
    -(1/K) Σ_k log p_k, less its least value log K (reached where the softmax is uniform)."""
    from segood.data.h5 import H5SegmentationDataset
    from segood.models.network import preprocess

    values = []
    for item in H5SegmentationDataset(path):
        with torch.no_grad():
            log_p = model(preprocess(item["image"][None])).logits.double().log_softmax(dim=1)
        values.append(-log_p.mean(dim=1)[item["ood_mask"][None] == 1])
    return float(torch.cat(values).mean()) - math.log(log_p.shape[1])


def test_evaluation_flags_test_sets_of_the_oe_source(oe_sets, tmp_path):
    train(oe_config(oe_sets, tmp_path / "oe", epochs=1), progress=False)
    model, _ = load_model(tmp_path / "oe/final.pt")
    sets = {"sun_objects": oe_sets["mixed_sun_objects"], "generated": oe_sets["paste_demo"],
            "perlin": oe_sets["mixed_perlin"], "sun_images": oe_sets["mixed_sun_images"]}
    with pytest.warns(UserWarning, match="same source as the OOD objects of test set.*sun_objects, sun_images"):
        results = evaluate(model, sets, ["entropy"], tmp_path / "run", batch_size=4, progress=False, figures=False,
                           checkpoint=tmp_path / "oe/final.pt")
    flags = {s: r["same_source_oe"] for s, r in results["results"]["entropy"].items()}
    assert flags == {"sun_objects": True, "generated": False, "perlin": False, "sun_images": True}
    assert results["methods"]["entropy"]["uses_ood_data"]  # the network has seen OOD data, whatever the method
    report = (tmp_path / "run/results.md").read_text()
    assert "‡ the network was fine-tuned with outlier exposure" in report and " ‡" in report.split("## ")[1]
    # the parent, never exposed, flags nothing and warns about nothing (but the tiny sets' coarse bins)
    parent, _ = load_model(oe_sets["parent"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="the float-order grid at 10 mantissa bits cannot pin")
        results = evaluate(parent, sets, ["entropy"], None, batch_size=4, progress=False, figures=False)
    assert not any(r["same_source_oe"] for r in results["results"]["entropy"].values())
    assert not results["methods"]["entropy"]["uses_ood_data"]


def test_command_line_fine_tunes_and_checks_its_options(oe_sets, tmp_path, capsys):
    base = ["train", "--train", str(oe_sets["train"]), "--out", str(tmp_path / "cli"), "--epochs", "1",
            "--batch-size", "4", "--crop", "64", "128"]
    oe = ["--init", str(oe_sets["parent"]), "--outlier-exposure", str(oe_sets["oe_sun"])]
    assert main(base + oe + ["--oe-loss", "energy", "--oe-margins", "-8", "-2"]) == 0
    assert "with outlier exposure (energy)" in capsys.readouterr().out
    assert read_checkpoint(tmp_path / "cli/final.pt")["outlier_exposure"]["margins"] == [-8.0, -2.0]
    refused = {
        "set up outlier exposure": base + ["--oe-loss", "energy"],
        "--init-type set up outlier exposure": base + ["--init", str(oe_sets["parent"]), "--init-type", "hf"],
        "pass --init CHECKPOINT": base + ["--outlier-exposure", str(oe_sets["oe_sun"])],
        "has no margins": base + oe + ["--oe-margins", "0", "5"],
        "m_in < m_out": base + oe + ["--oe-loss", "rba", "--oe-margins", "5", "0"],
        r"λ.*\[0, 1\]": base + oe + ["--oe-weight", "1.5"],
        "another network than the options say": base + oe + ["--encoder", "resnet50"],
        "applies to --oe-loss entropy only": base + oe + ["--oe-loss", "energy", "--oe-reduction", "pixels"],
        "--init-type hf trains the network of the folder --init names: drop --arch": base + [
            "--init", str(oe_sets["parent"]), "--init-type", "hf", "--outlier-exposure", str(oe_sets["oe_sun"]),
            "--oe-loss", "rba", "--arch", "deeplabv3plus"],
        "predicts 5 classes; segood train trains on the 19 Cityscapes trainIds": base + [
            "--init", str(tmp_path / "five.pt"), "--outlier-exposure", str(oe_sets["oe_sun"])],
    }
    save_checkpoint(tmp_path / "five.pt", build_model("pspnet", "resnet18", num_classes=5))
    for message, argv in refused.items():
        assert main(argv) == 2, message
        assert __import__("re").search(message, capsys.readouterr().err), message


def test_outlier_exposure_needs_ood_pixels(oe_sets, tmp_path):
    config = finetune_config(oe_sets["parent"], train_set=str(oe_sets["train"]), out_dir=str(tmp_path),
                             outlier_exposure=str(oe_sets["train"]), batch_size=4, crop=list(SIZE), epochs=1)
    with pytest.raises(ValueError, match="has no OOD pixels"):
        train(config, progress=False)
    with pytest.raises(ValueError, match="confidence head"):
        TrainConfig(train_set="t.h5", out_dir=str(tmp_path), head="confidence", init="x.pt",
                    outlier_exposure="oe.h5")


@pytest.fixture(scope="module")
def mask_parent(tmp_path_factory):
    """A tiny Mask2Former of the 19 Cityscapes classes, saved as a transformers folder."""
    pytest.importorskip("transformers")
    from segood.labels import CLASS_NAMES

    from networks import tiny_mask2former

    folder = tmp_path_factory.mktemp("mask") / "parent"
    tiny_mask2former(list(CLASS_NAMES), train_num_points=256).save_pretrained(folder)  # (its loss: 256 points a mask)
    return folder


def mask_config(oe_sets, parent, out, **kw):
    return TrainConfig(**{"train_set": str(oe_sets["train"]), "out_dir": str(out), "init": str(parent),
                          "init_type": "hf", "outlier_exposure": str(oe_sets["oe_sun"]), "oe_loss": "rba",
                          "batch_size": 4, "lr": 0.01, "crop": list(SIZE), "scale": [0.75, 1.25], **kw})


def test_a_mask_classification_network_fine_tunes_with_rba_resumably(oe_sets, mask_parent, tmp_path):
    """RbA's outlier supervision plus the network's own loss: resumed to the same weights, written as a transformers
    folder that segood evaluate loads, with the OE record that flags test sets of the same source."""
    from safetensors.torch import load_file

    from segood.models import load_library_model

    train(mask_config(oe_sets, mask_parent, tmp_path / "straight", epochs=2), progress=False)
    train(mask_config(oe_sets, mask_parent, tmp_path / "resumed", epochs=2), progress=False, stop_after=1)
    log = train(mask_config(oe_sets, mask_parent, tmp_path / "resumed", epochs=2), progress=False, resume=True)
    a, b = (load_file(tmp_path / run / "final/model.safetensors") for run in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    parent = load_file(mask_parent / "model.safetensors")
    assert any(not torch.equal(parent[k], v) for k, v in a.items())  # it did fine-tune the parent
    assert len(log) == 2 and all(math.isfinite(row["loss"]) for row in log)
    model = load_library_model("hf", tmp_path / "straight/final")
    assert model.outlier_exposure["loss"] == "rba" and model.outlier_exposure["object_sources"] == ["sun2012"]
    sets = {"sun_objects": oe_sets["mixed_sun_objects"], "generated": oe_sets["paste_demo"]}
    with pytest.warns(UserWarning, match="same source as the OOD objects of test set.*sun_objects"):
        results = evaluate(model, sets, ["rba", "max_softmax"], None, batch_size=4, progress=False, figures=False)
    assert {s: r["same_source_oe"] for s, r in results["results"]["rba"].items()} == {"sun_objects": True,
                                                                                     "generated": False}
    record = tmp_path / "straight/final/segood.json"
    record.write_text(json.dumps({"outlier_exposure": {"object_sources": 5}}))  # checked as a checkpoint's is
    with pytest.raises(ValueError, match=r"segood.json: the checkpoint's outlier_exposure\['object_sources'\] is 5"):
        load_library_model("hf", tmp_path / "straight/final")


def test_a_mask_network_takes_the_rba_loss_and_a_crop_it_can_see(oe_sets, mask_parent, tmp_path):
    with pytest.raises(ValueError, match="pass --oe-loss rba"):
        mask_config(oe_sets, mask_parent, tmp_path, oe_loss="entropy")
    with pytest.raises(ValueError, match="multiples of 32"):
        train(mask_config(oe_sets, mask_parent, tmp_path, epochs=1, crop=[48, 128]), progress=False)
    base = ["train", "--train", str(oe_sets["train"]), "--out", str(tmp_path / "cli"), "--epochs", "1",
            "--batch-size", "4", "--crop", "64", "128", "--quiet", "--init", str(mask_parent), "--init-type", "hf",
            "--outlier-exposure", str(oe_sets["oe_sun"])]
    assert main(base + ["--oe-loss", "rba"]) == 0
    assert (tmp_path / "cli/final/segood.json").is_file() and (tmp_path / "cli/last.pt").is_file()


def test_a_mask_network_of_other_classes_is_refused_in_the_words_of_segood_train():
    """Its class names are named, and no Python option (classes=...) that segood train does not have."""
    from types import SimpleNamespace

    from segood.models.hf_train import trainid_classes

    with pytest.raises(ValueError, match=r"it has 3 classes \(road, sky, cow\) and no class named 'sidewalk', "
                                         "'building'") as refused:
        trainid_classes(SimpleNamespace(class_names=["road", "sky", "cow"], num_network_classes=lambda: 3))
    assert "classes=" not in str(refused.value) and "segood train --init-type hf" in str(refused.value)
    with pytest.raises(ValueError, match="or as 19 classes in trainId order; it has 7 classes$"):
        trainid_classes(SimpleNamespace(class_names=None, num_network_classes=lambda: 7))
    assert trainid_classes(SimpleNamespace(class_names=None, num_network_classes=lambda: 19)) == tuple(range(19))


def mask_batch():
    """Two 64 x 64 frames: frame 0 road on the left, car on the right, an OOD square and a void strip; frame 1
    building with an OOD square over it. Their ID classes' masks by hand (trainIds, in sorted order)."""
    torch.manual_seed(1)
    image = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    semantic = torch.zeros(2, 64, 64, dtype=torch.long)
    semantic[0, :, 32:] = 13
    semantic[0, 60:] = 255
    semantic[1] = 2
    ood_mask = torch.zeros(2, 64, 64, dtype=torch.long)
    ood_mask[0, 20:36, 24:40] = 1
    ood_mask[0, 60:] = 255
    ood_mask[1, 8:24, 8:24] = 1
    semantic[ood_mask == 1] = 255
    road, car, building = ((semantic[i] == t).float() for i, t in ((0, 0), (0, 13), (1, 2)))
    masks = [torch.stack([road, car]), building[None]]
    labels = [torch.tensor([0, 13]), torch.tensor([2])]
    return {"image": image, "semantic": semantic, "ood_mask": ood_mask}, masks, labels


@pytest.mark.parametrize("network", ["mask2former", "eomt"])
@pytest.mark.parametrize("weight", [0.0, 2.5])
def test_a_mask_network_step_takes_its_own_loss_plus_the_weighted_rba_loss(tmp_path, network, weight):
    """One step's loss is the network's own (Hungarian-matched) loss plus the weight times RbA's outlier
    supervision on its semantic scores, the weight counted once: at weights other than 1 a term taken twice or
    left unweighted shows."""
    pytest.importorskip("transformers")
    from segood.labels import CLASS_NAMES
    from segood.models.hf import mask_semantic_scores
    from segood.models.hf_train import MaskLearner
    from segood.models.network import preprocess

    from networks import tiny_eomt, tiny_mask2former

    parent = tmp_path / "parent"
    module = tiny_mask2former(list(CLASS_NAMES), train_num_points=256) if network == "mask2former" else tiny_eomt(19)
    module.save_pretrained(parent)
    m_in, m_out = -1.0, 0.5  # the RbA score of these random networks lies near 0: both hinges act
    config = TrainConfig(train_set="t.h5", out_dir=str(tmp_path / "out"), init=str(parent), init_type="hf",
                         outlier_exposure="oe.h5", oe_loss="rba", oe_weight=weight, oe_margins=[m_in, m_out],
                         crop=[64, 64])
    learner = MaskLearner(config, torch.device("cpu"))
    learner.module.train()
    batch, masks, labels = mask_batch()
    torch.manual_seed(2)  # the point sampling of the network's own loss
    found = learner.loss(batch, None)

    x = learner.network.network_input(preprocess(batch["image"]))
    torch.manual_seed(2)
    with torch.no_grad():
        out = learner.module(pixel_values=x, mask_labels=masks, class_labels=labels)
    own = float(out.loss)
    scores = mask_semantic_scores(out.class_queries_logits, out.masks_queries_logits, (64, 64))
    rba = rba_reference(scores.double().numpy(), batch["ood_mask"].numpy(), m_in, m_out)
    assert rba > 0.05 and own > 0.05  # both terms count
    assert found.item() == pytest.approx(own + weight * rba, rel=1e-5)
    found.backward()  # the step's gradient flows from this loss into the network
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in learner.module.parameters())
