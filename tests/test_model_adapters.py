"""Networks from transformers, torchvision and smp as segood networks, their inference modes and class mapping,
and the mask-level methods: each checked against the library's own post-processing or a literal reference, on
tiny random networks built offline from configs."""

import argparse
import json
import math
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
import torchvision  # noqa: E402
from transformers import (EomtImageProcessor, Mask2FormerImageProcessor, SegformerConfig,  # noqa: E402
                          SegformerForSemanticSegmentation, SegformerImageProcessor)

from segood.cli import main  # noqa: E402
from segood.evaluation import evaluate  # noqa: E402
from segood.evaluation.api import _model_identity  # noqa: E402
from segood.labels import CLASS_NAMES  # noqa: E402
from segood.methods import get_method, score_batch  # noqa: E402
from segood.methods.mask import eam, mask_max_softmax, rba  # noqa: E402
from segood.models import (build_model, class_indices, hf_model, load_library_model,  # noqa: E402
                           load_smp_weights, preprocess, sliding_windows, torchvision_model)
from segood.models.adapters import LibraryModel  # noqa: E402
from segood.models.inference import processor_size, resize_and_back, slide  # noqa: E402
from segood.models.network import IMAGENET_MEAN, IMAGENET_STD, SegOutput  # noqa: E402

from networks import tiny_eomt, tiny_mask2former  # noqa: E402
from rawtrees import mixed_noise_sets  # noqa: E402

OWN_MEAN, OWN_STD = [0.5, 0.4, 0.3], [0.2, 0.3, 0.25]  # not ImageNet's, so that honouring them is visible
PIXEL_METHODS = ("max_softmax", "entropy", "max_logit", "energy")
MASK_METHODS = ("rba", "mask_max_softmax", "eam")


def frames(n, height, width, seed=0):
    return torch.randint(0, 256, (n, 3, height, width), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def processed(processor, images):
    """The library's own preprocessing of uint8 frames (N, 3, H, W), resizing off."""
    return processor(images=[i.permute(1, 2, 0).numpy() for i in images], do_resize=False,
                     return_tensors="pt").pixel_values


def tiny_segformer(labels=4):
    torch.manual_seed(0)
    names = labels if isinstance(labels, (list, tuple)) else [f"class{i}" for i in range(labels)]
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             num_attention_heads=[1, 2], decoder_hidden_size=16, num_labels=len(names),
                             id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    return SegformerForSemanticSegmentation(config).eval()


@pytest.fixture(scope="module")
def mask2former():
    return tiny_mask2former()


# every adapter against its library's own post-processing


def test_segformer_equals_transformers_post_processing_and_honours_its_processor():
    network = tiny_segformer()
    processor = SegformerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD)
    images = frames(2, 37, 50)
    batch = score_batch(hf_model(network, processor), preprocess(images), [get_method("max_softmax")])
    with torch.no_grad():
        out = network(pixel_values=processed(processor, images))
    ref = processor.post_process_semantic_segmentation(out, target_sizes=[(37, 50)] * 2,
                                                       return_segmentation_scores=True)
    torch.testing.assert_close(batch.output.logits, torch.stack([r.segmentation_scores for r in ref]),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.classes, torch.stack([r.segmentation for r in ref]))
    default = score_batch(hf_model(network), preprocess(images), [get_method("max_softmax")])
    assert not torch.allclose(default.output.logits, batch.output.logits)  # the processor's mean/std matter
    # ... and so they are part of the run's identity, as the resize mode's size is (a resume never mixes two)
    identities = [_model_identity(hf_model(network, p, inference="resize"), None) for p in (
        processor, SegformerImageProcessor(), SegformerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD,
                                                                      size={"height": 32, "width": 64}))]
    assert len({json.dumps(i, sort_keys=True) for i in identities}) == 3


def test_mask2former_semantic_scores_equal_transformers_post_processing(mask2former):
    processor = Mask2FormerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD)
    images = frames(1, 384, 384)  # transformers resizes the masks to 384 x 384 before its sum over queries
    batch = score_batch(hf_model(mask2former, processor), preprocess(images), [get_method("eam")])
    with torch.no_grad():
        out = mask2former(pixel_values=processed(processor, images))
    ref = processor.post_process_semantic_segmentation(out, target_sizes=[(384, 384)], return_segmentation_scores=True)
    torch.testing.assert_close(batch.output.logits, torch.stack([r.segmentation_scores for r in ref]),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.classes, torch.stack([r.segmentation for r in ref]))
    queries = batch.output.queries  # kept as the network gives them
    torch.testing.assert_close(queries.class_logits, out.class_queries_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(queries.mask_logits, out.masks_queries_logits, atol=1e-5, rtol=1e-5)
    assert queries.class_logits.shape == (1, 5, 5) and queries.mask_logits.shape == (1, 5, 96, 96)


def test_eomt_semantic_scores_equal_transformers_post_processing():
    network = tiny_eomt()
    processor = EomtImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD, size={"shortest_edge": 64,
                                                                                 "longest_edge": 64})
    images = frames(1, 64, 64)
    batch = score_batch(hf_model(network, processor), preprocess(images), [get_method("rba")])
    with torch.no_grad():
        out = network(pixel_values=processed(processor, images))
    ref = processor.post_process_semantic_segmentation(out, target_sizes=[(64, 64)], return_segmentation_scores=True)
    torch.testing.assert_close(batch.output.logits, ref[0].segmentation_scores[None], atol=1e-5, rtol=1e-5)
    model = hf_model(network, processor)
    for height, width in ((48, 80), (60, 60)):  # (60x60 was padded to the patch multiple, 64x64, and scored)
        with pytest.raises(ValueError, match="exactly 64x64.*'resize' or 'slide'"):
            score_batch(model, preprocess(frames(1, height, width)), [get_method("rba")])
    resized = hf_model(network, processor, inference="resize")
    assert score_batch(resized, preprocess(frames(1, 48, 80)), [get_method("eam")]).scores[0].shape == (1, 48, 80)


