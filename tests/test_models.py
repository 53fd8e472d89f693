"""Networks, heads, losses, training and checkpoints, on tiny inputs (CPU)."""

import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from segood.cli import main
from segood.data.common import Sample
from segood.data.h5 import H5SegmentationDataset, SetWriter
from segood.data.synthetic import scene_batch
from segood.models import build_model, confidence_loss, load_model, preprocess, read_checkpoint, save_checkpoint
from segood.models.network import IMAGENET_MEAN, IMAGENET_STD
from segood.models.train import TrainConfig, train

HEADS = ["plain", "dimreduce", "dropout", "confidence"]


@pytest.mark.parametrize("arch,encoder", [("pspnet", "resnet18"), ("deeplabv3plus", "resnet18")])
@pytest.mark.parametrize("head", HEADS)
def test_forward_shapes_and_upsample_is_last(arch, encoder, head):
    torch.manual_seed(0)
    model = build_model(arch, encoder, head=head).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = model(x)
        assert out.logits.shape == (2, 19, 64, 96)
        assert out.features.shape[1] == (32 if head == "dimreduce" else (512 if arch == "pspnet" else 256))
        assert (out.confidence is not None) == (head == "confidence")
        if head == "confidence":
            assert out.confidence.shape == (2, 1, 64, 96) and 0 < out.confidence.min() < out.confidence.max() < 1
        low_res = model.classifier(out.features)  # the classifier at the penultimate resolution ...
        expected = F.interpolate(low_res, size=(64, 96), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out.logits, expected)  # ... then only a bilinear upsample


def test_xception_deeplab_builds():
    model = build_model("deeplabv3plus", "tu-xception41", head="dimreduce").eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert out.logits.shape == (1, 19, 64, 64) and out.features.shape[1] == 32


def test_bad_input_shape_says_how_to_pad():
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match=r"pad to \(64, 104\)"):
        model(torch.randn(1, 3, 60, 100))


def _preprocess_by_torch(images):  # the reference: torch's float32 operations, one after the other
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((images.float() / 255.0) - mean) / std


def test_preprocess_gives_torchs_bits_for_every_value_and_layout():
    every = torch.arange(256, dtype=torch.uint8).repeat(3).view(1, 3, 16, 16)  # all 768 (value, channel) pairs
    assert torch.equal(preprocess(every).view(torch.int32), _preprocess_by_torch(every).view(torch.int32))
    frames = torch.randint(0, 256, (3, 3, 37, 1800), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    expected = _preprocess_by_torch(frames)  # (1800 wide: planes in bands of 36 rows, the last one shorter)
    out = torch.full(frames.shape, float("nan"))
    assert preprocess(frames, out=out) is out and torch.equal(out, expected)
    assert torch.equal(preprocess(frames.contiguous(memory_format=torch.channels_last)), expected)
    assert torch.equal(preprocess(frames[:, :, ::2, 3:]), expected[:, :, ::2, 3:])  # strided
    out = torch.full(frames.shape, float("nan"))  # the torch operations (as on a GPU), into out
    assert preprocess(frames.double(), out=out) is out and torch.equal(out, expected)
    with pytest.raises(ValueError, match="out must be float32 of shape"):
        preprocess(frames, out=torch.empty(3, 3, 37, 1799))
    with pytest.raises(ValueError, match="expected RGB frames"):
        preprocess(torch.zeros(1, 4, 8, 8, dtype=torch.uint8))


def test_dropout_is_stochastic_only_for_monte_carlo():
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head="dropout").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, model(x).logits)  # eval: deterministic
        samples = model.mc_logits(x, samples=4)
        assert samples.shape == (4, 2, 19, 64, 64)
        assert not torch.allclose(samples[0], samples[1])
        torch.manual_seed(123)
        mc = model.mc_logits(x, samples=3)
        torch.manual_seed(123)
        features = model.penultimate(x)
        separate = torch.stack([model.head(features, (64, 64), stochastic=True)[0] for _ in range(3)])
        torch.testing.assert_close(mc, separate)
        # seeded per frame: a frame's samples in a batch are its samples alone, whatever the global generator
        both = model.mc_logits(x, samples=3, features=features, seeds=[5, 6])
        torch.manual_seed(7)
        alone = model.mc_logits(x[1:], samples=3, features=features[1:], seeds=[6])
        torch.testing.assert_close(both[:, 1], alone[:, 0])
        assert not torch.allclose(both[:, 1], model.mc_logits(x[1:], samples=3, features=features[1:], seeds=[5])[:, 0])
        last = features.contiguous(memory_format=torch.channels_last)  # (the draws fill a frame in one order)
        torch.testing.assert_close(model.mc_logits(x, samples=3, features=last, seeds=[5, 6]), both)
        with pytest.raises(ValueError, match="mc_logits: one seed per frame, 2, got 1"):
            model.mc_logits(x, samples=3, features=features, seeds=[5])
    with pytest.raises(ValueError, match="dropout"):
        build_model("pspnet", "resnet18").mc_logits(x)


