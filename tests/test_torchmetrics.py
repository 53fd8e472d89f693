"""The torchmetrics wrapper of the float-order accumulator: the same numbers, merged and reduced over processes."""

import numpy as np
import pytest
import torch

from segood.metrics import FloatOrderAccumulator
from segood.metrics.torchmetrics import REPORTED, BinaryOODMetrics

from gloo import run_in_group


def batches(seed, count=3):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        labels = rng.choice(np.array([0, 1, 255], np.uint8), (2, 24, 32), p=[0.6, 0.3, 0.1])
        scores = rng.standard_normal((2, 24, 32)).astype(np.float32) * 10.0 ** rng.integers(-3, 3) + (labels == 1)
        yield torch.from_numpy(scores), torch.from_numpy(labels)


def test_equal_to_the_accumulator_bit_for_bit():
    metric, acc = BinaryOODMetrics(mantissa_bits=8), FloatOrderAccumulator(8)
    for scores, labels in batches(0):
        metric.update(scores, labels)
        acc.update(scores, labels)
    got, want = metric.compute(), acc.compute()
    assert {k: float(v) for k, v in got.items()} == {k: want[k] for k in REPORTED}
    np.testing.assert_array_equal(metric.accumulator().curve_counts()[1], acc.curve_counts()[1])
    assert metric.accumulator().n_ignored == acc.n_ignored and metric.accumulator().exact == acc.exact


def test_merged_states_equal_one_metric_and_empty_is_an_error():
    parts = [BinaryOODMetrics(), BinaryOODMetrics()]
    whole = BinaryOODMetrics()
    for k, (scores, labels) in enumerate(batches(1, 4)):
        parts[k % 2].update(scores, labels)
        whole.update(scores, labels)
    parts[0].merge_state(parts[1])
    assert {k: float(v) for k, v in parts[0].compute().items()} == {k: float(v) for k, v in whole.compute().items()}
    with pytest.raises(ValueError, match="empty: call update"):
        BinaryOODMetrics().compute()


def _ddp_worker(rank, world, out):
    metric = BinaryOODMetrics()
    for k, (scores, labels) in enumerate(batches(2, 4)):
        if k % world == rank:
            metric.update(scores, labels)
    torch.save({k: v.item() for k, v in metric.compute().items()}, f"{out}/rank{rank}.pt")


def test_two_processes_reduce_to_the_numbers_of_all_pixels(tmp_path):
    run_in_group(_ddp_worker, str(tmp_path))
    acc = FloatOrderAccumulator()
    for scores, labels in batches(2, 4):
        acc.update(scores, labels)
    for rank in range(2):
        assert torch.load(tmp_path / f"rank{rank}.pt") == {k: acc.compute()[k] for k in REPORTED}