@pytest.mark.parametrize("height, width", [(100, 151), (151, 100), (720, 1281), (333, 1000)])
def test_the_resize_size_is_the_image_processors(height, width):
    """Sides truncated as transformers truncates them (rounding gave 64x97 for 64x96, then 128 wide at the network's
    multiple of 32)."""
    for size in ({"shortest_edge": 64, "longest_edge": 1000}, {"shortest_edge": 64, "longest_edge": 100}):
        processor = Mask2FormerImageProcessor(size=size, size_divisor=0, do_pad=False)
        done = processor(images=[np.zeros((height, width, 3), np.uint8)], return_tensors="pt")["pixel_values"]
        assert processor_size(height, width, processor.size) == tuple(done.shape[-2:])


@pytest.mark.parametrize("arch", ["deeplabv3_mobilenet_v3_large", "fcn_resnet50", "lraspp_mobilenet_v3_large"])
def test_torchvision_state_dict_loads_and_equals_the_module(arch, tmp_path):
    torch.manual_seed(0)
    aux = {"aux_loss": True} if arch.startswith(("deeplab", "fcn")) else {}
    network = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=3, **aux).eval()
    torch.save(network.state_dict(), tmp_path / "weights.pt")
    model = load_library_model("torchvision", tmp_path / "weights.pt", arch=arch)
    x = preprocess(frames(1, 40, 56))
    with torch.no_grad():
        expected = network(x)["out"]  # torchvision takes ImageNet-normalised inputs, as segood gives them
    torch.testing.assert_close(score_batch(model, x, [get_method("energy")]).output.logits, expected)
    with pytest.raises(ValueError, match="predicts 3 classes, not 19"):
        load_library_model("torchvision", tmp_path / "weights.pt", arch=arch, num_classes=19)
    with pytest.raises(ValueError, match="needs its architecture"):
        load_library_model("torchvision", tmp_path / "weights.pt", arch="resnet50")
    other = "fcn_resnet50" if arch != "fcn_resnet50" else "deeplabv3_resnet50"
    with pytest.raises(ValueError, match=f"does not fit torchvision {other} with 3 classes: (Missing|Unexpected) "
                                         r"key\(s\) in state_dict: \""):
        load_library_model("torchvision", tmp_path / "weights.pt", arch=other)


def no_network(*args, **kwargs):
    raise AssertionError("segood tried to reach the network")


