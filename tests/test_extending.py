"""The three recipes of docs/extending.md: a dataset, a method and a metric, each registered inside the test,
reach the CLI's --help, the converter / evaluation report and the leaderboard without any other file edited."""

import json
import os

import numpy as np
import pytest
import torch

from segood.cli import build_parser, main
from segood.data import Sample, SkipFrame
from segood.data.adapter import Adapter
from segood.data.h5 import H5SegmentationDataset, read_manifest
from segood.data.registry import ADAPTERS, get_adapter
from segood.evaluation import evaluate
from segood.labels import ID, IGNORE, OOD
from segood.leaderboard import leaderboard, make_benchmark, submit
from segood.methods import METHODS, Method, get_method
from segood.metrics import METRICS, Metric, exact_metrics, get_metric, make_accumulator
from segood.models import preprocess

from networks import tiny_network


class Squares(Adapter):
    """A toy dataset: grey frames with one bright OOD square; frame 2 is unreadable."""

    name, source, help = "squares", "squares", "grey frames with one OOD square (a test's toy)"
    default_split = None

    def __init__(self, count):
        self.count, self.params = count, {"count": count}

    @property
    def default_size(self):
        return (32, 32)

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--count", type=int, default=4)

    @classmethod
    def from_args(cls, args):
        return cls(args.count)

    def refs(self):
        return list(range(self.count))

    def frame_id(self, index):
        return f"square/{index}"

    def load(self, index):
        if index == 2:
            raise SkipFrame("frame 2 is broken on purpose")
        image = np.full((32, 32, 3), 100, np.uint8)
        mask = np.zeros((32, 32), np.uint8)
        mask[4 + index : 12 + index, 8:16] = OOD
        mask[0] = IGNORE
        image[mask == OOD] = 250
        return Sample(image, mask, np.where(mask == ID, 0, IGNORE).astype(np.uint8), self.frame_id(index))


def help_text(capsys, *argv):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


