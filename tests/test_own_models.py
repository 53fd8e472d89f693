"""Users' own models and maps: logits of any resolution and any number of classes, callables that return scores
themselves, score maps submitted in every layout, and sets matched to the benchmark's by content."""

import copy
import json
import sys
import warnings

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset, set_identity
from segood.evaluation import evaluate, evaluate_score_maps
from segood.evaluation.exchange import export_scores
from segood.evaluation.options import EvaluateOptions
from segood.evaluation.runner import run
from segood.leaderboard import leaderboard, make_benchmark, submit
from segood.methods import Scorer, get_method
from segood.methods.functional import entropy_from_logits
from segood.methods.tuning import tune
from segood.models.miou import evaluate_miou
from segood.methods.schedule import score_batch, score_frames
from segood.metrics import make_accumulator
from segood.models import ExternalModel, build_model, preprocess
from segood.models.external import as_network


class QuarterNet(torch.nn.Module):
    """A head before its final resize: logits at 1/4 of the input, as mmseg and detectron2 heads give them.
    ``upsample``: resize them itself, with that ``align_corners`` (the reference)."""

    def __init__(self, classes=19, upsample=None):
        super().__init__()
        torch.manual_seed(0)  # every QuarterNet of a class count has the same weights
        self.features = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.classifier = torch.nn.Conv2d(8, classes, 1)
        self.upsample = upsample

    def forward(self, x):
        logits = self.classifier(torch.relu(self.features(x)))
        if self.upsample is not None:
            logits = F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=self.upsample)
        return logits


@pytest.fixture(scope="module")
def sets(noise_sets):
    root = noise_sets()
    return {"perlin_mixed": root / "perlin_mixed.h5", "normal_mixed": root / "normal_mixed.h5", "cs": root / "cs.h5"}


def frames(path, count=2):
    dataset = H5SegmentationDataset(path)
    return torch.stack([dataset[i]["image"] for i in range(count)])


# logits of any resolution


@pytest.mark.parametrize("align_corners", [False, True])
def test_quarter_resolution_logits_score_as_the_explicitly_upsampled_ones(sets, align_corners):
    x = preprocess(frames(sets["perlin_mixed"]))
    methods = [get_method(n) for n in ("max_softmax", "entropy", "max_logit", "energy")] + [
        get_method("odin", temperature=10, epsilon=0.002)]  # a perturbing method: its objective on the frame too
    low = score_batch(ExternalModel(QuarterNet(), align_corners=align_corners), x, methods)
    upsampled = score_batch(ExternalModel(QuarterNet(upsample=align_corners)), x, methods)
    assert low.resized and not upsampled.resized
    assert low.output.logits.shape[-2:] == x.shape[-2:] and torch.equal(low.classes, upsampled.classes)
    for got, want in zip(low.scores, upsampled.scores):
        assert torch.equal(got, want)
    other = score_batch(ExternalModel(QuarterNet(), align_corners=not align_corners), x, methods[:1]).scores[0]
    assert not torch.equal(other, low.scores[0])  # the option is the library's choice, and it matters