def test_smp_folder_and_hf_folder_load_offline(tmp_path, monkeypatch):
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    network = smp.create_model("fpn", encoder_name="resnet18", encoder_weights=None, classes=3).eval()
    network.save_pretrained(str(tmp_path / "smp"))
    x = preprocess(frames(1, 64, 64))
    with torch.no_grad():
        expected = network(x)
    torch.testing.assert_close(load_library_model("smp", tmp_path / "smp")(x).logits, expected)
    config = json.loads((tmp_path / "smp" / "config.json").read_text())
    (tmp_path / "smp" / "config.json").write_text(json.dumps({**config, "encoder_weights": "imagenet"}))
    for name in ("connect", "create_connection"):  # (smp's default: the folder names pretrained weights, not used)
        monkeypatch.setattr(socket.socket if name == "connect" else socket, name, no_network)
    torch.testing.assert_close(load_library_model("smp", tmp_path / "smp")(x).logits, expected)
    monkeypatch.undo()
    torch.save(network.state_dict(), tmp_path / "fpn.pt")  # frames of sides no multiple of 32: padded, as the folder
    odd = preprocess(frames(1, 40, 72))
    from_weights = score_batch(load_smp_weights("fpn", "resnet18", tmp_path / "fpn.pt", num_classes=3), odd,
                               [get_method("energy")])
    from_folder = score_batch(load_library_model("smp", tmp_path / "smp"), odd, [get_method("energy")])
    torch.testing.assert_close(from_weights.output.logits, from_folder.output.logits)
    segformer = tiny_segformer()
    segformer.save_pretrained(tmp_path / "hf")
    SegformerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD).save_pretrained(tmp_path / "hf")
    loaded = load_library_model("hf", tmp_path / "hf")
    images = frames(1, 32, 48)
    with torch.no_grad():
        expected = segformer(pixel_values=processed(SegformerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD),
                                                    images)).logits
    torch.testing.assert_close(loaded(preprocess(images)).logits, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="not a transformers model folder"):
        load_library_model("hf", tmp_path / "smp" / "nothing")
    with pytest.raises(KeyError, match="unknown model type 'keras'; choose one of .*'hf'"):
        load_library_model("keras", tmp_path)
    with pytest.raises(ValueError, match="not a transformers model folder .*read it with model type 'smp'"):
        load_library_model("hf", tmp_path / "smp")
    with pytest.raises(ValueError, match="not a segmentation_models_pytorch model folder .*model type 'hf'"):
        load_library_model("smp", tmp_path / "hf")
    (tmp_path / "smp" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json cannot be read as JSON"):
        load_library_model("smp", tmp_path / "smp")


# inference modes


def literal_windows(length, size, step):
    """Window starts written out: every step, until a window reaches the border, which ends the last one."""
    starts, start = [], 0
    while True:
        if start + size >= length:
            starts.append(max(length - size, 0))
            return starts
        starts.append(start)
        start += step


@pytest.mark.parametrize("height, width, crop, stride", [(13, 17, (6, 8), (4, 5)), (12, 12, (6, 6), (3, 3)),
                                                         (5, 9, (8, 8), (4, 4)), (16, 24, (8, 8), (8, 8))])
def test_sliding_window_equals_a_literal_loop(height, width, crop, stride):
    assert sliding_windows(height, width, crop, stride) == [
        (t, min(t + crop[0], height), left, min(left + crop[1], width))
        for t in literal_windows(height, crop[0], stride[0]) for left in literal_windows(width, crop[1], stride[1])]
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, height, width)

    def run(window):  # logits at half the window's size, as a head before its final resize
        return SegOutput(F.avg_pool2d(conv(window), 2, ceil_mode=True), None)

    with torch.no_grad():
        got = slide(run, x, crop=crop, stride=stride)
        expected = torch.zeros(2, 4, height, width)
        for i in range(height):  # each pixel: the mean over the windows that cover it
            for j in range(width):
                values = []
                for top in literal_windows(height, crop[0], stride[0]):
                    for left in literal_windows(width, crop[1], stride[1]):
                        bottom, right = min(top + crop[0], height), min(left + crop[1], width)
                        if top <= i < bottom and left <= j < right:
                            window = F.interpolate(run(x[..., top:bottom, left:right]).logits,
                                                   size=(bottom - top, right - left), mode="bilinear")
                            values.append(window[..., i - top, j - left])
                expected[..., i, j] = sum(values) / len(values)
    torch.testing.assert_close(got, expected)


def test_inputs_too_small_for_the_network_are_named_with_the_option_that_sets_them():
    x = preprocess(frames(1, 40, 72))
    with pytest.raises(ValueError, match=r"cannot run on inputs this small \(4x4\): .*Kernel size.*--window H W"):
        hf_model(tiny_segformer(), inference="slide", crop=(4, 4))(x)
    with pytest.raises(ValueError, match=r"this small \(4x4\): .*--infer-size H W"):
        hf_model(tiny_segformer(), inference="resize", size=(4, 4))(x)
    with pytest.raises(ValueError, match=r"this small \(4x4\): .*--inference resize"):
        hf_model(tiny_segformer())(preprocess(frames(1, 4, 4)))
    assert hf_model(tiny_segformer(), inference="slide", crop=(32, 32))(x).logits.shape == (1, 4, 40, 72)


def test_adapter_modes_resize_and_slide_against_the_module():
    torch.manual_seed(0)
    network = torchvision.models.get_model("lraspp_mobilenet_v3_large", weights=None, weights_backbone=None,
                                           num_classes=3).eval()
    x = preprocess(frames(1, 40, 72))
    with torch.no_grad():
        small = F.interpolate(x, size=(32, 64), mode="bilinear", antialias=True)
        expected = F.interpolate(network(small)["out"], size=(40, 72), mode="bilinear")
        got = torchvision_model(network, inference="resize", size=(32, 64))(x).logits
        torch.testing.assert_close(got, expected)
        windows = sliding_windows(40, 72, (32, 32), (16, 24))
        total, count = torch.zeros(1, 3, 40, 72), torch.zeros(1, 1, 40, 72)
        for top, bottom, left, right in windows:
            total[..., top:bottom, left:right] += network(x[..., top:bottom, left:right])["out"]
            count[..., top:bottom, left:right] += 1
        got = torchvision_model(network, inference="slide", crop=(32, 32), stride=(16, 24))(x).logits
        torch.testing.assert_close(got, total / count)
    with pytest.raises(ValueError, match="sliding-window inference needs crop"):
        torchvision_model(network, inference="slide")
    with pytest.raises(ValueError, match="unknown inference mode 'tiles'"):
        torchvision_model(network, inference="tiles")
    with pytest.raises(ValueError, match="larger than the crop"):
        torchvision_model(network, inference="slide", crop=(8, 8), stride=(9, 8))


