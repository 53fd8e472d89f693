"""The cross-source protocol: tune and commit on each source, test on every other; same-source cells flagged."""

import json

import pytest
import torch

from segood.cli import main
from segood.data.h5 import H5SegmentationDataset
from segood.evaluation import evaluate
from segood.evaluation.protocol import GRIDS, cross_source
from segood.methods.tuning import tune

from networks import tiny_network


@pytest.fixture(scope="module")
def sources(noise_sets):
    tune_root = noise_sets(seed=4)
    test_root = noise_sets(seed=5)
    tuning = {"perlin_tune": tune_root / "perlin_mixed.h5", "normal_tune": tune_root / "normal_mixed.h5"}
    tests = {"perlin_test": test_root / "perlin_mixed.h5", "normal_test": test_root / "normal_mixed.h5"}
    return tuning, tests


def test_the_matrix_flags_same_source_cells_and_equals_direct_evaluations(sources, tmp_path):
    tuning, tests = sources
    doc = cross_source(tiny_network(), tuning, tests, ["odin", "entropy"], tmp_path / "p", progress=False)
    for m in ("odin", "entropy"):
        for s in tuning:
            for t in tests:
                assert doc["cells"][m][s][t]["same_source"] == (s.split("_")[0] == t.split("_")[0])
        off = [c for row in doc["cells"][m].values() for c in row.values() if not c["same_source"]]
        assert doc["headline"][m]["cells"] == 2
        assert doc["headline"][m]["auroc"] == pytest.approx(sum(c["auroc"] for c in off) / 2)
    # a cell is the evaluation of the method tuned on its tuning set, at the threshold committed there
    loader = torch.utils.data.DataLoader(H5SegmentationDataset(tuning["normal_tune"]), batch_size=2)
    odin = tune("odin", tiny_network(), loader, GRIDS["odin"], tuning_set=tuning["normal_tune"],
                progress=False).method()
    direct = evaluate(tiny_network(), {"normal_tune": tuning["normal_tune"], **tests}, [odin], tmp_path / "direct",
                      progress=False, figures=False, bootstrap=None, commit_on="normal_tune")
    cell = doc["cells"]["odin"]["normal_tune"]["perlin_test"]
    assert cell["auroc"] == direct["results"]["odin"]["perlin_test"]["pooled"]["auroc"]
    assert cell["threshold"] == direct["results"]["odin"]["perlin_test"]["committed"]["tpr95"]["threshold"]
    assert doc["tuned_params"]["odin"]["normal_tune"] == {k: odin.params[k] for k in ("temperature", "epsilon",
                                                                                       "form")}
    markdown = (tmp_path / "p" / "protocol.md").read_text()
    assert "†" in markdown and "headline" in markdown
    assert json.loads((tmp_path / "p" / "protocol.json").read_text())["headline"] == doc["headline"]


def test_any_torch_module_is_tuned_as_it_is_evaluated(sources, tmp_path):
    """A plain ``nn.Module`` returning logits is wrapped before ODIN is tuned on it (as ``segood.evaluate`` wraps
    it); ``feature_layer`` reaches Mahalanobis' fit too."""
    import segmentation_models_pytorch as smp

    tuning, tests = sources
    torch.manual_seed(0)
    module = smp.create_model("fpn", encoder_name="resnet18", encoder_weights=None, classes=19).eval()
    doc = cross_source(module, {"perlin_tune": tuning["perlin_tune"]}, {"normal_test": tests["normal_test"]},
                       ["odin", "mahalanobis"], tmp_path / "p", progress=False, fit_set=tests["perlin_test"],
                       feature_layer="decoder", bootstrap=None)
    assert set(doc["headline"]) == {"odin", "mahalanobis"} and 0 <= doc["cells"]["odin"]["perlin_tune"][
        "normal_test"]["auroc"] <= 1


def test_on_the_linear_grid_methods_are_tuned_in_its_form_and_on_it(sources, tmp_path):
    """ODIN is tuned (and tested) in its [0, 1] form, each point binned on the run's linear grid (tuning used the
    float-order grid and ODIN's unbounded form, which the linear grid then refused)."""
    tuning, tests = sources
    one = {"perlin_tune": tuning["perlin_tune"]}
    doc = cross_source(tiny_network(), one, {"normal_test": tests["normal_test"]}, ["odin"], tmp_path / "p",
                       progress=False, num_thresholds=100, bootstrap=None)
    assert doc["tuned_params"]["odin"]["perlin_tune"]["form"] == "softmax"
    loader = torch.utils.data.DataLoader(H5SegmentationDataset(tuning["perlin_tune"]), batch_size=2)
    linear = tune("odin", tiny_network(), loader, GRIDS["odin"], tuning_set=tuning["perlin_tune"], progress=False,
                  metric_grid=doc_grid(tmp_path / "p" / "perlin_tune"))
    assert doc["tuned_params"]["odin"]["perlin_tune"] == {k: v for k, v in linear.method().params.items()
                                                          if k != "tuning"}


