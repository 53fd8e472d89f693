"""The float-order grid against a literal reference: a pixel counts as OOD-predicted at threshold t_b iff
float64(score) >= t_b, on adversarial data; exactness where the input allows; bounds; merges; the torch path."""

import struct

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from segood.metrics import FloatOrderAccumulator, accumulator_from_state, exact_metrics, make_accumulator
from segood.metrics import _device, _kernels
from segood.metrics.float_order import bin_thresholds

from gloo import run_in_group

METRICS = ("auroc", "auprc", "fpr95", "max_iou")


def literal_key(x):
    """The order-preserving key of one float, from its bytes (the contract's definition, written out)."""
    x = float(x) + 0.0  # -0.0 -> +0.0
    (bits,) = struct.unpack("<Q", struct.pack("<d", x))
    return bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)


def literal_counts(scores, labels, m):
    """{bin: (ID, OOD)} by the literal definition, one pixel at a time."""
    counts = {}
    for s, lab in zip(np.ravel(scores).tolist(), np.ravel(labels).tolist()):
        if lab == 255:
            continue
        b = literal_key(s) >> (52 - m)
        counts.setdefault(b, [0, 0])[lab] += 1
    return counts


def check_against_literal(scores, labels, m):
    """The accumulator's curve equals, at every occupied bin's threshold, the literal comparison."""
    result = FloatOrderAccumulator(m).update(scores, labels).compute()
    literal = literal_counts(scores, labels, m)
    assert len(result["thresholds"]) == len(literal)
    s = np.ravel(scores).astype(np.float64)
    lab = np.ravel(labels)
    for label, got in ((1, result["tp"]), (0, result["fp"])):  # count(s >= t) per label, for every threshold
        ordered = np.sort(s[lab == label])
        np.testing.assert_array_equal(got, ordered.size - np.searchsorted(ordered, result["thresholds"], "left"))
    thresholds = bin_thresholds(np.array([b >> m for b in sorted(literal)]),
                                np.array([b & ((1 << m) - 1) for b in sorted(literal)]), m)
    np.testing.assert_array_equal(result["thresholds"], thresholds)
    return result


def test_keys_order_like_the_floats():
    values = np.array([-np.inf, -1e300, -2.5, -1e-310, -0.0, 0.0, 5e-324, 1e-300, 0.5, 1.0, 2.0, 1e300, np.inf])
    keys = [literal_key(v) for v in values]
    assert keys == sorted(keys) and keys[4] == keys[5]  # -0.0 and +0.0 share a key


@pytest.mark.parametrize("m", [1, 7, 10, 14])
def test_adversarial_values_against_the_literal_comparison(m):
    rng = np.random.default_rng(m)
    special = [0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-45, -1e-45, 1.0, -1.0]
    mixed = rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)  # both signs, 60 decades
    crowded = 10.0 ** rng.uniform(-6, -3, 3000)
    # every bin edge of a few binades, and one float32 / float64 step either side
    edges = bin_thresholds(np.repeat([2048 + 1020, 2048 + 1023, 1024], 64),
                           np.tile(np.arange(64) * ((1 << m) // 64 or 1) % (1 << m), 3), m)
    edges = edges[np.isfinite(edges)]
    near = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf),
                           edges.astype(np.float32).astype(np.float64)])
    scores = np.concatenate([special, mixed, crowded, near])
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    labels[::11] = 255
    check_against_literal(scores, labels, m)
    as32 = scores.astype(np.float32)  # the float32 kernel, subnormal and infinite float32 values included
    check_against_literal(as32, labels, m)


def test_float32_and_float64_of_the_same_values_give_the_same_counts():
    rng = np.random.default_rng(1)
    scores = (rng.standard_normal(200_000) * 10.0 ** rng.integers(-40, 38, 200_000)).astype(np.float32)
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    a = FloatOrderAccumulator().update(scores, labels)
    b = FloatOrderAccumulator().update(scores.astype(np.float64), labels)
    np.testing.assert_array_equal(a.binades, b.binades)
    np.testing.assert_array_equal(a.counts, b.counts)