def test_a_quarter_resolution_model_evaluates_as_its_upsampled_self(sets, tmp_path):
    """Every method, the fitted ones too (sml's statistics of frame-sized logits, Mahalanobis on the 1/4 features),
    equals the run of the model that upsamples its own logits."""
    chosen = lambda: ["max_softmax", "entropy", "energy", get_method("sml"), get_method("mahalanobis")]  # noqa: E731
    options = {"fit_set": sets["cs"], "feature_layer": "features", "progress": False, "figures": False}
    low = evaluate(QuarterNet(), {"perlin_mixed": sets["perlin_mixed"]}, chosen(), tmp_path / "low", **options)
    upsampled = evaluate(QuarterNet(upsample=False), {"perlin_mixed": sets["perlin_mixed"]}, chosen(),
                         tmp_path / "up", **options)
    assert low["results"] == upsampled["results"]
    assert low["per_class_mean_score"] == upsampled["per_class_mean_score"]
    assert "resized to them bilinearly (align_corners=False)" in low["notes"][0] and upsampled["notes"] == []
    assert low["notes"][0] in (tmp_path / "low" / "results.md").read_text()
    again = evaluate(QuarterNet(), {"perlin_mixed": sets["perlin_mixed"]}, chosen(), tmp_path / "low_ac",
                     align_corners=True, **options)
    assert again["model"]["align_corners"] is True and "align_corners=True" in again["notes"][0]
    assert again["results"]["entropy"] != low["results"]["entropy"]
    with pytest.raises(ValueError, match="a segood network gives them at the frame's size"):
        evaluate(build_model("pspnet", "resnet18"), [sets["cs"]], ["entropy"], tmp_path / "net", align_corners=True)


class Returns(torch.nn.Module):
    """A network whose output is ``make(logits)`` of QuarterNet's upsampled logits."""

    def __init__(self, make):
        super().__init__()
        self.net, self.make = QuarterNet(upsample=False), make

    def forward(self, x):
        return self.make(self.net(x))


def test_the_logits_of_real_decoders_pass_and_channels_last_ones_do_not():
    """Low-resolution logits as networks give them on odd frames (BEiT: floor(H / 16) x 4; stride-32 features
    upsampled 8x; ceil at stride 32), and logit maps no stride gives (channels last, of square frames too,
    transposed, padded)."""
    from segood.models.network import check_resolution

    for logits, frame in [((268, 480), (1080, 1920)), ((148, 200), (600, 800)), ((184, 320), (720, 1280)),
                          ((272, 480), (1080, 1920)), ((2, 3), (33, 65)), ((368, 640), (720, 1280)),
                          ((1, 2), (32, 33)), ((23, 40), (720, 1280)), ((128, 256), (1024, 2048))]:
        check_resolution((1, 19, *logits), frame)
    for logits, frame, said in [((1024, 19), (2048, 1024), "no .* map"), ((512, 256), (1024, 2048), "no .* map"),
                                ((16, 19), (64, 64), "no .* map"), ((16, 19), (512, 512), "no .* map"),
                                ((128, 150), (512, 512), "no .* map"), ((128, 150), (1024, 1024), "no .* map"),
                                ((2048, 19), (1024, 2048), "larger than"), ((1088, 1920), (1080, 1920), "larger than")]:
        with pytest.raises(ValueError, match=said):
            check_resolution((1, 19, *logits), frame)


@pytest.mark.parametrize("make, message", [
    (lambda t: t.permute(0, 2, 3, 1), r"logits are \(2, 64, 64, 19\), which is no \(N, C, h, w\) map of the 64x64"),
    (lambda t: t[..., :16, :].transpose(-1, -2), r"logits are \(2, 19, 64, 16\), which is no .* map of the 64x64"),
    (lambda t: F.pad(t, (0, 8, 0, 8)), r"logits are \(2, 19, 72, 72\), larger than the 64x64 input: crop them"),
    (lambda t: t[..., ::4, ::16], r"logits are \(2, 19, 16, 4\).*channels last\?"),  # (strides 4 and 16)
    (lambda t: None, r"gave a NoneType for 2 frames; segood takes float logits \(N, C, h, w\)"),
    (lambda t: t.numpy(), "gave a ndarray"),
    (lambda t: t[0], r"gave a tensor of shape \(19, 64, 64\) and dtype torch.float32 for 2 frames"),
    (lambda t: t.argmax(1, keepdim=True), "dtype torch.int64"),
    (lambda t: {}, "gave a dict")])