def doc_grid(run):
    return json.loads((run / "run.json").read_text())["config"]["grid"]


def test_bad_protocols_are_refused(sources, tmp_path):
    tuning, tests = sources
    with pytest.raises(ValueError, match="both as tuning and as test"):
        cross_source(tiny_network(), tuning, {**tests, "perlin_tune": tests["perlin_test"]}, ["entropy"], tmp_path)
    with pytest.raises(ValueError, match="unknown threshold rule"):
        cross_source(tiny_network(), tuning, tests, ["entropy"], tmp_path, rule="accuracy")
    id_only = tuning["perlin_tune"].parent / "cs.h5"
    with pytest.raises(ValueError, match=r"tuning set 'cs' .* has \d+ ID and 0 OOD pixels: .* nothing tuned"):
        cross_source(tiny_network(), {"cs": id_only}, tests, ["entropy"], tmp_path)
    with pytest.raises(ValueError, match=r"test set 'cs' .* has \d+ ID and 0 OOD pixels: .* every headline undefined"):
        cross_source(tiny_network(), tuning, {"cs": id_only}, ["entropy"], tmp_path)  # (the headlines were None)
    evaluate(tiny_network(), {"normal_tune": tuning["normal_tune"]}, ["entropy"], tmp_path / "p" / "normal_tune",
             progress=False, figures=False)  # the second tuning set's folder, taken by another run
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'p' / 'normal_tune'} holds a run of other sets or methods "
                                         r"than this protocol's evaluation tuned on normal_tune; choose another "
                                         r"folder \(--out; in Python out_dir\)$"):
        cross_source(tiny_network(), tuning, tests, ["entropy"], tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["normal_tune"]  # (refused before the first)


def test_cli_protocol(sources, tmp_path, capsys):
    import shutil

    from segood.models import save_checkpoint

    tuning, tests = sources
    named = []  # the CLI names sets by their file stems: tuning and test files need their own names
    for name, path in {**tuning, **tests}.items():
        shutil.copy(path, tmp_path / f"{name}.h5")
        named.append(str(tmp_path / f"{name}.h5"))
    save_checkpoint(tmp_path / "model.pt", tiny_network())
    assert main(["protocol", "--checkpoint", str(tmp_path / "model.pt"), "--tune-sets", *named[:2], "--test-sets",
                 *named[2:], "--methods", "entropy", "--out", str(tmp_path / "p"), "--rule", "f1",
                 "--metric", "auprc", "--batch-size", "1"]) == 0
    assert "Cross-source protocol (AUPRC; thresholds committed by f1" in capsys.readouterr().out
    doc = json.loads((tmp_path / "p" / "protocol.json").read_text())
    run = json.loads((tmp_path / "p" / "perlin_tune" / "run.json").read_text())
    assert (doc["rule"], doc["metric"], run["config"]["batch_size"]) == ("f1", "auprc", 1)
    assert doc["cells"]["entropy"]["perlin_tune"]["normal_test"]["f1"] is not None


def test_the_headline_averages_each_value_over_the_cells_of_other_sources():
    from segood.evaluation.protocol import _headline

    def cell(auroc, balanced_accuracy, tpr, fpr, same_source=False):
        return {"auroc": auroc, "balanced_accuracy": balanced_accuracy, "tpr": tpr, "fpr": fpr,
                "same_source": same_source}

    by_source = {"s1": {"t1": cell(0.9, 0.8, 0.95, 0.35, same_source=True), "t2": cell(0.5, 0.75, 0.75, 0.25)},
                 "s2": {"t1": cell(0.75, 0.5, 0.5, 0.5), "t2": cell(0.1, 0.1, 0.1, 0.1, same_source=True)}}
    assert _headline(by_source, "auroc") == {"cells": 2, "auroc": 0.625, "balanced_accuracy": 0.625, "tpr": 0.625,
                                             "fpr": 0.375}
    by_source["s2"]["t1"]["tpr"] = None  # undefined in a cell: undefined, not a mean of the others
    assert _headline(by_source, "auroc")["tpr"] is None