def test_monte_carlo_dropout_mask_is_bernoulli_and_rescaled():
    model = build_model("pspnet", "resnet18", head="dropout", dropout_p=0.3).eval()
    torch.manual_seed(0)
    out = model._dropout(torch.ones(400_000), stochastic=True)
    values, counts = out.unique(return_counts=True)
    torch.testing.assert_close(values, torch.tensor([0.0, 1 / 0.7]))
    assert counts[0].item() / out.numel() == pytest.approx(0.3, abs=0.005)  # 0.3 +- ~7 standard deviations
    assert torch.equal(model._dropout(torch.ones(10), stochastic=False), torch.ones(10))  # eval: identity
    with pytest.raises(ValueError, match="dropout_p"):
        build_model("pspnet", "resnet18", head="dropout", dropout_p=1.0)


def test_confidence_loss_by_hand():
    # one image, 2 classes, 2x2 pixels; pixel (1, 1) is ignore
    logits = torch.tensor([[[[2.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 3.0]]]])
    confidence = torch.tensor([[[[0.9, 0.5], [0.2, 0.7]]]])
    target = torch.tensor([[[0, 1], [1, 255]]])
    hints = torch.tensor([[[[1.0, 0.0], [1.0, 1.0]]]])
    p = logits.softmax(dim=1)
    # pixel (0,0): b=1, c'=0.9, target 0: p' = 0.9 p0 + 0.1;  (0,1): b=0, c'=1: p' = p1;  (1,0): b=1, c'=0.2: 0.2 p1 + 0.8
    nll = [-math.log(0.9 * p[0, 0, 0, 0] + 0.1), -math.log(p[0, 1, 0, 1]), -math.log(0.2 * p[0, 1, 1, 0] + 0.8)]
    conf = [-math.log(0.9), -math.log(0.5), -math.log(0.2)]
    expected = sum(nll) / 3 + 0.5 * sum(conf) / 3
    assert confidence_loss(logits, confidence, target, hints=hints).item() == pytest.approx(expected, rel=1e-6)


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.h5"
    images, semantic, ood = scene_batch(0, 24, 64, 128)
    writer = SetWriter(path, (64, 128), {"source": "synthetic", "split": "train"})
    for k in range(len(images)):
        writer.append(Sample(images[k], ood[k], semantic[k], f"scene/{k}"))
    writer.commit()
    return path


def config(tiny_set, out, **kw):
    return TrainConfig(train_set=str(tiny_set), out_dir=str(out), arch="pspnet", encoder="resnet18",
                       batch_size=4, lr=0.02, crop=[64, 128], scale=[0.75, 1.25], **kw)


def test_a_crop_no_frame_reaches_even_scaled_up_is_refused_before_training(tiny_set, tmp_path):
    """Frames of 64 x 128 scaled by up to 1.25 reach 80 x 160: a crop of 80 x 160 trains, one pixel more is refused
    (its batches would be mostly padding; 4096 x 8192 exhausted the memory)."""
    for crop in ([81, 160], [80, 161], [4096, 8192]):
        with pytest.raises(ValueError, match=rf"--crop {crop[0]} {crop[1]} is larger than any frame of .*train.h5 "
                                             r"becomes \(at most 64x128, scaled by up to 1.25: 80x160\)"):
            train(replace(config(tiny_set, tmp_path / "big", epochs=1), crop=crop), progress=False)
    assert not (tmp_path / "big").exists()
    train(replace(config(tiny_set, tmp_path / "fits", epochs=1), crop=[80, 160]), progress=False, stop_after=0)
    with pytest.raises(ValueError, match=r"--crop 63 127: the network's input sides must be multiples of 8 \(its "
                                         r"encoder's stride\); give e.g. --crop 64 128"):
        train(replace(config(tiny_set, tmp_path / "odd", epochs=1), crop=[63, 127]), progress=False)
    frames = len(H5SegmentationDataset(tiny_set))
    with pytest.raises(ValueError, match=rf"has {frames} frames, fewer than one batch of {frames + 1}: give a "
                                         rf"smaller --batch-size \(at most {frames}\)"):
        train(replace(config(tiny_set, tmp_path / "few", epochs=1), batch_size=frames + 1), progress=False)