def test_every_float16_value_gives_the_exact_curve():
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    values = values[~np.isnan(values)]
    rng = np.random.default_rng(2)
    scores = np.repeat(values, 3)
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    result = FloatOrderAccumulator(10).update(scores, labels).compute()
    exact = exact_metrics(scores.astype(np.float64), labels)  # ±inf are thresholds like any other value
    assert result["exact"]
    for metric in METRICS:
        assert result[metric] == pytest.approx(exact[metric], abs=1e-12)
        assert result["bounds"][metric] == (result[metric], result[metric])
    # one bin per distinct float16 value: -0.0 and +0.0 are one value
    assert len(result["thresholds"]) == np.unique(values.astype(np.float64)).size


def test_bfloat16_and_8_bit_scores_are_exact_at_their_resolution():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 5000).astype(np.uint8)
    small = rng.integers(0, 256, 5000).astype(np.uint8)
    result = FloatOrderAccumulator(7).update(small, labels).compute()
    exact = exact_metrics(small.astype(np.float64), labels)
    assert result["exact"] and all(result[k] == pytest.approx(exact[k], abs=1e-12) for k in METRICS)
    b16 = torch.randn(5000).to(torch.bfloat16)
    result = FloatOrderAccumulator(7).update(b16, torch.from_numpy(labels)).compute()
    exact = exact_metrics(b16.float().numpy(), labels)
    assert result["exact"] and all(result[k] == pytest.approx(exact[k], abs=1e-12) for k in METRICS)
    assert not FloatOrderAccumulator(6).update(small, labels).compute()["exact"]
    # one mantissa bit fewer than the dtype has: two values share a bin, so the bounds must not be zero-width
    assert not FloatOrderAccumulator(6).update(b16, torch.from_numpy(labels)).compute()["exact"]
    halves = torch.randn(5000).half()
    assert FloatOrderAccumulator(10).update(halves, torch.from_numpy(labels)).compute()["exact"]
    assert not FloatOrderAccumulator(9).update(halves, torch.from_numpy(labels)).compute()["exact"]


def test_crowded_monte_carlo_like_scores_are_resolved_with_bounds_around_exact():
    """ID scores with median 4e-5 and OOD a little higher: the linear grid's 400 thresholds put nearly every
    pixel in its first bin; the float-order grid is within 1e-3 of exact mode, bounds containing it."""
    rng = np.random.default_rng(4)
    n = 400_000
    labels = (rng.random(n) < 0.1).astype(np.uint8)
    scores = np.where(labels == 1, 10 ** rng.normal(-3.6, 0.8, n), 10 ** rng.normal(-4.4, 0.8, n)).astype(np.float32)
    exact = exact_metrics(scores, labels)
    result = make_accumulator().update(scores, labels).compute()
    for metric in METRICS:
        assert abs(result[metric] - exact[metric]) < 1e-3
        lo, hi = result["bounds"][metric]
        assert lo - 1e-12 <= exact[metric] <= hi + 1e-12
    linear = make_accumulator({"kind": "linear", "num_thresholds": 400, "score_range": [0.0, 1.0]})
    assert abs(linear.update(scores, labels).compute()["fpr95"] - exact["fpr95"]) > 0.1


def test_unbounded_scores_need_no_range():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 10_000).astype(np.uint8)
    distances = np.abs(rng.normal(3.0, 1.0, labels.size)) * 10.0 ** (2 * labels)  # in [0, ~1e3]
    energy = -np.abs(rng.normal(20, 5, labels.size)) + 5 * labels  # negative values
    for scores in (distances, energy):
        result = FloatOrderAccumulator(14).update(scores, labels).compute()
        exact = exact_metrics(scores, labels)
        for metric in METRICS:
            lo, hi = result["bounds"][metric]
            assert lo - 1e-12 <= exact[metric] <= hi + 1e-12 and abs(result[metric] - exact[metric]) < 1e-3


