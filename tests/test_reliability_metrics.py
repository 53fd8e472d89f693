"""Hostile accumulator states and score arrays: counts checked before any cast, every field of the right type,
shape and range, archives never decompressed past what their headers declare, complex scores refused."""

import io
import zipfile

import numpy as np
import pytest
import torch

from segood.metrics import PixelOODAccumulator


# 9. and 10. States: counts checked before any cast; every field of the right type, shape and range.
@pytest.mark.parametrize("field, value, message", [
    ("hist", np.full((2, 400), 2**64 - 1, np.uint64), r"non-negative counts below 2\^58"),
    ("hist", np.full((2, 400), 2**50, np.int64), r"counts \d+ pixels in all, more than 2\^58"),
    ("per_image", np.array("False"), "'per_image' must be a boolean"),
    ("per_image_sum", np.array([1e9, 0.0, 0.0, 0.0]), "per_image_sum' of auroc is 1000000000.0: impossible"),
    ("per_image_defined", np.array(5), r"per_image_defined \(5\) exceeds n_images \(0\)"),
    ("score_range", np.array([0.0, 0.5, 1.0]), "'score_range' must be two real numbers"),
    ("per_image_sum", np.zeros(3), "'per_image_sum' must be 4 finite floats"),
    ("per_image_sum", np.full(4, np.nan), "'per_image_sum' must be 4 finite floats"),
    ("num_thresholds", np.array(400.7), "'num_thresholds' must be an integer"),
])
def test_bad_accumulator_states_are_refused(field, value, message):
    state = PixelOODAccumulator(400).state_dict()
    state[field] = value
    with pytest.raises(ValueError, match=message):
        PixelOODAccumulator.from_state_dict(state)


def test_states_name_their_metrics_so_registering_one_keeps_old_states_readable(monkeypatch):
    from segood.metrics import METRICS, Metric, accumulator_from_state, make_accumulator

    old = make_accumulator(per_image=True).update(np.array([[0.1, 0.9]]), np.array([[0, 1]], np.uint8)).state_dict()
    old_style = {k: v for k, v in PixelOODAccumulator(per_image=True).update(
        np.array([[0.1, 0.9]]), np.array([[0, 1]], np.uint8)).state_dict().items() if k != "per_image_metrics"}
    monkeypatch.setitem(METRICS, "half_auroc", Metric("half_auroc", "AUROC/2", True, lambda c: 0.5))
    for state in (old, old_style):  # a state of today's four metrics, and one from before states named them
        acc = accumulator_from_state(state)
        assert acc.metric_names == ("auroc", "auprc", "fpr95", "max_iou")
        assert acc.compute()["per_image_mean"]["auroc"] == 1.0 and acc.compute()["half_auroc"] == 0.5


def test_read_npz_never_decompresses_more_than_a_header_declares(tmp_path):
    from segood.io import read_npz

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (2, 1 << 40)})
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        archive.writestr("hist.npy", header.getvalue() + b"\0" * 64)
    with pytest.raises(ValueError, match="declare 17592186044416 bytes, more than the limit"):
        read_npz(tmp_path / "huge.npz", "accumulator state")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (4,)})
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as archive:
        archive.writestr("hist.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(ValueError, match="holds 16 bytes where its header declares 32"):
        read_npz(tmp_path / "short.npz", "accumulator state")


def test_complex_scores_are_refused():
    labels = np.array([0, 1, 1], np.uint8)
    for scores in (np.array([0.1, 0.5, 0.9]) + 0.5j, torch.tensor([0.1, 0.5, 0.9], dtype=torch.complex64)):
        with pytest.raises(TypeError, match="scores must be real numbers .*complex"):
            PixelOODAccumulator().update(scores, labels)