def test_a_set_without_classes_is_refused_for_training_validation_and_miou(tiny_set, tmp_path, capsys):
    """A noise set's semantic labels are all 255: its loss and its mIoU would be NaN (they were, without a word)."""
    from segood.data import convert
    from segood.data.noise import Noise

    noise = tmp_path / "noise.h5"
    convert(Noise("normal", 4, size=(64, 128)), noise, progress=False)
    message = rf"^{noise} has no pixel with a class in its semantic labels \(as a noise set\): {{}} needs a set " \
              "labelled with Cityscapes trainIds, e.g. Cityscapes val$"
    with pytest.raises(ValueError, match=message.format("training")):
        train(config(noise, tmp_path / "a", epochs=1), progress=False)
    with pytest.raises(ValueError, match=message.format("--val's mIoU")):
        train(config(tiny_set, tmp_path / "b", epochs=1, val_set=str(noise)), progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    train(config(tiny_set, tmp_path / "run", epochs=0), progress=False)
    assert main(["miou", str(tmp_path / "run" / "final.pt"), "--data", str(noise)]) == 2
    assert capsys.readouterr().err == (f"segood miou: error: {noise} has no pixel with a class in its semantic labels "
                                       "(as a noise set): mIoU needs a set labelled with Cityscapes trainIds, e.g. "
                                       "Cityscapes val\n")


def test_resuming_a_training_with_nothing_saved_says_so(tiny_set, tmp_path):
    with pytest.warns(UserWarning, match=rf"^nothing to resume in {tmp_path / 'run'} \(no last.pt\): the training "
                                         "starts afresh$"):
        train(config(tiny_set, tmp_path / "run", epochs=0), resume=True, progress=False)


def labelled_batch():
    """Two generated frames, the top-left block of each void (255), as a training batch of tensors."""
    images, semantic, ood = scene_batch(0, 2, 64, 128)
    semantic = semantic.copy()
    semantic[:, :16, :40] = 255
    return {"image": torch.from_numpy(images).permute(0, 3, 1, 2), "semantic": torch.from_numpy(semantic),
            "ood_mask": torch.from_numpy(ood)}


@pytest.mark.parametrize("head", ["plain", "confidence"])
def test_the_training_loss_of_each_head_by_hand(tmp_path, head):
    from segood.models.train import NetworkLearner

    torch.manual_seed(0)
    learner = NetworkLearner(config("train.h5", tmp_path, head=head, conf_lambda=0.1), torch.device("cpu"))
    learner.network.eval()
    batch = labelled_batch()
    with torch.no_grad():
        output = learner.network(preprocess(batch["image"]))
        torch.manual_seed(3)  # the confidence loss's hints
        found = learner.loss(batch, None).item()
        target = batch["semantic"].long()
        if head == "plain":  # cross-entropy over the labelled pixels only: void pixels are no class
            log_p = output.logits.double().log_softmax(dim=1)
            labelled = target != 255
            nll = -log_p.gather(1, target.clamp(max=18)[:, None])[:, 0][labelled]
            expected = float(nll.sum() / labelled.sum())
        else:  # DeVries & Taylor's loss (tested by hand above) with the configured λ
            torch.manual_seed(3)
            expected = confidence_loss(output.logits, output.confidence, target, lam=0.1).item()
    assert found == pytest.approx(expected, rel=1e-5)


def test_training_reduces_the_loss_and_logs(tiny_set, tmp_path):
    log = train(config(tiny_set, tmp_path, epochs=4, val_set=str(tiny_set)), progress=False)  # 4 x 6 = 24 steps
    assert log[-1]["loss"] < log[0]["loss"]
    assert (tmp_path / "log.csv").read_text().startswith("epoch,iteration,loss,lr,seconds,val_miou")
    model, state = load_model(tmp_path / "final.pt")
    assert state["config"]["head"] == "plain" and state["iteration"] == 24
    # the poly schedule lr (1 - i / total)^0.9 at step i = 0 .. 23; each row holds its epoch's last step's
    assert [row["lr"] for row in log] == pytest.approx([0.02 * (1 - (6 * e - 1) / 24) ** 0.9 for e in (1, 2, 3, 4)])


@pytest.mark.parametrize("head", ["plain", "confidence"])
def test_resume_equals_uninterrupted(tiny_set, tmp_path, head):
    train(config(tiny_set, tmp_path / "straight", epochs=2, head=head), progress=False)
    train(config(tiny_set, tmp_path / "resumed", epochs=2, head=head), progress=False, stop_after=1)
    assert not (tmp_path / "resumed" / "final.pt").exists()
    train(config(tiny_set, tmp_path / "resumed", epochs=2, head=head), progress=False, resume=True)
    a, b = read_checkpoint(tmp_path / "straight/final.pt"), read_checkpoint(tmp_path / "resumed/final.pt")
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0)
    assert a["log"][-1]["loss"] == b["log"][-1]["loss"]