def test_merges_states_and_per_image_means():
    rng = np.random.default_rng(6)
    a_scores, b_scores = rng.random((2, 64, 64)), -10.0 ** rng.uniform(-20, 20, (3, 64, 64))  # disjoint binades
    a_labels, b_labels = (rng.integers(0, 2, s.shape).astype(np.uint8) for s in (a_scores, b_scores))
    a = FloatOrderAccumulator(per_image=True).update(a_scores, a_labels)
    b = FloatOrderAccumulator(per_image=True).update(b_scores, b_labels)
    whole = FloatOrderAccumulator(per_image=True).update(np.concatenate([a_scores, b_scores]),
                                                         np.concatenate([a_labels, b_labels]))
    merged = a + b
    np.testing.assert_array_equal(merged.binades, whole.binades)
    np.testing.assert_array_equal(merged.counts, whole.counts)
    np.testing.assert_allclose(merged.per_image_sum, whole.per_image_sum)
    restored = accumulator_from_state(merged.state_dict())
    assert restored.compute()["auroc"] == whole.compute()["auroc"] and restored.n_images == 5
    per_image = [FloatOrderAccumulator().update(s, lab).compute()["auroc"]
                 for s, lab in zip(np.concatenate([a_scores, b_scores]), np.concatenate([a_labels, b_labels]))]
    assert whole.compute()["per_image_mean"]["auroc"] == pytest.approx(np.mean(per_image), abs=1e-12)
    with pytest.raises(ValueError, match="different configurations"):
        FloatOrderAccumulator(10).merge(FloatOrderAccumulator(12))


@pytest.mark.parametrize("m", [1, 7, 10, 14])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_float16_kernel_equals_the_float32_path_on_every_float16_value(m, threads):
    """float16 scores counted by bit pattern, then each pattern where its float32 value falls: the counts and
    problems of the same values as float32 (every one of the 65536 bit patterns: ±0, subnormals, ±inf, NaN), with
    ignored and bad labels, over several blocks; the pattern counts are left clear for the next call."""
    rng = np.random.default_rng(11)
    scores = rng.permutation(np.tile(np.arange(1 << 16, dtype=np.uint16), 2)).view(np.float16)
    labels = rng.choice(np.array([0, 1, 255, 7], np.uint8), scores.size, p=[0.6, 0.3, 0.09, 0.01])
    got = _kernels.float_histogram_numpy(scores, labels, m, threads)
    want = _kernels.float_histogram_numpy(scores.astype(np.float32), labels, m, threads)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    assert got[2][_kernels.N_BAD_SCORE] > 0 and got[2][_kernels.N_BAD_LABEL] > 0
    assert all(not t.any() and not marks.any() for tables in _kernels._FREE.values() for t, marks in tables)


def test_threads_taking_chunks_give_the_counts_of_one_pass_whatever_else_runs(monkeypatch):
    """Chunks taken in turn by the threads, tables drained early (before an int32 counter could fill: the limit
    made small here) and calls from several threads at once (each call its own tables) all give the counts of
    one thread over the whole input."""
    rng = np.random.default_rng(5)
    inputs = []
    for dtype in (np.float32, np.float16, np.float64):
        scores = (rng.standard_normal(300_001) * 10.0 ** rng.integers(-3, 3, 300_001)).astype(dtype)
        labels = rng.choice(np.array([0, 1, 255], np.uint8), scores.size, p=[0.7, 0.2, 0.1])
        inputs.append((scores, labels, _kernels.float_histogram_numpy(scores, labels, 10, 1)))
    monkeypatch.setattr(_kernels, "_TAKE", 4096)
    monkeypatch.setattr(_kernels, "_COUNTER_LIMIT", 50_000)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda case: _kernels.float_histogram_numpy(case[0], case[1], 10, 2), inputs * 4))
    for (_, _, want), got in zip(inputs * 4, results):
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x, y)