def test_what_is_no_logits_map_of_the_frame_is_refused_not_resized(make, message):
    x = preprocess(torch.zeros(2, 3, 64, 64, dtype=torch.uint8))
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        score_batch(ExternalModel(Returns(make)), x, [get_method("max_softmax")])
    for ok in (lambda t: t[..., ::4, ::4], lambda t: t[..., ::22, ::32], lambda t: {"out": t}, lambda t: (t, None)):
        with torch.no_grad():  # stride 4; 3 x 2 (each within one of 64 / s for s in [21.3, 32]): resized
            score_batch(ExternalModel(Returns(ok)), x, [get_method("max_softmax")])


def test_a_model_in_training_mode_is_scored_fitted_and_evaluated_in_eval_mode_and_left_as_it_was(sets, tmp_path):
    """Dropout off and batch norm on its running statistics while scored, whatever mode the caller left it in;
    each module back in its own mode after (a model evaluated from within a training loop trains on)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Dropout2d(0.5),
                                torch.nn.Conv2d(8, 19, 1))
    model.train()
    model[1].eval()  # (a frozen batch norm: its own mode, restored too)
    running = model[1].running_mean.clone()
    x = preprocess(frames(sets["cs"]))
    reference = copy.deepcopy(model).eval()
    energy = get_method("energy")
    for scores in (energy.score(model, x)[0], energy(model, frames(sets["cs"]))):
        torch.testing.assert_close(scores, energy.score(reference, x)[0])
    mixed = H5SegmentationDataset(sets["perlin_mixed"])
    loader = [{"image": frames(sets["perlin_mixed"]), "ood_mask": torch.stack([mixed[i]["ood_mask"] for i in (0, 1)])}]
    assert get_method("sml").fit(model, loader).state["means"].equal(get_method("sml").fit(reference, loader).state[
        "means"])
    data = {"cs": sets["cs"]}
    doc = evaluate(model, data, ["energy"], progress=False, figures=False)
    assert doc["results"] == evaluate(reference, data, ["energy"], progress=False, figures=False)["results"]
    export_scores(model, data, ["energy"], tmp_path / "maps", progress=False)
    tuned = tune("odin", model, loader, {"temperature": [1.0, 10.0]}, tuning_set=sets["perlin_mixed"], progress=False)
    assert tuned.table == tune("odin", reference, loader, {"temperature": [1.0, 10.0]},
                               tuning_set=sets["perlin_mixed"], progress=False).table
    evaluate_miou(as_network(model), sets["cs"], progress=False)
    assert [m.training for m in model.modules()] == [True, True, False, True, True]
    assert torch.equal(model[1].running_mean, running)


class Stages(torch.nn.Module):
    """An encoder that returns the outputs of its stages (as smp's and timm's do)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.ModuleList([torch.nn.Conv2d(3, 4, 1)])

    def forward(self, x):
        return [self.encoder[0](x)]


def test_a_feature_layer_that_gives_no_one_feature_map_is_named():
    network = torch.nn.Sequential()
    network.add_module("encoder", Stages())
    network.add_module("head", torch.nn.Conv2d(4, 19, 1))
    network.forward = lambda x: network.head(network.encoder(x)[0])
    x = preprocess(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="feature layer 'encoder' gives a list; Mahalanobis needs one whose output is "
                                         r"one \(N, D, h, w\) feature map"):
        ExternalModel(network, "encoder").penultimate(x)
    assert ExternalModel(network, "encoder.encoder.0").penultimate(x).shape == (1, 4, 32, 32)
    with pytest.raises(ValueError, match=r"no layer 'encoder.encoder.1' in the model \(dict\(model.named_modules\(\)\) "
                                         r"names its 4 layers\); the closest: 'encoder.encoder.0', 'encoder.encoder'"):
        ExternalModel(network, "encoder.encoder.1")
    with pytest.raises(ValueError, match=r"mahalanobis needs features: .*feature_layer=NAME .*its top-level ones: "
                                         r"'encoder', 'head'\)"):
        get_method("mahalanobis").check(ExternalModel(network))