def test_resume_on_other_frames_under_the_same_path_is_refused(tiny_set, tmp_path):
    shutil.copy(tiny_set, tmp_path / "train.h5")
    train(config(tmp_path / "train.h5", tmp_path / "run", epochs=2), progress=False, stop_after=1)
    images, semantic, ood = scene_batch(1, 8, 64, 128)  # other frames, the same file name
    writer = SetWriter(tmp_path / "train.h5", (64, 128), {"source": "synthetic", "split": "train"}, overwrite=True)
    for k in range(len(images)):
        writer.append(Sample(images[k], ood[k], semantic[k], f"scene/{k}"))
    writer.commit()
    with pytest.raises(ValueError, match=r"--resume: train_set hold other frames than .*last.pt was trained on"):
        train(config(tmp_path / "train.h5", tmp_path / "run", epochs=2), progress=False, resume=True)


def test_augmentation_is_drawn_per_frame_whatever_reads_it(tiny_set, tmp_path):
    """The training batches of an epoch are the same read in the main process or by two reader processes (each
    holds a copy of the transform: drawing from its running state, readers repeated each other's draws)."""
    from segood.models.train import _Augmented, _dataset, augmentation

    cfg = config(tiny_set, tmp_path, epochs=1)
    batches = []
    for workers in (0, 2):
        transform = augmentation(cfg, 0)
        loader = torch.utils.data.DataLoader(_Augmented(_dataset(cfg, transform), transform, 7), batch_size=2,
                                             shuffle=True, num_workers=workers,
                                             generator=torch.Generator().manual_seed(7))
        batches.append([batch["image"] for batch in loader])
    assert len(batches[0]) > 2 and all(torch.equal(a, b) for a, b in zip(*batches))
    assert not torch.equal(batches[0][0][0], batches[0][1][0])  # two frames, two draws



def test_the_seed_draws_the_initial_weights_and_every_epochs_order(tiny_set, tmp_path):
    def weights(out, **kw):
        train(config(tiny_set, tmp_path / out, **kw), progress=False)
        return read_checkpoint(tmp_path / out / "final.pt")["model"]

    start, again, other = (weights(out, epochs=0, seed=seed) for out, seed in (("a", 0), ("b", 0), ("c", 1)))
    assert all(torch.equal(start[k], again[k]) for k in start)
    assert not all(torch.equal(start[k], other[k]) for k in start)
    # from the same weights, one epoch of another seed reads other crops in another order
    init = str(tmp_path / "a" / "final.pt")
    first, second = (weights(out, epochs=1, seed=seed, init=init) for out, seed in (("d", 0), ("e", 1)))
    assert not all(torch.equal(first[k], second[k]) for k in first)