def test_no_int32_table_counts_more_than_2_31_pixels(monkeypatch):
    """The general kernel's chunks stay within an int32 counter (the limit made small here: its chunks are
    recorded), and the float16 pattern tables of several threads, which may hold 2^31 pixels together, are binned
    each alone (forged tables of 1.5e9 pixels each, one value)."""
    rng = np.random.default_rng(6)
    scores = rng.standard_normal(10_001)
    labels = (rng.random(scores.size) < 0.3).astype(np.uint8)
    want = _kernels.float_histogram_numpy(scores, labels, 12, 1)
    sizes, general = [], _kernels._general
    monkeypatch.setattr(_kernels, "_general", lambda s, *args: sizes.append(s.size) or general(s, *args))
    monkeypatch.setattr(_kernels, "_COUNTER_LIMIT", 1000)
    got = _kernels.float_histogram_numpy(scores, labels, 12, 2)
    assert max(sizes) <= 1000 and sum(sizes) == scores.size
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    monkeypatch.undo()

    half = np.float16(0.5).view(np.uint16)  # pattern row: sign and exponent; column: the 10 mantissa bits
    row, mantissa = int(half) >> 10, int(half) & 0x3FF
    tables = [_kernels._table(np.float16, 10) for _ in range(2)]
    for patterns, marked in tables:
        patterns[(((row << 1) | 1) << 10) | mantissa] = 1_500_000_000
        marked[row] = 1
    binades, counts = _kernels._drained(np.float16, 10, *zip(*tables))
    one = _kernels.float_histogram_numpy(np.float16([0.5]), np.uint8([1]), 10, 1)
    np.testing.assert_array_equal(binades, one[0])
    np.testing.assert_array_equal(counts, one[1] * 3_000_000_000)


def test_torch_path_equals_the_numpy_path():
    rng = np.random.default_rng(7)
    scores = rng.standard_normal(50_000) * 10.0 ** rng.integers(-10, 10, 50_000)
    scores[:5] = [0.0, -0.0, np.inf, -np.inf, 5e-324]
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    labels[::7] = 255
    for dtype in (np.float64, np.float32, np.float16):
        with np.errstate(over="ignore"):
            s = scores.astype(dtype)
        want = _kernels.float_histogram_numpy(s.astype(np.float32) if dtype == np.float16 else s, labels, 10, 2)
        [(binades, counts)], problems = _device.float_histograms(torch.from_numpy(s)[None],
                                                                torch.from_numpy(labels)[None], 10, kernel="torch")
        for x, y in zip((binades, counts, problems), want):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_give_the_cpu_counts():
    rng = np.random.default_rng(8)
    scores = rng.standard_normal((4, 256, 256)).astype(np.float32)
    labels = rng.integers(0, 2, scores.shape).astype(np.uint8)
    cpu = FloatOrderAccumulator().update(scores, labels)
    gpu = FloatOrderAccumulator().update(torch.from_numpy(scores).cuda(), torch.from_numpy(labels).cuda())
    np.testing.assert_array_equal(cpu.counts, gpu.counts)


def test_bad_input():
    labels = np.array([0, 1, 1], np.uint8)
    with pytest.raises(ValueError, match="1 counted pixels have NaN scores"):
        FloatOrderAccumulator().update(np.array([0.1, np.nan, 0.3]), labels)
    FloatOrderAccumulator().update(np.array([0.1, 0.2, np.nan]), np.array([0, 1, 255], np.uint8))  # ignored NaN
    with pytest.raises(ValueError, match="clip has no meaning"):
        FloatOrderAccumulator().update(np.array([0.1, 0.2, 0.3]), labels, clip=True)
    with pytest.raises(ValueError, match="outside the declared score_range"):
        FloatOrderAccumulator(score_range=(0, 1)).update(np.array([0.1, 2.0, 0.3]), labels)
    with pytest.raises(ValueError, match="labels contain values"):
        FloatOrderAccumulator().update(np.array([0.1, 0.2]), np.array([0, 7], np.uint8))
    with pytest.raises(ValueError, match="mantissa_bits must be in"):
        FloatOrderAccumulator(15)
    state = FloatOrderAccumulator().update(np.array([0.1, 0.2, 0.3]), labels).state_dict()
    state["binades"] = state["binades"][::-1].copy()
    with pytest.raises(ValueError, match="'binades' must be increasing"):
        FloatOrderAccumulator.from_state_dict(state)