class Strided(torch.nn.Module):
    """A network whose inputs must be multiples of 8: logits at 1/4 of its input (a head before its final resize),
    each a function of the pixels around it; it records the inputs it sees."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 4, stride=4)
        self.seen = []

    def forward(self, x):
        assert x.shape[-2] % 8 == 0 and x.shape[-1] % 8 == 0, tuple(x.shape)
        self.seen.append(x.detach().clone())
        return self.conv(x)


class StridedModel(LibraryModel):
    def num_network_classes(self):
        return 3

    def network_output(self, x):
        return SegOutput(self.module(x), None)


def in_own_normalisation(x):
    """ImageNet-normalised ``x`` as (pixels - OWN_MEAN) / OWN_STD."""
    pixels = x * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    return (pixels - torch.tensor(OWN_MEAN).view(1, 3, 1, 1)) / torch.tensor(OWN_STD).view(1, 3, 1, 1)


def test_padding_to_the_multiple_and_cropping_back_written_out():
    """Whole mode: the frame zero-padded at the bottom and right (in the network's own normalisation) to the multiple,
    the logits resized to the padded size (bilinear, the adapter's ``align_corners``) and cropped to the top-left
    frame. Resize mode: the network's size rounded up to the multiple. Slide mode: a window smaller than the crop
    padded to the multiple as the whole frame is."""
    x = preprocess(frames(1, 13, 17))
    own = in_own_normalisation(x)
    for align_corners in (False, True):
        model = StridedModel(Strided(), multiple=8, mean=OWN_MEAN, std=OWN_STD, align_corners=align_corners)
        with torch.no_grad():
            got = model(x).logits
            padded = F.pad(own, (0, 24 - 17, 0, 16 - 13))  # (left, right, top, bottom)
            expected = F.interpolate(model.module.conv(padded), size=(16, 24), mode="bilinear",
                                     align_corners=align_corners)[..., :13, :17]
        torch.testing.assert_close(model.module.seen[-1], padded)
        torch.testing.assert_close(got, expected)
    for options in ({"size": (50, 70)}, {"processor_size": {"height": 50, "width": 70}}):
        model = StridedModel(Strided(), multiple=32, inference="resize", **options)
        with torch.no_grad():
            model(preprocess(frames(1, 40, 60)))
        assert tuple(model.module.seen[-1].shape[-2:]) == (64, 96)  # 50 x 70 rounded up to 32, not down
    model = StridedModel(Strided(), multiple=8, inference="slide", crop=(8, 8), mean=OWN_MEAN, std=OWN_STD)
    x = preprocess(frames(1, 5, 9))
    with torch.no_grad():
        got = model(x).logits
    own = in_own_normalisation(x)
    total, count = torch.zeros(1, 3, 5, 9), torch.zeros(1, 1, 5, 9)
    with torch.no_grad():
        for left in (0, 1):  # two windows 5 x 8, each padded to 8 x 8
            window = F.pad(own[..., left:left + 8], (0, 0, 0, 3))
            total[..., left:left + 8] += F.interpolate(model.module.conv(window), size=(8, 8), mode="bilinear",
                                                       align_corners=False)[..., :5, :]
            count[..., left:left + 8] += 1
    assert [tuple(t.shape[-2:]) for t in model.module.seen] == [(8, 8), (8, 8)]
    torch.testing.assert_close(got, total / count)


def test_resize_and_back_resizes_the_input_without_and_the_logits_with_align_corners():
    """The image processors resize the input with align_corners False (antialiased when shrinking); the logits go
    back to the frame with the library's own ``align_corners``."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 2, 2, stride=2)
    x = torch.randn(1, 3, 10, 14)

    def run(inner):  # logits at half the network's size
        return SegOutput(conv(inner), None)

    with torch.no_grad():
        for size in ((6, 8), (20, 28)):
            inner = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=size[0] < 10)
            for align_corners in (False, True):
                expected = F.interpolate(conv(inner), size=(10, 14), mode="bilinear", align_corners=align_corners)
                torch.testing.assert_close(resize_and_back(run, x, size, align_corners=align_corners).logits, expected)


def test_processor_sizes_written_out():
    """Sides truncated (not rounded) as transformers truncates them, also for a longest edge alone; then rounded up
    (never down) to the network's multiple."""
    assert processor_size(100, 150, {"longest_edge": 64}) == (42, 64)  # 64 * 100 / 150 = 42.67
    assert processor_size(150, 100, {"longest_edge": 64}) == (64, 42)
    assert processor_size(100, 150, {"shortest_edge": 64}) == (64, 96)
    assert processor_size(40, 60, {"height": 50, "width": 70}, multiple=32) == (64, 96)


# class mapping


def test_class_mapping_by_name_dict_and_list_and_its_refusals():
    shuffled = ["void"] + list(reversed(CLASS_NAMES)) + ["anomaly"]
    indices = class_indices(shuffled, "cityscapes")
    assert [shuffled[i] for i in indices] == list(CLASS_NAMES)
    assert class_indices([n.upper().replace(" ", "_") for n in shuffled], "cityscapes") == indices
    assert class_indices(shuffled, {name: shuffled.index(name) for name in CLASS_NAMES}) == indices
    assert class_indices(5, [4, 0, 2]) == (4, 0, 2)
    with pytest.raises(ValueError, match="cannot be mapped to the 19 Cityscapes trainIds: it has no class named "
                                         "'rider'"):
        class_indices([n for n in shuffled if n != "rider"], "cityscapes")
    with pytest.raises(ValueError, match="leaves Cityscapes classes .*sky.* unmapped"):
        class_indices(shuffled, {name: name for name in CLASS_NAMES if name != "sky"})
    with pytest.raises(ValueError, match="maps to network class 7, but the network has classes 0..4"):
        class_indices(5, [7])
    with pytest.raises(ValueError, match="names none of its 5 classes"):
        class_indices(5, "cityscapes")
    # separators aside ("trafficlight" is "traffic light"); integers of any kind; a JSON file's string trainIds
    assert class_indices([n.replace(" ", "") for n in shuffled], "cityscapes") == indices
    assert class_indices(5, np.array([4, 0, 2])) == class_indices(5, [np.int64(4), torch.tensor(0), 2]) == (4, 0, 2)
    assert class_indices(shuffled, {str(k): shuffled.index(n) for k, n in enumerate(CLASS_NAMES)}) == indices
    for wrong in (5, True):
        with pytest.raises(ValueError, match="give 'cityscapes', a list of network classes per target class"):
            class_indices(5, wrong)


def test_a_mapped_network_gives_the_target_classes_and_refuses_an_unmappable_one():
    names = ["void"] + list(reversed(CLASS_NAMES))
    network = tiny_segformer(names)
    x = preprocess(frames(1, 32, 32))
    full, mapped = hf_model(network)(x).logits, hf_model(network, classes="cityscapes")(x).logits
    torch.testing.assert_close(mapped, full[:, [names.index(n) for n in CLASS_NAMES]])
    with pytest.raises(ValueError, match="cannot be mapped.*'road'"):
        hf_model(tiny_segformer(4), classes="cityscapes")
    masks = tiny_mask2former(names)
    out = hf_model(masks, classes="cityscapes")(preprocess(frames(1, 64, 64)))
    assert out.logits.shape[1] == 19 and out.queries.class_probabilities().shape == (1, 5, 19)


# mask-level methods against their authors' definitions


CLASS_LOGITS = torch.tensor([[[0.0, 6.0, 0.0, 0.0],    # a confident class-1 mask
                              [0.0, 5.5, 0.0, -1.0],   # another
                              [4.0, 0.0, 1.0, 0.0],    # class 0, not confident enough
                              [0.0, 0.0, 0.0, 3.0]]])  # "no object"
MASK_LOGITS = torch.tensor([[[[2.0, -1.0], [0.5, -3.0]],
                             [[-2.0, 1.0], [0.0, -0.5]],
                             [[1.0, 1.0], [-1.0, 3.0]],
                             [[0.0, -2.0], [2.0, 0.0]]]])


def softmax_row(row):
    exps = [math.exp(v) for v in row]
    return [e / sum(exps) for e in exps]


def sigmoid(v):
    return 1 / (1 + math.exp(-v))


def authors_semseg(cls, masks):
    """semantic_inference, written out: softmax over classes, "no object" dropped, times sigmoid masks, summed
    over queries: semseg[c][i][j] = Σ_q p[q][c] σ(m[q][i][j])."""
    probs = [softmax_row(row)[:-1] for row in cls]
    return [[[sum(probs[q][c] * sigmoid(masks[q][i][j]) for q in range(len(cls))) for j in range(len(masks[0][0]))]
             for i in range(len(masks[0]))] for c in range(len(probs[0]))]


def test_mask_level_methods_equal_their_authors_code_on_literal_values():
    cls, masks = CLASS_LOGITS[0].tolist(), MASK_LOGITS[0].tolist()
    semseg = authors_semseg(cls, masks)
    # RbA (support.py get_RbA): -semseg.tanh().sum(dim=0)
    expected_rba = [[-sum(math.tanh(semseg[c][i][j]) for c in range(3)) for j in range(2)] for i in range(2)]
    # Mask2Anomaly (semantic_inference, then anomaly_inference.py): keep queries whose top class is not "no object",
    # with probability > 0.95 and a class in the trusted set (here {1}); 1 - max over semseg and the kept masks
    # weighted by their probability; with more than one kept mask, zero where the max kept mask >= 0.5
    kept = []
    for q, row in enumerate(cls):
        probs = softmax_row(row)
        label = probs.index(max(probs))
        if label != 3 and max(probs) > 0.95 and label == 1:
            kept.append([[max(probs) * sigmoid(masks[q][i][j]) for j in range(2)] for i in range(2)])
    assert len(kept) == 2
    expected_m2a = [[(1 - max([semseg[c][i][j] for c in range(3)] + [k[i][j] for k in kept]))
                     * (0.0 if max(k[i][j] for k in kept) >= 0.5 else 1.0) for j in range(2)] for i in range(2)]
    # EAM (ood_detection_evaluation.py): 1 - Σ_q max(softmax[:-1]) σ(mask)
    expected_eam = [[1 - sum(max(softmax_row(cls[q])[:-1]) * sigmoid(masks[q][i][j]) for q in range(4))
                     for j in range(2)] for i in range(2)]

    scores = torch.einsum("nqc,nqhw->nchw", CLASS_LOGITS.softmax(-1)[..., :-1], MASK_LOGITS.sigmoid())
    torch.testing.assert_close(scores[0], torch.tensor(semseg))
    torch.testing.assert_close(rba(scores)[0], torch.tensor(expected_rba))
    got = mask_max_softmax(scores[0], CLASS_LOGITS[0].softmax(-1), MASK_LOGITS[0].sigmoid(), inlier_count=3,
                           refine_classes=(1,))
    torch.testing.assert_close(got, torch.tensor(expected_m2a))
    assert (got == 0).any() and (got != 0).any()  # the refinement bites on some pixels only
    torch.testing.assert_close(eam(CLASS_LOGITS.softmax(-1)[..., :-1], MASK_LOGITS.sigmoid())[0],
                               torch.tensor(expected_eam))
    assert -3 < min(min(r) for r in expected_rba) and max(max(r) for r in expected_rba) <= 0  # (-K, 0]


def test_mask_max_softmax_refines_with_more_than_one_kept_mask_only():
    """As in the authors' code, one kept mask joins the maximum but zeroes nothing: here query 0 alone is kept, and
    its mask is at least 0.5 at pixel (0, 0), which keeps 1 - the maximum there."""
    cls, masks = CLASS_LOGITS[0, [0, 2, 3]], MASK_LOGITS[0, [0, 2, 3]]
    semseg = authors_semseg(cls.tolist(), masks.tolist())
    top = max(softmax_row(cls[0].tolist()))
    kept = [[top * sigmoid(masks[0, i, j].item()) for j in range(2)] for i in range(2)]
    assert kept[0][0] >= 0.5
    expected = [[1 - max([semseg[c][i][j] for c in range(3)] + [kept[i][j]]) for j in range(2)] for i in range(2)]
    scores = torch.einsum("qc,qhw->chw", cls.softmax(-1)[..., :-1], masks.sigmoid())
    got = mask_max_softmax(scores, cls.softmax(-1), masks.sigmoid(), inlier_count=3, refine_classes=(1,))
    torch.testing.assert_close(got, torch.tensor(expected))
    assert (got != 0).all()


def test_mask_level_methods_score_a_mask2former_as_its_authors_code(mask2former):
    images = frames(2, 64, 96)
    model = hf_model(mask2former, Mask2FormerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD))
    methods = [get_method("rba"), get_method("mask_max_softmax", refine_classes=(0, 1, 2, 3), min_score=0.0),
               get_method("eam")]
    batch = score_batch(model, preprocess(images), methods)
    with torch.no_grad():
        out = mask2former(pixel_values=processed(Mask2FormerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD),
                                                 images))
    for n in range(2):  # the authors' steps, image by image, on the network's raw outputs
        mask_cls, mask_pred = out.class_queries_logits[n], out.masks_queries_logits[n]
        mask_pred = F.interpolate(mask_pred[None], size=(64, 96), mode="bilinear", align_corners=False)[0]
        semseg = torch.einsum("qc,qhw->chw", F.softmax(mask_cls, dim=-1)[..., :-1], mask_pred.sigmoid())
        torch.testing.assert_close(batch.scores[0][n], -semseg.tanh().sum(dim=0), atol=1e-5, rtol=1e-5)
        top, labels = F.softmax(mask_cls, dim=-1).max(-1)
        keep = labels.ne(4) & (top > 0.0) & (labels < 4) & (labels >= 0)
        kept = top[keep].view(-1, 1, 1) * mask_pred.sigmoid()[keep]
        expected = 1 - torch.max(torch.cat((semseg, kept)), dim=0)[0]
        if kept.shape[0] > 1:
            expected = expected * (1 - (torch.max(kept, dim=0)[0] >= 0.5).float())
        torch.testing.assert_close(batch.scores[1][n], expected, atol=1e-5, rtol=1e-5)
        max_p = mask_cls.softmax(-1)[..., :-1].max(1)[0]
        torch.testing.assert_close(batch.scores[2][n], 1 - (mask_pred.sigmoid() * max_p.view(-1, 1, 1)).sum(0),
                                   atol=1e-5, rtol=1e-5)