def test_a_network_in_float64_is_fed_float64(sets, tmp_path):
    data = {"perlin_mixed": sets["perlin_mixed"]}
    double = evaluate(QuarterNet(upsample=False).double(), data, ["energy"], progress=False, figures=False)
    single = evaluate(QuarterNet(upsample=False), data, ["energy"], progress=False, figures=False)
    assert double["results"]["energy"]["perlin_mixed"]["pooled"] == pytest.approx(
        single["results"]["energy"]["perlin_mixed"]["pooled"], abs=1e-3)


def test_probabilities_given_as_logits_are_said_once(sets, tmp_path):
    data = {"perlin_mixed": sets["perlin_mixed"]}
    with pytest.warns(UserWarning, match=r"outputs lie in \[0, 1\] and sum to 1 over its classes: probabilities, not "
                                         "logits\?") as caught:
        doc = evaluate(Returns(lambda t: t.softmax(dim=1)), data, ["max_logit"], tmp_path / "soft", progress=False,
                       figures=False, batch_size=1)
    assert sum("probabilities, not logits" in str(w.message) for w in caught) == 1  # (the first batch only)
    assert any("probabilities, not logits" in note for note in doc["notes"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*probabilities, not logits")
        doc = evaluate(Returns(lambda t: t), data, ["max_logit"], tmp_path / "logits", progress=False, figures=False)
    assert not any("probabilities" in note for note in doc["notes"])


class Parameterless(torch.nn.Module):
    """Logits that are a fixed function of the frame: a network with no parameter and no buffer."""

    def forward(self, x):
        return x.mean(dim=1, keepdim=True) * torch.linspace(-1, 1, 19).view(1, 19, 1, 1)


def test_a_network_without_parameters_runs_on_the_cpu(sets, tmp_path):
    data = {"perlin_mixed": sets["perlin_mixed"]}
    doc = evaluate(Parameterless(), data, ["max_logit"], tmp_path / "run", progress=False, figures=False)
    written = export_scores(Parameterless(), data, ["max_logit"], tmp_path / "maps", progress=False)
    maps = evaluate_score_maps(written["max_logit", "perlin_mixed"], sets["perlin_mixed"], tmp_path / "scored",
                               name="max_logit", figures=False)
    assert maps["results"]["max_logit"]["perlin_mixed"]["pooled"] == doc["results"]["max_logit"]["perlin_mixed"][
        "pooled"]


def test_align_corners_and_class_count_from_the_command_line(sets, tmp_path, capsys):
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    torch.save(smp.create_model("fpn", encoder_name="resnet18", encoder_weights=None, classes=5).state_dict(),
               tmp_path / "fpn.pt")
    assert main(["evaluate", "--arch", "fpn", "--encoder", "resnet18", "--weights", str(tmp_path / "fpn.pt"),
                 "--num-classes", "5", "--align-corners", "--sets", str(sets["cs"]), "--methods", "entropy",
                 "--out", str(tmp_path / "run"), "--resamples", "0", "--quiet"]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["model"]["align_corners"] is True
    assert "The model predicts 5 classes" in json.loads((tmp_path / "run" / "results.json").read_text())["notes"][0]
    for given, dropped in [(["--checkpoint", "m.pt", "--arch", "fpn", "--num-classes", "5"], "--arch, --num-classes"),
                           (["--model-type", "smp", "--model", "m", "--num-classes", "5"], "--num-classes")]:
        # (they were ignored: a checkpoint's network was evaluated as though they applied)
        assert main(["evaluate", *given, "--sets", str(sets["cs"]), "--out", str(tmp_path / "no")]) == 2
        assert f"drop {dropped}" in capsys.readouterr().err
    (tmp_path / "five.json").write_text("5")  # (a traceback; null meant no mapping)
    assert main(["evaluate", "--model-type", "smp", "--model", "m", "--class-map", str(tmp_path / "five.json"),
                 "--sets", str(sets["cs"]), "--out", str(tmp_path / "no")]) == 2
    assert "five.json holds 5: give a JSON list (the network's class per Cityscapes trainId) or a dict" in \
        capsys.readouterr().err
    for length in (18, 20):  # (accepted, it scored another set of classes than the 19 the option names)
        (tmp_path / "short.json").write_text(json.dumps(list(range(length))))
        assert main(["evaluate", "--model-type", "smp", "--model", "m", "--class-map", str(tmp_path / "short.json"),
                     "--sets", str(sets["cs"]), "--out", str(tmp_path / "no")]) == 2
        assert capsys.readouterr().err == (f"segood evaluate: error: --class-map {tmp_path / 'short.json'} lists "
                                           f"{length} classes: give the network's class for each of the 19 Cityscapes "
                                           "trainIds, in their order (or a dict {Cityscapes class: network class})\n")


# any number of classes


def test_other_classes_run_every_method_that_needs_no_class_mapping(sets, tmp_path):
    model = QuarterNet(classes=5)
    doc = evaluate(model, {"perlin_mixed": sets["perlin_mixed"], "cs": sets["cs"]}, None, tmp_path / "run",
                   progress=False)
    assert set(doc["results"]) == {"max_softmax", "odin", "entropy", "max_logit", "energy"}
    reference = make_accumulator()  # entropy over the 5 classes, normalised by log 5, of the upsampled logits
    for batch in torch.utils.data.DataLoader(H5SegmentationDataset(sets["perlin_mixed"]), batch_size=2):
        x = preprocess(batch["image"])  # in the run's batches: a convolution's sums depend on the batch size
        with torch.no_grad():
            logits = F.interpolate(model(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        reference.update(entropy_from_logits(logits), batch["ood_mask"])
    assert doc["results"]["entropy"]["perlin_mixed"]["pooled"]["auroc"] == reference.compute()["auroc"]
    note = "The model predicts 5 classes, not the sets' 19 Cityscapes trainIds"
    assert any(n.startswith(note) for n in doc["notes"]) and note in (tmp_path / "run" / "results.md").read_text()
    assert doc["per_class_mean_score"]["entropy"]["cs"]["road"] is not None  # over the sets' own labels
    assert (tmp_path / "run" / "figures" / "examples_cs.png").exists()
    segood_network = evaluate(build_model("pspnet", "resnet18", 5).eval(), [sets["cs"]], ["max_logit"],
                              tmp_path / "net", progress=False, figures=False)
    assert any(n.startswith(note) for n in segood_network["notes"])
    with pytest.raises(ValueError, match="mahalanobis models the features of each class .* predicts 5 classes"):
        evaluate(model, [sets["cs"]], ["mahalanobis"], tmp_path / "maha", progress=False, fit_set=sets["cs"],
                 feature_layer="features")


@pytest.mark.parametrize("classes", [19, 5])
def test_segmentation_quality_only_where_the_classes_are_the_sets(sets, tmp_path, classes):
    ev = run(ExternalModel(QuarterNet(classes)), {"cs": sets["cs"]}, [get_method("entropy")], tmp_path,
             EvaluateOptions(progress=False), quality=True)
    assert (ev.confusion["cs"].sum() > 0) == (classes == 19)
    assert ev.probabilities.tensor is None  # (the softmax's memory is the run's, not kept with its result)
    assert any("segmentation quality (mIoU, confusion, calibration) is not computed" in n
               for n in ev.notes()) == (classes != 19)


# scorer callables


def darkness(images):
    """Darker pixels are more anomalous: minus R + 2 G + 4 B (exact in float64; the weights tell the channels
    apart, so that another channel order scores otherwise)."""
    return -(images.double() * torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)[:, None, None]).sum(dim=1)


def darkness_of_one(image):
    """The same for one (H, W, 3) RGB image, as SegmentMeIfYouCan's loop calls a method."""
    return -(image.astype(np.float64) * [1.0, 2.0, 4.0]).sum(axis=2)


def test_a_scorer_equals_its_maps_scored_from_a_file(sets, tmp_path):
    path = sets["perlin_mixed"]
    doc = evaluate(Scorer(darkness), {"perlin_mixed": path}, out_dir=tmp_path / "run", progress=False, figures=False)
    dataset = H5SegmentationDataset(path)
    with h5py.File(tmp_path / "maps.h5", "w") as f:
        for item in dataset:
            f[item["frame_id"]] = darkness(item["image"][None])[0].numpy()
    maps = evaluate_score_maps(tmp_path / "maps.h5", path, tmp_path / "maps", name="darkness", figures=False)
    assert doc["results"]["darkness"]["perlin_mixed"]["pooled"] == maps["results"]["darkness"]["perlin_mixed"]["pooled"]
    assert doc["results"]["darkness"]["perlin_mixed"]["per_image_mean"] == \
        maps["results"]["darkness"]["perlin_mixed"]["per_image_mean"]
    assert doc["results"]["darkness"]["perlin_mixed"]["pooled"]["auroc"] is not None
    assert doc["model"] == {"scorer": "test_own_models:darkness", "per_image": False}
    one = evaluate(Scorer(darkness_of_one, per_image=True, name="darkness"), {"perlin_mixed": path},
                   out_dir=tmp_path / "one", progress=False, figures=False)
    assert one["results"] == doc["results"]
    with pytest.raises(ValueError, match="scorer darkness is its own method"):
        evaluate(Scorer(darkness), [path], ["entropy"], tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="fit_set set up a network"):
        evaluate(Scorer(darkness), [path], out_dir=tmp_path / "x", fit_set=sets["cs"], progress=False)
    with pytest.raises(TypeError, match="not a torch nn.Module; .* evaluated as segood.Scorer"):
        evaluate(darkness, [path], out_dir=tmp_path / "x", progress=False)
    with pytest.raises(TypeError, match=r"model is a path \(m.pt\), not a network: .*load_model\(path\)\[0\]"):
        evaluate("m.pt", [path], out_dir=tmp_path / "x", progress=False)


def saturated(images):
    """+inf everywhere: every score ties at the top (a threshold above them all is +inf)."""
    return torch.full(images.shape[:1] + images.shape[2:], float("inf"))


def test_scores_that_all_tie_at_inf_are_reported(sets, tmp_path):
    doc = evaluate(Scorer(saturated), [sets["perlin_mixed"]], out_dir=tmp_path / "run", progress=False, figures=False)
    pooled = doc["results"]["saturated"]["perlin_mixed"]["pooled"]  # (the report crashed writing inf into JSON)
    assert pooled["auroc"] == 0.5 and pooled["fpr95"] == 1.0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["results"]["saturated"]["perlin_mixed"][
        "pooled"]["auroc"] == 0.5


def test_a_scorer_gets_contiguous_frames_whatever_their_layout():
    seen = []

    def fn(images):
        seen.append(images.is_contiguous())
        return darkness(images)

    scorer = Scorer(fn, name="dark")  # (a device's batches from the readers are channels last)
    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    scored = score_frames(scorer, images, [scorer])
    assert seen == [True] and torch.equal(scored.scores[0], darkness(images.contiguous()))


BAD_SCORERS = {
    "shape": (lambda images: images.double().mean(dim=1)[:, ::4, ::4],
              r"perlin_mixed: frames \[0, 1\]: scorer bad returned scores of shape \(2, 16, 16\) for the batch; "
              r"expected \(2, 64, 64\)"),
    "nan": (lambda images: torch.full((len(images), 64, 64), float("nan")),
            r"8192 NaN scores for the batch \(images \[0, 1\] of the batch\)"),
    "mask": (lambda images: images[:, 0] > 128, "not a mask"),
    "list": (lambda images: images.tolist(), "returned a list for the batch"),
    "strings": (lambda images: np.full((len(images), 64, 64), "x"), "returned <U1 scores"),
    "raises": (lambda images: 1 / 0, r"perlin_mixed: frames \[0, 1\]: scorer test_own_models:<lambda> raised "
                                     r"ZeroDivisionError on the batch: division by zero"),
    "signature": (lambda images, extra: images, r"scorer test_own_models:<lambda> raised TypeError on the batch: "
                                                r".*missing 1 required positional argument: 'extra'"),
}


@pytest.mark.parametrize("case", BAD_SCORERS)
def test_a_bad_scorer_output_is_named(sets, tmp_path, case):
    fn, message = BAD_SCORERS[case]
    with pytest.raises(ValueError, match=message):
        evaluate(Scorer(fn, name="bad"), [sets["perlin_mixed"]], out_dir=tmp_path, progress=False)


def test_a_scorer_from_the_command_line(sets, tmp_path, monkeypatch, capsys):
    (tmp_path / "own_scorer_module.py").write_text(
        "def anomaly(images):\n    return -images.double().sum(dim=1)\n\nthreshold = 3\n\n"
        "def lookup(image):\n    return {}['x']\n\ndef strict(images):\n    raise ValueError('no such frames here')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the current folder
    monkeypatch.delitem(sys.modules, "own_scorer_module", raising=False)
    common = ["--sets", str(sets["perlin_mixed"]), "--resamples", "0", "--quiet"]
    assert main(["evaluate", "--scorer", "own_scorer_module:anomaly", "--scorer-name", "mine", "--out", "run",
                 *common]) == 0
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert list(doc["results"]) == ["mine"]
    assert doc["methods"]["mine"]["params"]["scorer"] == "own_scorer_module:anomaly"
    capsys.readouterr()
    for spec, extra, message in (
            ("no_such_module:anomaly", [], "no module 'no_such_module' in the current folder"),
            ("own_scorer_module:missing", [], "has no 'missing'; its functions: anomaly"),
            ("own_scorer_module:threshold", [], "threshold is not callable (int)"),
            ("own_scorer_module", [], "write MODULE:FUNCTION"),
            ("own_scorer_module:anomaly", ["--methods", "entropy"], "drop --methods"),
            ("own_scorer_module:lookup", ["--per-image"], "scorer own_scorer_module:lookup raised KeyError on image 0 "
                                                          "of the batch: 'x'")):
        assert main(["evaluate", "--scorer", spec, *extra, "--out", "bad", *common]) == 2
        assert message in capsys.readouterr().err, spec
    assert main(["evaluate", "--scorer-name", "x", "--checkpoint", "m.pt", "--out", "bad", *common]) == 2
    assert "add --scorer MODULE:FUNCTION" in capsys.readouterr().err
    assert main(["evaluate", "--scorer", "own_scorer_module:strict", "--out", "bad", *common]) == 2
    assert "no such frames here (raised at " in capsys.readouterr().err  # (re-raised by segood "from None")


# submitting maps in every layout; sets matched by content


@pytest.fixture(scope="module")
def board_world(sets, tmp_path_factory):
    """An open benchmark over perlin_mixed, a private one over it, and entropy maps in every layout."""
    root = tmp_path_factory.mktemp("own_board")
    make_benchmark({"open": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc"}},
                   root / "open" / "bench.json")
    make_benchmark({"private": {"sets": {"perlin_mixed": sets["perlin_mixed"]}, "rank_by": "auroc",
                                "private": ["perlin_mixed"]}}, root / "private" / "bench.json")
    model = ExternalModel(QuarterNet()).eval()
    maps = {layout: export_scores(model, {"perlin_mixed": sets["perlin_mixed"]}, [get_method("entropy")],
                                  root / layout, layout=layout, progress=False)[("entropy", "perlin_mixed")]
            for layout in ("segood", "smiyc", "fishyscapes")}
    return root, model, maps


def test_maps_in_every_layout_enter_the_board_alike(sets, board_world, tmp_path):
    root, _, maps = board_world
    for layout, path in maps.items():
        submit(None, tmp_path / "subs" / f"{layout}.zip", name=f"entropy {layout}",
               score_maps={"perlin_mixed": path}, data={"perlin_mixed": sets["perlin_mixed"]})
    board = leaderboard(tmp_path / "subs", root / "open" / "bench.json", tmp_path / "board")
    assert board["rejected"] == []
    entries = board["tracks"]["open"]["entries"]
    assert len(entries) == 3 and all(e["verified"] for e in entries)
    assert entries[0]["sets"] == entries[1]["sets"] == entries[2]["sets"]  # float16 maps of the same scores
    with pytest.raises(ValueError, match="named by the last part of each frame id: give the set they belong to"):
        submit(None, tmp_path / "x.zip", name="x", score_maps={"perlin_mixed": maps["smiyc"]})
    with pytest.raises(ValueError, match="without score maps"):
        submit(None, tmp_path / "x.zip", name="x", score_maps={"perlin_mixed": maps["segood"]},
               data={"other": sets["perlin_mixed"]})
    assert main(["submit", "--scores", f"perlin_mixed={maps['fishyscapes']}", "--data",
                 f"perlin_mixed={sets['perlin_mixed']}", "--method-name", "cli", "--out",
                 str(tmp_path / "cli" / "f.zip")]) == 0
    assert leaderboard(tmp_path / "cli", root / "open" / "bench.json", tmp_path / "b2")["rejected"] == []


def test_maps_of_the_public_copy_match_a_private_set_under_any_name(board_world, tmp_path):
    root, model, _ = board_world
    public = root / "private" / "perlin_mixed.public.h5"
    folder = export_scores(model, {"hidden": public}, [get_method("entropy")], tmp_path / "exp",
                           layout="fishyscapes", progress=False)[("entropy", "hidden")]
    submit(None, tmp_path / "subs" / "f.zip", name="F", score_maps={"hidden": folder}, data={"hidden": public})
    board = leaderboard(tmp_path / "subs", root / "private" / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and board["tracks"]["private"]["entries"][0]["verified"]


def test_the_board_matches_a_runs_sets_by_content_not_name(sets, board_world, tmp_path):
    root, _, _ = board_world
    bench = root / "open" / "bench.json"
    runs = {"renamed": {"pm": sets["perlin_mixed"]}, "other_content": {"perlin_mixed": sets["normal_mixed"]},
            "missing": {"nm": sets["normal_mixed"]}}
    for name, run_sets in runs.items():
        evaluate(QuarterNet(), run_sets, ["entropy"], tmp_path / name, progress=False, figures=False, bootstrap=None)
        submit(tmp_path / name, tmp_path / "subs" / f"{name}.zip", method="entropy", name=name)
    board = leaderboard(tmp_path / "subs", bench, tmp_path / "board")
    (entry,) = board["tracks"]["open"]["entries"]
    assert entry["name"] == "renamed"
    results = json.loads((tmp_path / "renamed" / "results.json").read_text())["results"]["entropy"]["pm"]["pooled"]
    assert entry["sets"]["perlin_mixed"] == {m: results[m] for m in entry["sets"]["perlin_mixed"]}
    reasons = {r["file"]: r["reason"] for r in board["rejected"]}
    ours, theirs = (set_identity(sets[s])["manifest_sha256"][:12] for s in ("perlin_mixed", "normal_mixed"))
    assert (f"the submission's 'perlin_mixed' has manifest hash {theirs}…, the benchmark's 'perlin_mixed' {ours}…"
            in reasons["other_content.zip"])
    assert (f"no results for set 'perlin_mixed' (manifest hash {ours}…): the submission's sets are 'nm' ({theirs}…)"
            in reasons["missing.zip"])