def _all_reduce_worker(rank, world_size, out_dir):
    rng = np.random.default_rng(rank)
    scores = rng.random((2, 30, 30)) * 10.0 ** (10 * rank)  # the ranks occupy different binades
    labels = rng.integers(0, 2, scores.shape).astype(np.uint8)
    acc = FloatOrderAccumulator(per_image=True).update(scores, labels)
    acc.save(f"{out_dir}/local{rank}.npz")
    acc.all_reduce()
    acc.save(f"{out_dir}/reduced{rank}.npz")


def test_all_reduce_unites_the_ranks_binades(tmp_path):
    from segood.metrics import load_accumulator

    run_in_group(_all_reduce_worker, str(tmp_path))
    expected = load_accumulator(tmp_path / "local0.npz") + load_accumulator(tmp_path / "local1.npz")
    for r in range(2):
        reduced = load_accumulator(tmp_path / f"reduced{r}.npz")
        np.testing.assert_array_equal(reduced.binades, expected.binades)
        np.testing.assert_array_equal(reduced.counts, expected.counts)
        assert reduced.n_images == 4


@pytest.mark.parametrize("dtype,kernel", [(np.float32, "_float32_kernel"), (np.float64, "_float64_kernel")])
def test_an_interrupted_update_leaves_the_scratch_table_clean(monkeypatch, dtype, kernel):
    real = getattr(_kernels, kernel)

    def interrupted(*args):
        real(*args)
        raise KeyboardInterrupt

    rng = np.random.default_rng(9)
    big = (rng.random(100_000) - 0.5).astype(dtype)
    monkeypatch.setattr(_kernels, kernel, interrupted)
    with pytest.raises(KeyboardInterrupt):
        FloatOrderAccumulator().update(big, np.zeros(big.size, np.uint8))
    monkeypatch.undo()
    result = FloatOrderAccumulator().update(np.array([0.25, 0.75], dtype), np.array([0, 1], np.uint8)).compute()
    assert (result["n_id"], result["n_ood"]) == (1, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_runs_of_equal_scores_against_the_literal_comparison(dtype):
    """Pixels of one bin in a row (a confident network's saturated scores) are added a run at a time: runs longer
    than a kernel's block and single pixels, special values (each zero, infinities, a float32 subnormal: the
    careful path), labels in runs of their own. The counts are the literal comparison's, and an update refused
    midway (a NaN at the end) takes exactly its pixels out of the kernels' tables again (runs times -1)."""
    from test_metrics import runs_of

    rng = np.random.default_rng(21)
    values = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 1.0, 0.99999994, 0.5, -3.25, 7e-3, 6e4])
    scores = runs_of(rng, values, 30_000).astype(dtype)
    labels = runs_of(rng, np.uint8([0, 1, 255]), 30_000)
    check_against_literal(scores, labels, 10)
    acc, reference = FloatOrderAccumulator(), FloatOrderAccumulator()
    acc.update(scores, labels)
    reference.update(scores, labels)
    refused = scores.copy()
    refused[-1], labels[-1] = np.nan, 0
    with pytest.raises(ValueError, match="NaN"):
        acc.update(refused, labels)
    _same_counts(acc, reference)


def _frames(rng, dtype, shape=(3, 256, 256)):
    scores = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, shape)).astype(dtype)
    return scores, rng.choice(np.array([0, 1, 255], np.uint8), shape, p=[0.7, 0.2, 0.1])


def _same_counts(a, b):
    for field in ("binades", "counts"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.n_ignored, a.exact) == (b.n_ignored, b.exact)