def test_mask_level_methods_refuse_networks_without_query_outputs(mask2former):
    x = preprocess(frames(1, 64, 64))
    for model in (hf_model(tiny_segformer()), build_model("pspnet", "resnet18").eval()):
        for name in MASK_METHODS:
            with pytest.raises(ValueError, match=f"{name} needs a mask-classification network's .*Load a "
                                                 "Mask2Former or EoMT network"):
                score_batch(model, x, [get_method(name)])
    own = hf_model(mask2former)  # 4 classes of its own, no class map: Cityscapes' refinement classes mean nothing
    with pytest.raises(ValueError, match="mask_max_softmax refines with Cityscapes' stuff classes .* predicts 4 "
                                         "classes of its own"):  # (they were taken as its own indices 2..10)
        score_batch(own, x, [get_method("mask_max_softmax")])
    assert score_batch(own, x, [get_method("mask_max_softmax", refine=False)]).scores[0].shape == (1, 64, 64)
    sliding = hf_model(mask2former, inference="slide", crop=(64, 64), stride=(32, 32))
    for name in ("mask_max_softmax", "eam"):
        with pytest.raises(ValueError, match="Sliding-window inference .* keeps no queries"):
            score_batch(sliding, x, [get_method(name)])
    assert score_batch(sliding, preprocess(frames(1, 64, 128)), [get_method("rba")]).scores[0].shape == (1, 64, 128)