def test_a_registered_adapter_reaches_the_cli_and_the_converter(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(ADAPTERS, "squares", Squares)
    assert "grey frames with one OOD square" in help_text(capsys, "convert")
    assert "--count" in help_text(capsys, "convert", "squares")
    assert main(["convert", "squares", "--count", "4", "--out", str(tmp_path / "sq.h5"), "--quiet"]) == 0
    manifest = read_manifest(tmp_path / "sq.h5")
    assert manifest["frames"] == 3 and manifest["source"] == "squares" and manifest["params"] == {"count": 4}
    assert manifest["skipped"] == [{"frame_id": "square/2", "reason": "frame 2 is broken on purpose"}]
    item = H5SegmentationDataset(tmp_path / "sq.h5")[1]
    assert item["image"].shape == (3, 32, 32) and int((item["ood_mask"] == OOD).sum()) == 64
    with pytest.raises(KeyError, match="choose one of .*squares"):
        get_adapter("circles")


class MaxLogitToy(Method):
    """A toy method scored from the shared forward pass: sigmoid of minus the max logit."""

    name = "toy_max_logit"

    def from_output(self, output):
        return torch.sigmoid(-output.logits.amax(dim=1))


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets(kinds=("perlin",), seed=4, side=32)


def test_a_registered_method_reaches_the_cli_and_the_report(sets, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(METHODS, "toy_max_logit", MaxLogitToy)
    assert "toy_max_logit" in help_text(capsys, "evaluate")
    model = tiny_network()
    doc = evaluate(model, [sets / "perlin_mixed.h5"], ["toy_max_logit", "max_softmax"], tmp_path / "run",
                   progress=False, figures=False)
    assert "| toy_max_logit |" in (tmp_path / "run" / "results.md").read_text()
    # the same numbers as scoring the method by hand, frame by frame
    acc = make_accumulator()
    for item in H5SegmentationDataset(sets / "perlin_mixed.h5"):
        scores, _ = get_method("toy_max_logit").score(model, preprocess(item["image"][None]))
        acc.update(scores, item["ood_mask"][None])
    assert doc["results"]["toy_max_logit"]["perlin_mixed"]["pooled"]["auroc"] == acc.compute()["auroc"]


def log_odds_auroc(curve):
    """An unbounded toy metric: the log-odds of the AUROC."""
    from segood.metrics.functional import auroc

    value = auroc(curve)
    return float(np.log(value / (1 - value)))


TOY_METRIC = Metric("log_odds_auroc", "logit(AUROC)", True, log_odds_auroc, range=None)


def test_a_registered_metric_reaches_the_cli_the_report_and_the_leaderboard(sets, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(METRICS, TOY_METRIC.name, TOY_METRIC)
    assert "log_odds_auroc" in help_text(capsys, "benchmark")
    assert get_metric("log_odds_auroc") is TOY_METRIC
    scores = np.r_[np.linspace(0, 0.6, 50), np.linspace(0.3, 1, 50)]
    labels = np.r_[np.zeros(50, np.uint8), np.ones(50, np.uint8)]
    exact = exact_metrics(scores, labels)
    assert exact["log_odds_auroc"] == pytest.approx(np.log(exact["auroc"] / (1 - exact["auroc"])))

    model = tiny_network()
    run = tmp_path / "run"
    doc = evaluate(model, {"perlin": sets / "perlin_mixed.h5"}, ["max_softmax"], run, progress=False, figures=False)
    value = doc["results"]["max_softmax"]["perlin"]["pooled"]["log_odds_auroc"]
    assert value == pytest.approx(np.log(doc["results"]["max_softmax"]["perlin"]["pooled"]["auroc"] /
                                         (1 - doc["results"]["max_softmax"]["perlin"]["pooled"]["auroc"])))
    markdown = (run / "results.md").read_text()
    assert "## logit(AUROC) ↑ (pooled over all pixels)" in markdown
    assert "log_odds_auroc" in (run / "results.csv").read_text().splitlines()[0]

    # the leaderboard ranks by it and accepts values outside [0, 1] (the metric is unbounded), never NaN
    make_benchmark({"toy": {"sets": {"perlin": sets / "perlin_mixed.h5"}, "rank_by": "log_odds_auroc"}},
                   tmp_path / "bench.json")
    (tmp_path / "subs").mkdir()
    submit(run, tmp_path / "subs" / "ok.zip", method="max_softmax", name="PSPNet max_softmax")
    board = leaderboard(tmp_path / "subs", tmp_path / "bench.json", tmp_path / "board")
    assert board["rejected"] == [] and board["tracks"]["toy"]["entries"][0]["score"] == pytest.approx(value)

    from segood.leaderboard.safe import Rejected
    from segood.leaderboard.submission import validate

    claims = json.loads(_member(tmp_path / "subs" / "ok.zip", "submission.json"))
    claims["sets"]["perlin"]["claims"]["log_odds_auroc"] = 7.5  # out of [0, 1]: fine for this metric
    validate(claims)
    claims["sets"]["perlin"]["claims"]["auroc"] = 1.5  # out of the AUROC's range: refused
    with pytest.raises(Rejected, match=r"auroc 1.5 is not a number in \[0, 1\]"):
        validate(claims)


def _member(path, name):
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.read(name)


def test_a_method_that_changes_the_shared_outputs_in_place_is_refused_and_a_mixins_formula_is_its_own():
    """Every method scores the same forward pass: one that divides output.logits in place would change the others'
    scores, so it is refused, naming it; a logit method whose formula comes from a mixin is scored by it, not fused
    with its parent's."""
    from segood.methods.methods import Energy
    from segood.methods.schedule import score_batch

    class Tempered(Method):
        name = "tempered_in_place"

        def from_output(self, output):
            output.logits /= 1000.0
            return 1 - torch.softmax(output.logits, dim=1).amax(dim=1)

    class Negated:
        def from_output(self, output):
            return -super().from_output(output)

    class NegatedEnergy(Negated, Energy):
        name = "negated_energy"

    x = preprocess(torch.randint(0, 255, (1, 3, 32, 64), dtype=torch.uint8))
    with torch.no_grad(), pytest.raises(ValueError, match="method tempered_in_place changed the network's outputs in "
                                                          r"place \(such as output.logits /= T\)"):
        score_batch(tiny_network(), x, [Tempered(), get_method("energy")])
    with torch.no_grad():
        energy, negated = score_batch(tiny_network(), x, [get_method("energy"), NegatedEnergy()]).scores
    torch.testing.assert_close(negated, -energy)


def test_names_that_would_leave_a_folder_are_refused_and_a_missing_dependency_is_named(tmp_path, monkeypatch):
    """A method named '../x' would be exported outside --out; 'all' is --methods' every method. A user module that
    imports a missing module whose name begins as its own is not called missing itself."""
    from segood.methods import register_method
    from segood.registry import import_user_module

    for name in ("../outside", "a/b", "all"):
        with pytest.raises(ValueError, match=f"a method name names files and folders .*: {name!r} cannot be one"):
            register_method(type("Bad", (Method,), {"name": name}))
    with pytest.raises(ValueError, match="a dataset adapter name .* 'mix' cannot be one"):  # (segood convert mix)
        ADAPTERS.add("mix", Squares)
    with pytest.raises(ValueError, match="a method named 'energy' is registered already"):
        METHODS.update(energy=MaxLogitToy)  # (update, |= and setdefault add as registering does)
    with pytest.raises(ValueError, match="a method named 'entropy' is registered already"):
        registry = METHODS
        registry |= {"entropy": MaxLogitToy}
    assert METHODS.setdefault("energy", MaxLogitToy) is not MaxLogitToy
    (tmp_path / "mylib_loader.py").write_text("import mylib\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    with pytest.raises(ValueError, match="importing mylib_loader failed: it needs 'mylib', which is not installed"):
        import_user_module("--scorer mylib_loader:f", "mylib_loader")


def test_a_plugin_adapters_arrays_of_another_dtype_are_refused_not_cast(tmp_path):
    from segood.data import ConversionError, convert

    class Floats(Squares):
        name = "float_squares"

        def load(self, index):
            sample = super().load(index)
            return Sample(sample.image.astype(np.float32) / 255, sample.ood_mask, sample.semantic.astype(np.int64),
                          sample.frame_id)

    with pytest.raises(ConversionError, match="images is float32; a set stores uint8"):
        convert(Floats(1), tmp_path / "f.h5", progress=False, strict=True)



PLUGIN = """
import numpy as np
import torch

from segood.data import Sample
from segood.data.adapter import Adapter, register_adapter
from segood.labels import IGNORE, OOD
from segood.methods import Method, register_method
from segood.metrics import Metric, register_metric
from segood.models.adapters import LibraryModel, register_model_type
from segood.models.network import SegOutput


@register_adapter
class Stripes(Adapter):
    name = source = "plugin_stripes"
    help = "grey frames with a bright OOD stripe (a plugin's toy)"
    default_split = None

    def __init__(self, root):
        self.root, self.params = root, {}

    def refs(self):
        return [0, 1, 2]

    def frame_id(self, index):
        return f"stripes/{index}"

    def load(self, index):
        image = np.full((32, 32, 3), 90, np.uint8)
        mask = np.zeros((32, 32), np.uint8)
        mask[8 + index:16 + index] = OOD
        image[mask == OOD] = 240
        return Sample(image, mask, np.where(mask == OOD, IGNORE, 0).astype(np.uint8), self.frame_id(index))


@register_method
class Brightness(Method):
    name = "plugin_brightness"

    def from_output(self, output):
        return torch.sigmoid(-output.logits.amax(dim=1))


@register_method
class Needy(Method):
    name = "plugin_needy"

    def __init__(self, scale):
        super().__init__(scale=scale)


def tpr05(curve):
    ok = 20 * curve.fp <= curve.n_id
    return float(curve.tpr[ok].max()) if ok.any() else 0.0


register_metric(Metric("plugin_tpr05", "TPR@5%FPR", True, tpr05))


class Conv(LibraryModel):
    def num_network_classes(self):
        return 19

    def network_output(self, x):
        return SegOutput(self.module(x), None)


@register_model_type(name="plugin_conv")
def load_conv(path, **options):
    torch.manual_seed(0)
    return Conv(torch.nn.Conv2d(3, 19, 1), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), **options)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A plugin module in the current folder, registering an adapter, two methods and a metric; the registries as
    they were once the test is done."""
    import sys

    from segood.models import MODEL_TYPES

    registries = [ADAPTERS, METHODS, METRICS, MODEL_TYPES]
    saved = [dict(registry) for registry in registries]
    (tmp_path / "toyplug.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(sys.path))
    yield "toyplug"
    sys.modules.pop("toyplug", None)
    for registry, entries in zip(registries, saved):
        dict.clear(registry)
        dict.update(registry, entries)


def test_a_plugin_module_reaches_every_command(plugin, tmp_path, capsys):
    """segood --plugin MODULE imports it before the command line is built: its adapter converts, its method is a
    --methods choice and its metric a column; without it, a rebuilt report says which column it leaves out."""
    from segood.models import save_checkpoint

    with pytest.raises(SystemExit):
        main(["--plugin", plugin, "convert", "--help"])
    assert "plugin_stripes" in capsys.readouterr().out
    assert main(["--plugin", plugin, "convert", "plugin_stripes", ".", "--out", "s.h5", "-q"]) == 0
    assert read_manifest(tmp_path / "s.h5")["frames"] == 3
    save_checkpoint(tmp_path / "m.pt", tiny_network())
    run = ["evaluate", "--checkpoint", "m.pt", "--sets", "s.h5", "--resamples", "0", "-q", "--out", "run"]
    assert main([f"--plugin={plugin}", *run, "--methods", "plugin_brightness", "max_softmax"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())["results"]
    value = results["plugin_brightness"]["s"]["pooled"]["plugin_tpr05"]
    assert 0 <= value <= 1 and "plugin_tpr05" in results["max_softmax"]["s"]["pooled"]
    with pytest.raises(SystemExit):  # its loader too, by the name it registers
        main(["--plugin", plugin, "evaluate", "--help"])
    assert "--model-type hf|plugin_conv|smp|torchvision|MODULE:NAME" in capsys.readouterr().out
    assert main(["--plugin", plugin, "evaluate", "--model-type", "plugin_conv", "--model", ".", *run[3:-1], "conv",
                 "--methods", "max_logit"]) == 0
    assert json.loads((tmp_path / "conv" / "results.json").read_text())["model"]["adapter"] == "Conv"

    assert main([*run[:-1], "run2", "--plugin", plugin]) == 2
    assert "--plugin MODULE goes before the command: segood --plugin MODULE evaluate" in capsys.readouterr().err
    assert main(["--plugin", "notaplugin", *run]) == 2
    assert "--plugin notaplugin: no module 'notaplugin' in the current folder" in capsys.readouterr().err

    assert main(["--plug", plugin, *run]) == 2  # (argparse's abbreviations would import nothing)
    assert "segood: error: --plug: write --plugin in full" in capsys.readouterr().err
    assert main(["--plugin", f"./{plugin}.py", *run]) == 2
    assert f"--plugin ./{plugin}.py: give the module's name, --plugin {plugin}," in capsys.readouterr().err
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    assert main(["--plugin", "broken", *run]) == 2
    assert "--plugin broken: importing broken failed (RuntimeError: boom) (raised at " in capsys.readouterr().err
    os.environ["SEGOOD_TRACEBACK"] = "1"
    try:
        with pytest.raises(ValueError, match="importing broken failed"):
            main(["--plugin", "broken", *run])
    finally:
        del os.environ["SEGOOD_TRACEBACK"]

    dict.pop(METRICS, "plugin_tpr05")  # without the metric: each report says the column is gone, a resume refuses
    for _ in range(2):
        with pytest.warns(UserWarning, match="the run counted plugin_tpr05, which no metric registered now computes"):
            assert main(["report", "run", "-q"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())["results"]
    assert "plugin_tpr05" not in results["max_softmax"]["s"]["pooled"]  # (the per-image means, kept in the state,
    assert "plugin_tpr05" in results["max_softmax"]["s"]["per_image_mean"]  # stay)
    assert main([*run, "--methods", "plugin_brightness", "max_softmax", "--resume"]) == 2
    assert "counts plugin_tpr05 per image, which no metric registered now computes: resume with the module that " \
        "registers it (segood --plugin MODULE evaluate ... --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*run[:-1], "run2", "--methods", "plugin_brightnes"])
    assert "invalid choice: 'plugin_brightnes'" in (err := capsys.readouterr().err) and "--plugin MODULE" in err

    # a method that cannot be built from its name, or whose parameters run.json cannot hold: refused, named
    assert main([f"--plugin={plugin}", *run[:-1], "run3"]) == 2
    assert "method 'plugin_needy' cannot be built from its name and no parameters (missing a required argument: " \
        "'scale')" in capsys.readouterr().err
    for scale, shown in ((np.array([1]), r"array\(\[1\]\) \(ndarray\)"), (float("nan"), r"nan \(float\)"),
                         (float("inf"), r"inf \(float\)")):
        with pytest.raises(ValueError, match=f"method plugin_needy's parameter scale={shown} cannot be recorded in "
                                             "run.json: give it as a finite number"):
            evaluate(tiny_network(), ["s.h5"], [METHODS["plugin_needy"](scale=scale)], tmp_path / "run4",
                     progress=False)


def test_a_run_resumed_with_another_class_under_a_methods_name_is_refused(sets, tmp_path):
    """run.json records the class of a method defined outside segood: a plugin that replaced a built-in (or another
    definition) cannot continue the run of the other one and mix their scores."""
    first, other = (type(name, (MaxLogitToy,), {"name": "toy"}) for name in ("First", "Other"))
    run = tmp_path / "run"
    evaluate(tiny_network(), [sets / "perlin_mixed.h5"], [first()], run, progress=False, bootstrap=None, figures=False)
    assert json.loads((run / "run.json").read_text())["methods"]["toy"]["class"] == "test_extending.First"
    with pytest.raises(ValueError, match=r"holds a different run \(methods.toy.class: \"test_extending.First\" -> "
                                         r"\"test_extending.Other\""):
        evaluate(tiny_network(), [sets / "perlin_mixed.h5"], [other()], run, progress=False, resume=True)
    assert "class" not in get_method("energy").describe()  # (segood's own: its name says which)


def test_an_adapter_whose_options_clash_breaks_only_its_own_conversion(plugin, tmp_path, capsys):
    """segood convert builds the options of the dataset it converts only: a plugin's adapter that declares a shared
    option again is one line of error for its own conversion, and the others convert."""

    class Clashing(Squares):
        name = "clashing"

        @classmethod
        def add_arguments(cls, parser):
            parser.add_argument("--size", type=int)

    ADAPTERS.add("clashing", Clashing)
    assert main(["convert", "clashing", "--out", "c.h5"]) == 2
    assert "segood: error: dataset adapter clashing: its add_arguments declares an option segood " \
        "convert has already (argument --size: conflicting option string: --size)" in capsys.readouterr().err
    assert main([f"--plugin={plugin}", "convert", "plugin_stripes", ".", "--out", "s.h5", "-q"]) == 0


def test_registry_names_and_pickling():
    import pickle

    from segood.registry import Registry

    registry = Registry("thing")
    registry.add("a", 1)
    assert pickle.loads(pickle.dumps(registry)) == {"a": 1}  # (items restored before the registry's fields)
    for name in ("x" * 101, "-x", "a\nb", "a\x00b"):
        with pytest.raises(ValueError, match="at most 100 bytes, no path separators or control characters"):
            registry.add(name, 2)
    for name in ("n_id", "max_iou_threshold", "per_image_mean", "same_source_oe"):  # (a result's other values)
        with pytest.raises(ValueError, match=f"a metric name .*: {name!r} cannot be one"):
            METRICS.add(name, TOY_METRIC)
    with pytest.raises(ValueError, match="a dataset adapter name .* 'coverage' cannot be one"):
        ADAPTERS.add("coverage", Squares)


def test_names_alike_once_made_safe_draw_two_figures(sets, tmp_path):
    """'toy|max' and 'toy_max' both become the file name per_class_toy_max.png: the second gets a hash of its name
    instead of replacing the first's."""
    methods = [type("Piped", (MaxLogitToy,), {"name": "toy|max"})(), type("Under", (MaxLogitToy,), {"name": "toy_max"})()]
    run = tmp_path / "run"
    evaluate(tiny_network(), [sets / "perlin_mixed.h5"], methods, run, progress=False, bootstrap=None)
    drawn = sorted(path.name for path in (run / "figures").glob("per_class_*.png"))
    assert drawn == ["per_class_toy_max-fd089b79.png", "per_class_toy_max.png"]  # (sha256 of the parts)
    from segood.evaluation.report import file_names

    file_name = file_names()  # (set x with corruption motion_blur, set x_motion with blur: two files)
    assert file_name("examples", "x", "motion_blur") == "examples_x_motion_blur.png"
    assert file_name("examples", "x_motion", "blur").startswith("examples_x_motion_blur-")