def test_updates_kept_in_the_kernels_tables_give_the_counts_of_updates_drained_one_by_one(monkeypatch):
    """Host updates without per-image counts leave their pixels in the fast kernels' tables (one per thread) until
    the counts are read. Over float32, float16 and float64 frames in turn (each switch drains the tables of the
    dtype before), with their counters near the limit (made small here: drained before a call could fill them) and
    the state read midway, the counts equal those of updates drained one by one (with per-image counts)."""
    monkeypatch.setattr(_kernels, "_COUNTER_LIMIT", 500_000)  # (each update here: 196,608 pixels, 2 threads)
    rng = np.random.default_rng(12)
    kept, drained = FloatOrderAccumulator(), FloatOrderAccumulator(per_image=True)
    for k, dtype in enumerate([np.float32, np.float32, np.float32, np.float16, np.float64, np.float32]):
        scores, labels = _frames(rng, dtype)
        kept.update(scores, labels)
        drained.update(scores, labels)
        assert kept._kept.tables and not drained._kept.tables
        if k == 3:
            _same_counts(kept, drained)
    assert len(kept._kept.tables) == 2
    _same_counts(kept, drained)
    assert not kept._kept.tables


def test_a_refused_or_interrupted_update_leaves_the_kept_counts_as_they_were(monkeypatch):
    """An update refused (NaN, a bad label, a score outside the declared range) or interrupted by Ctrl-C while the
    kernels count takes its pixels out of the tables again: the counts kept from the updates before it, and those
    already read, are those of the good updates alone, and updating goes on."""
    import signal

    rng = np.random.default_rng(13)
    good = [_frames(rng, np.float32) for _ in range(3)]
    acc, reference = FloatOrderAccumulator(score_range=(-1e3, 1e3)), FloatOrderAccumulator()
    for scores, labels in good[:2]:
        reference.update(scores, labels)
    acc.update(*good[0])
    acc.counts  # (read: drained into the state)
    acc.update(*good[1])  # (kept in the tables)
    scores, labels = _frames(rng, np.float32)
    scores[2, 200, 7] = np.float32(1e-40)  # a subnormal: binned by the careful path, in the main thread
    nan, bad_label, outside = scores.copy(), labels.copy(), scores.copy()
    nan[2, 255, 255], bad_label[2, 255, 255], outside[2, 255, 255] = np.nan, 7, 5e3
    labels[2, 255, 255] = 0
    for bad_scores, bad_labels in ((nan, labels), (scores, bad_label), (outside, labels), (nan.astype(np.float16),
                                                                                      labels)):
        with pytest.raises(ValueError):  # (the last in another dtype: the tables of the one before drained first)
            acc.update(bad_scores, bad_labels)
    real, went_on = _kernels._careful, []

    def interrupted(*args):  # Ctrl-C while the kernels count: it waits until they are done, then raises
        signal.raise_signal(signal.SIGINT)
        went_on.append(True)
        return real(*args)

    monkeypatch.setattr(_kernels, "_careful", interrupted)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts ignoring it)
    try:
        with pytest.raises(KeyboardInterrupt):
            acc.update(scores, labels)
    finally:
        signal.signal(signal.SIGINT, inherited)
    monkeypatch.undo()
    assert went_on
    _same_counts(acc, reference)
    acc.update(*good[2])
    reference.update(*good[2])
    _same_counts(acc, reference)


@pytest.mark.parametrize("m", [1, 7, 10])
def test_the_fast_float64_kernel_equals_the_general_one(m):
    """The float64 kernel (a row per binade, no lookup) against the general kernel (a binade lookup per pixel) on
    both signs, zeros, subnormals, infinities and 600 decades, with ignored pixels; NaN and bad labels counted."""
    rng = np.random.default_rng(m)
    scores = rng.standard_normal(300_000) * 10.0 ** rng.integers(-300, 300, 300_000)
    scores[::97] = 0.0
    scores[1::97], scores[2::97], scores[3::97] = -0.0, np.inf, -np.inf
    scores[4::97], scores[5::97] = 5e-324, -2.2e-308
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    labels[::13] = 255
    fast = _kernels.float_histogram_numpy(scores, labels, m, 2)
    problems = np.zeros(3, np.int64)
    binades, counts = _kernels._general(scores, labels, m, problems)
    order = np.argsort(binades)
    np.testing.assert_array_equal(fast[0], binades[order])
    np.testing.assert_array_equal(fast[1], counts[order])
    np.testing.assert_array_equal(fast[2], problems)
    scores[7], labels[8], labels[9] = np.nan, 7, 0
    scores[9] = np.nan
    assert list(_kernels.float_histogram_numpy(scores, labels, m, 2)[2][1:]) == [1, 2]  # a bad label, 2 NaN