def test_pixel_level_methods_run_on_a_mask_networks_semantic_scores():
    network = tiny_mask2former(list(CLASS_NAMES))
    model = hf_model(network)
    x = preprocess(frames(2, 64, 64))
    sml = get_method("sml").fit(model, [{"image": frames(2, 64, 64, seed=1)}])
    methods = [get_method(n) for n in PIXEL_METHODS] + [sml] + [get_method(n) for n in MASK_METHODS]
    batch = score_batch(model, x, methods)
    for method, scores in zip(methods, batch.scores):
        assert scores.shape == (2, 64, 64) and torch.isfinite(scores).all(), method.name
    torch.testing.assert_close(batch.scores[0], 1 - batch.output.logits.softmax(dim=1).amax(dim=1))


# command line and Python API


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    return mixed_noise_sets(tmp_path_factory.mktemp("adapters"))


def test_evaluate_a_transformers_folder_from_the_command_line_and_the_api(sets, tmp_path):
    tiny_mask2former(list(CLASS_NAMES)).save_pretrained(tmp_path / "m2f")
    Mask2FormerImageProcessor(image_mean=OWN_MEAN, image_std=OWN_STD).save_pretrained(tmp_path / "m2f")
    assert main(["evaluate", "--model-type", "hf", "--model", str(tmp_path / "m2f"), "--class-map", "cityscapes",
                 "--sets", str(sets / "perlin_mixed.h5"), "--methods", "rba", "eam", "max_logit",
                 "--out", str(tmp_path / "run"), "--resamples", "0", "--quiet"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(results["methods"]) == {"rba", "eam", "max_logit"}
    assert run["model"]["adapter"] == "HFMaskClassification" and run["model"]["inference"] == "whole"
    assert len(run["model"]["class_indices"]) == 19
    model = load_library_model("hf", tmp_path / "m2f", classes="cityscapes")
    evaluate(model, [sets / "perlin_mixed.h5"], ["rba", "eam", "max_logit"], tmp_path / "api", progress=False,
             figures=False)
    doc = json.loads((tmp_path / "api" / "results.json").read_text())
    assert doc["model"] == results["model"]
    for name in ("rba", "eam", "max_logit"):
        assert doc["results"][name]["perlin_mixed"]["pooled"] == results["results"][name]["perlin_mixed"]["pooled"]
    assert main(["evaluate", "--model-type", "hf", "--model", str(tmp_path / "m2f"), "--inference", "slide",
                 "--window", "32", "32", "--sets", str(sets / "perlin_mixed.h5"), "--methods", "eam",
                 "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert main(["evaluate", "--model", str(tmp_path / "m2f"), "--sets", str(sets / "perlin_mixed.h5"),
                 "--out", str(tmp_path / "bad2"), "--quiet"]) == 2


PLUGIN = '''
import torch
from segood.models.adapters import LibraryModel, register_model_type
from segood.models.network import SegOutput

class OneByOne(LibraryModel):
    def num_network_classes(self):
        return self.module.out_channels

    def network_output(self, x):
        return SegOutput(self.module(x), None)

@register_model_type(name="one_by_one")
def load_one_by_one(path, **options):
    module = torch.nn.Conv2d(3, 19, 1)
    module.load_state_dict(torch.load(path, weights_only=True))
    return OneByOne(module, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), multiple=1, **options)
'''


def test_a_registered_loader_from_the_command_line(sets, tmp_path, monkeypatch, capsys):
    """``--model-type MODULE:NAME`` imports the module that registers NAME (docs/models.md's recipe), found in the
    current folder; a name nobody registered is an error that says how to register one."""
    import sys

    from segood.models import MODEL_TYPES

    (tmp_path / "one_by_one_plugin.py").write_text(PLUGIN)
    torch.save(torch.nn.Conv2d(3, 19, 1).state_dict(), tmp_path / "net.pt")
    monkeypatch.chdir(tmp_path)
    try:
        args = ["evaluate", "--model", "net.pt", "--sets", str(sets / "perlin_mixed.h5"), "--methods", "max_logit",
                "--resamples", "0", "--quiet"]
        assert main(args[:1] + ["--model-type", "one_by_one", "--out", "bad"] + args[1:]) == 2
        assert "no model type 'one_by_one' is registered" in capsys.readouterr().err
        assert main(args[:1] + ["--model-type", "one_by_one_plugin:one_by_one", "--out", "run"] + args[1:]) == 0
        run = json.loads((tmp_path / "run" / "run.json").read_text())
        assert run["model"]["adapter"] == "OneByOne"
        assert main(args[:1] + ["--model-type", "no_such_plugin:x", "--out", "bad"] + args[1:]) == 2
        assert "no module 'no_such_plugin' in the current folder" in capsys.readouterr().err
        # an error in the user's own code is located there; SEGOOD_TRACEBACK=1 gives its traceback instead
        torch.save(torch.nn.Conv2d(3, 5, 1).state_dict(), tmp_path / "net.pt")  # (load_state_dict: size mismatch)
        assert main(args[:1] + ["--model-type", "one_by_one_plugin:one_by_one", "--out", "bad"] + args[1:]) == 2
        line = PLUGIN.splitlines().index("    module.load_state_dict(torch.load(path, weights_only=True))") + 1
        assert f"(raised at {tmp_path / 'one_by_one_plugin.py'}:{line}, in load_one_by_one; SEGOOD_TRACEBACK=1 " \
            "shows the whole traceback)" in capsys.readouterr().err
        monkeypatch.setenv("SEGOOD_TRACEBACK", "1")
        with pytest.raises(RuntimeError):
            main(args[:1] + ["--model-type", "one_by_one_plugin:one_by_one", "--out", "bad"] + args[1:])
        monkeypatch.delenv("SEGOOD_TRACEBACK")
        assert main(args[:1] + ["--model-type", "hf", "--out", "bad"] + args[1:]) == 2
        assert "raised at" not in capsys.readouterr().err  # (segood's and the libraries' own errors: their words)
    finally:
        MODEL_TYPES.pop("one_by_one", None)
        sys.modules.pop("one_by_one_plugin", None)


def test_library_options_without_a_library_network_are_named(tmp_path, capsys):
    """--window or --inference with a segood checkpoint: the options named, not "--model-type and --model go
    together", which the user gave neither of; an inference option of another mode names its flags."""
    argv = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(tmp_path / "s.h5"), "--out",
            str(tmp_path / "run")]
    assert main([*argv, "--inference", "slide", "--window", "16", "32"]) == 2
    assert capsys.readouterr().err == ("segood evaluate: error: --window, --inference set up a library's network "
                                       "(--model-type and --model); a segood checkpoint or an smp state dict takes "
                                       "none: drop them\n")
    assert main(["evaluate", "--window", "16", "32", "--sets", str(tmp_path / "s.h5"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.endswith("(--model-type and --model); add --model-type and --model\n")
    assert main(["evaluate", "--model-type", "hf", "--sets", str(tmp_path / "s.h5"), "--out", str(tmp_path)]) == 2
    assert "--model-type and --model go together" in capsys.readouterr().err
    assert main(["evaluate", "--sets", str(tmp_path / "s.h5"), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.endswith("give the network: --checkpoint (segood's), --arch, --encoder and --weights "
                                            "(a plain smp state dict), or --model-type and --model (another "
                                            "library's), or --scorer MODULE:FUNCTION (scores computed by your own "
                                            "code)\n")
    assert main(["export", "--sets", str(tmp_path / "s.h5"), "--methods", "energy", "--out", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err.endswith("or --model-type and --model (another library's)\n")
    from segood.models.inference import check_inference

    with pytest.raises(ValueError, match=r"^size=\(H, W\) \(--infer-size H W\) is the resize mode's network size; "
                                         r"inference mode 'whole' takes none: drop it, or choose mode='resize' "
                                         r"\(--inference resize\)$"):
        check_inference("whole", size=(16, 32))
    with pytest.raises(ValueError, match=r"network size, two positive sides; got \(0, 32\)$"):
        check_inference("resize", size=(0, 32))
    with pytest.raises(ValueError, match=r"^crop and stride \(--window, --stride\) set the sliding window; "
                                         r"inference mode 'resize' takes none"):
        check_inference("resize", size=(16, 32), crop=(8, 8))
    for bad in ("cuda 1", "cuda:01", "CUDA", ""):  # argparse's one-line usage error, before torch is asked
        with pytest.raises(SystemExit):
            main([*argv, "--device", bad])
        assert capsys.readouterr().err.endswith("segood evaluate: error: argument --device: must be a device such as "
                                                f"cpu, cuda or cuda:1, got {bad}\n")
    from segood.arguments import device

    assert [device(name) for name in ("cpu", "xla:0", "privateuseone")] == ["cpu", "xla:0", "privateuseone"]
    absent = [name for name, there in (("cuda", torch.cuda.is_available()), ("mps", torch.backends.mps.is_available()),
                                       ("xpu", torch.xpu.is_available())) if not there]
    for name in absent:  # (torch's other device types pass to torch)
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{name}: this machine has no {name} device torch can "
                                                             "use; use cpu, or run where there is one$"):
            device(name)
    with pytest.raises(argparse.ArgumentTypeError, match="^gpu: torch knows no such device; use cpu, cuda, cuda:1"):
        device("gpu")
    with pytest.raises(argparse.ArgumentTypeError, match="^meta: the meta device holds no data to score"):
        device("meta")
    with pytest.raises(ValueError, match=r"^device \(--device\) gpu: torch knows no such device"):
        evaluate(torch.nn.Conv2d(3, 19, 1), [tmp_path / "s.h5"], ["energy"], device="gpu")