def test_augmentation_pads_masks_with_ignore_and_never_interpolates_them(tmp_path):
    from segood.models.train import augmentation

    # frames of 64 x 128 scaled to 48 x 96, then padded to the 64 x 128 crop
    cfg = TrainConfig(train_set="train.h5", out_dir=str(tmp_path), crop=[64, 128], scale=[0.75, 0.75])
    semantic = ((np.arange(64)[:, None] + np.arange(128)) % 2 * 18).astype(np.uint8)  # classes 0 and 18 alternate
    image = np.full((64, 128, 3), 100, np.uint8)
    for epoch in range(3):
        out = augmentation(cfg, epoch)(image=image, mask=semantic)
        assert out["mask"].shape == (64, 128)
        assert set(np.unique(out["mask"])) == {0, 18, 255}  # no class between 0 and 18 made up by interpolation
        assert (out["mask"] == 255).sum() == 64 * 128 - 48 * 96  # padding is no class


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_or_foreign_checkpoints_are_refused(tmp_path):
    model = build_model("pspnet", "resnet18")
    save_checkpoint(tmp_path / "ok.pt", model)
    assert load_model(tmp_path / "ok.pt")[1]["config"]["encoder"] == "resnet18"
    torch.save({"format": "segood.checkpoint/1", "payload": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="refusing to load"):
        read_checkpoint(tmp_path / "evil.pt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match=r"not a segood checkpoint \(expected format 'segood.checkpoint/1'\)$"):
        read_checkpoint(tmp_path / "foreign.pt")
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not a segood checkpoint .*: it is a plain state dict, which --arch, --encoder "
                                         "and --weights .* or --model-type and --model .* read"):
        read_checkpoint(tmp_path / "plain.pt")
    (tmp_path / "garbage.pt").write_bytes(b"\x00" * 100)  # not a pickle: not called one
    with pytest.raises(ValueError, match="garbage.pt is not a readable checkpoint: not a file torch.save wrote"):
        read_checkpoint(tmp_path / "garbage.pt")


def test_train_and_miou_commands(tiny_set, tmp_path, capsys):
    assert main(["train", "--train", str(tiny_set), "--out", str(tmp_path), "--arch", "pspnet", "--encoder",
                 "resnet18", "--head", "dimreduce", "--epochs", "1", "--batch-size", "4", "--crop", "64", "128",
                 "--quiet"]) == 0
    assert main(["miou", str(tmp_path / "final.pt"), "--data", str(tiny_set), "--out", str(tmp_path / "m.md"),
                 "--quiet"]) == 0
    table = (tmp_path / "m.md").read_text()
    assert "| pspnet resnet18 + dimreduce |" in table and "mIoU" in table
    assert (tmp_path / "m.csv").read_text().startswith("network,class,iou")
    shutil.copy(tmp_path / "final.pt", tmp_path / "again.pt")  # one network twice (a parent and its fine-tune)
    assert main(["miou", str(tmp_path / "final.pt"), str(tmp_path / "again.pt"), "--data", str(tiny_set),
                 "--out", str(tmp_path / "two.md"), "--quiet"]) == 0
    table = (tmp_path / "two.md").read_text()
    assert "| pspnet resnet18 + dimreduce (final.pt) |" in table and "| pspnet resnet18 + dimreduce (again.pt) |" in table
    assert main(["miou", str(tmp_path / "final.pt"), "--data", str(tiny_set), "--out", str(tmp_path / "final.pt"),
                 "--quiet"]) == 2  # the checkpoint is not overwritten by the table
    assert "give a .md file for the table" in capsys.readouterr().err and load_model(tmp_path / "final.pt")
    before = (tmp_path / "final.pt").read_bytes()
    assert main(["train", "--train", str(tiny_set), "--out", str(tmp_path), "--arch", "pspnet", "--encoder",
                 "resnet18", "--epochs", "1", "--batch-size", "4", "--crop", "64", "128", "--quiet"]) == 2
    assert "already holds a training (last.pt, final.pt): --resume continues it" in capsys.readouterr().err
    assert (tmp_path / "final.pt").read_bytes() == before  # not trained over
    with pytest.raises(SystemExit):
        main(["train", "--train", str(tiny_set), "--out", str(tmp_path / "zero"), "--batch-size", "0", "--quiet"])
    assert "argument --batch-size: must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["train", "--train", str(tiny_set), "--out", str(tmp_path / "zero"), "--scale", "2", "0.5",
                 "--quiet"]) == 2
    assert "0 < MIN <= MAX" in capsys.readouterr().err
