"""The Python API as a notebook uses it: a method called on any module, an evaluation kept in memory, a table."""

import numpy as np
import pytest
import torch

import segood
from segood.cli import main
from segood.evaluation import Results
from segood.methods import get_method
from segood.models import preprocess
from segood.models.external import ExternalModel


@pytest.fixture(scope="module")
def sets(noise_sets):
    return noise_sets(kinds=("perlin",), noise_frames=2, cityscapes_frames=2)


def plain_module(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 19, 1)).eval()


def test_a_method_scores_any_module_on_uint8_frames():
    module = plain_module()
    images = torch.randint(0, 256, (2, 3, 16, 24), dtype=torch.uint8)
    for name in ("max_softmax", "entropy", "energy"):
        want = get_method(name).score(ExternalModel(module), preprocess(images))[0]
        torch.testing.assert_close(get_method(name)(module, images), want, rtol=0, atol=0)
        one = get_method(name).score(ExternalModel(module), preprocess(images[1:]))[0][0]
        torch.testing.assert_close(get_method(name)(module, images[1]), one, rtol=0, atol=0)
    with pytest.raises(ValueError, match="expected uint8 RGB images .*method.score"):
        get_method("entropy")(module, preprocess(images))
    # method.score, which that error points to, takes the plain module too (it crashed on its output)
    torch.testing.assert_close(get_method("entropy").score(module, preprocess(images))[0],
                               get_method("entropy")(module, images), rtol=0, atol=0)


def test_evaluate_in_memory_writes_nothing_and_makes_a_table(sets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = segood.evaluate(plain_module(), {"perlin": sets / "perlin_mixed.h5"}, ["max_softmax", "energy"],
                              progress=False)
    assert isinstance(results, Results) and list(tmp_path.iterdir()) == []
    table = results.table()
    assert list(table.columns) == ["method", "set", "metric", "aggregation", "value", "low", "high"]
    assert len(table) == 2 * 4
    row = table[(table.method == "energy") & (table.metric == "auroc")].iloc[0]
    assert row.value == results["results"]["energy"]["perlin"]["pooled"]["auroc"]
    assert row.low <= row.value <= row.high  # the bootstrap interval
    again = segood.evaluate(plain_module(seed=1), {"perlin": sets / "perlin_mixed.h5"}, ["max_softmax", "energy"],
                            progress=False)  # another model in the same cell: no folder to refuse it
    assert again["results"]["energy"]["perlin"]["pooled"] != results["results"]["energy"]["perlin"]["pooled"]
    per_image = results.table(aggregation="per-image mean")
    assert set(per_image.aggregation) == {"per-image mean"}
    assert per_image.value.isna().all()  # every frame is all ID or all OOD: no metric is defined per image
    folder = results.save(tmp_path / "saved")
    assert main(["report", str(folder)]) == 0  # rebuilt from the saved state alone
    rebuilt = Results(__import__("json").loads((folder / "results.json").read_text()), None)
    np.testing.assert_array_equal(rebuilt.table().value, table.value)
    assert results.save(folder) == folder  # the same run again: fine
    with pytest.raises(ValueError, match="holds a different run"):  # (another run's folder was overwritten)
        again.save(folder)
    figures = results.figures(tmp_path / "new" / "figures")  # (its parent made too)
    assert any(p.suffix == ".png" for p in figures.iterdir())
    with pytest.raises(ValueError, match="resume continues a run saved in a folder"):
        segood.evaluate(plain_module(), [sets / "perlin_mixed.h5"], ["energy"], resume=True, progress=False)