def test_forged_counts_that_wrap_around_are_refused():
    state = FloatOrderAccumulator().update(np.array([0.25, 0.75]), np.array([0, 1], np.uint8)).state_dict()
    counts = np.zeros((64, 2, 1 << 10), np.int64)
    counts[:, 0, 0] = 1 << 58
    state.update(binades=np.arange(2100, 2164, dtype=np.int64), counts=counts)
    with pytest.raises(ValueError, match="pixels in all, more than 2\\^58"):
        FloatOrderAccumulator.from_state_dict(state)


def test_a_declared_range_is_checked_in_float64():
    with pytest.raises(ValueError, match="1 counted pixels have scores outside the declared score_range"):
        FloatOrderAccumulator(score_range=(0.0, 0.1)).update(np.array([0.1, 0.05], np.float32),
                                                             np.array([0, 1], np.uint8))
    # only counted pixels are checked: an ignored pixel may score anything, NaN included
    result = FloatOrderAccumulator(score_range=(0.0, 1.0)).update(np.array([0.5, 0.25, 7.0, np.nan]),
                                                                  np.array([0, 1, 255, 255], np.uint8)).compute()
    assert (result["n_id"], result["n_ood"], result["n_ignored"]) == (1, 1, 2)


def test_the_float32_kernel_marks_the_rows_of_each_sign_a_block_holds():
    """Each block of the float32 kernel marks every row it counts in, and for scores of both signs only the rows
    between each sign's own lowest and highest exponent (not every row between the signs): positive exponents
    120-130 and negative 100-105 beside zeros of both signs, infinities, NaN and subnormals, with ignored and
    bad labels."""
    rng = np.random.default_rng(33)
    size = 10 * _kernels._BLOCK + 77
    positive = np.exp2(rng.uniform(120 - 127, 131 - 127, size))
    negative = -np.exp2(rng.uniform(100 - 127, 106 - 127, size))
    scores = np.where(rng.random(size) < 0.5, positive, negative).astype(np.float32)
    scores[: _kernels._BLOCK] = positive[: _kernels._BLOCK]  # a block of one sign
    specials = _kernels._BLOCK + rng.choice(size - _kernels._BLOCK, 40, replace=False)
    scores[specials] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 0.0] * 5
    labels = rng.choice(np.uint8([0, 1, 255, 7]), size, p=[0.6, 0.3, 0.08, 0.02])
    table, marks = _kernels._table(np.float32, 10)
    careful = _kernels._float32_kernel(scores.view(np.uint32), labels, 10, table, marks, np.zeros(3, np.int64), 1)
    assert careful > 0
    counted = table[:-2].reshape(512, 2, 1024).any(axis=(1, 2))
    allowed = np.zeros(512, bool)
    allowed[[0, *range(120, 131), *range(256 + 100, 256 + 106)]] = True
    assert marks[counted].all() and not marks[~allowed].any()
    np.testing.assert_array_equal(counted, allowed)
    table, marks = _kernels._table(np.float32, 10)  # ones and a -0: rows 127 and 0 (-0's bits are not a row)
    ones = np.ones(_kernels._BLOCK, np.float32)
    ones[5] = -0.0
    _kernels._float32_kernel(ones.view(np.uint32), np.zeros(ones.size, np.uint8), 10, table, marks,
                             np.zeros(3, np.int64), 1)
    assert set(np.flatnonzero(marks)) == {0, 127}


def test_add_rows_adds_each_row_where_numpy_fancy_indexing_would():
    rng = np.random.default_rng(34)
    into = rng.integers(0, 1 << 40, (9, 2, 16))
    rows = np.array([0, 2, 3, 7])
    counts = rng.integers(0, 1 << 40, (4, 2, 16))
    want = into.copy()
    want[rows] += counts
    _kernels.add_rows(into, rows, counts)
    np.testing.assert_array_equal(into, want)
