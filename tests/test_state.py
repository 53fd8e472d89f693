"""The state contract (segood.metrics.state): one merge and one all-reduce by declared reductions, a run's state as a
tree of parts, and a state file of the flat format before it, which still loads to the same numbers."""

from pathlib import Path

import numpy as np
import pytest
import torch

from segood.evaluation.runner import Evaluation
from segood.metrics import FloatOrderAccumulator, UndefinedMetricWarning
from segood.metrics.state import all_reduce_state, flatten, merge_states, unflatten

from gloo import run_in_group

FIXTURES = Path(__file__).parent / "fixtures"

# the numbers of tests/fixtures/flat_state.npz (written by tests/fixtures/make_flat_state.py), part by part
FLAT_STATE_NUMBERS = {
    "pixels/max_softmax/s1": [0.3922785209050321, 0.017117081601732764, 0.9593536565050808,
                              24012, 564, 0.41614505539917457, 3],
    "class_sums/max_softmax/s1": 21616.830729663372,
    "components/max_softmax/s1": [0.0, 0.034423828125, 0.02294921875, 2, 3],
    "official/max_softmax/s1": [0.016962624899277277, 0.9576045310677994, 3],
    "official_components/max_softmax/s1": [0.0, 2, 3],
    "pixels/max_softmax/s2": [0.3479602161936665, 0.012180155510458106, 0.9519294468367009,
                              24152, 424, 0.3755012386235568, 3],
    "class_sums/max_softmax/s2": 21852.42591136694,
    "components/max_softmax/s2": [0.0, 0.02587890625, 0.017252604166666668, 2, 3],
    "official/max_softmax/s2": [0.012113029499979668, 0.9508529314342498, 3],
    "official_components/max_softmax/s2": [0.0, 2, 3],
    "pixels/entropy/s1": [0.3259143182545843, 0.01570027714621124, 0.9951690821256038,
                          24012, 564, 0.40276243006777, 3],
    "class_sums/entropy/s1": 23152.760938823223,
    "components/entropy/s1": [0.0, 0.034423828125, 0.02294921875, 2, 3],
    "official/entropy/s1": [0.015477667335767914, 0.9940029985007496, 3],
    "official_components/entropy/s1": [0.0, 2, 3],
    "pixels/entropy/s2": [0.28829573667089564, 0.01114803473601135, 0.9756955945677377,
                          24152, 424, 0.29296964161432104, 3],
    "class_sums/entropy/s2": 23369.59352248907,
    "components/entropy/s2": [0.0, 0.02587890625, 0.017252604166666668, 2, 3],
    "official/entropy/s2": [0.010935521339098968, 0.9708098708181517, 3],
    "official_components/entropy/s2": [0.0, 2, 3],
    "quality/s1": [24012, 1116, 0.053272083431467415, 0.9681495977448392, 24012, 3],
    "quality/s2": [24152, 1411, 0.03679091090403692, 0.9650606659012081, 24152, 3],
    "examples": [("s1", 0, "classes", 1623.0), ("s1", 0, "image", 65319.0), ("s1", 0, "ood_mask", 4.0),
                 ("s1", 0, "score_entropy", 233.85233759880066), ("s1", 0, "score_max_softmax", 218.1521733403206),
                 ("s1", 0, "semantic", 2075.0), ("s2", 0, "classes", 2216.0), ("s2", 0, "image", 84224.0),
                 ("s2", 0, "ood_mask", 6.0), ("s2", 0, "score_entropy", 235.01048189401627),
                 ("s2", 0, "score_max_softmax", 219.2976474761963), ("s2", 0, "semantic", 2254.0)],
}


def numbers(ev):
    """What a run's report is computed from, part by part (the keys of FLAT_STATE_NUMBERS)."""
    out = {}
    for (m, s), acc in ev.acc.items():
        r = acc.compute()
        out[f"pixels/{m}/{s}"] = [r["auroc"], r["auprc"], r["fpr95"], r["n_id"], r["n_ood"],
                                  r["per_image_mean"]["auroc"], len(acc.images)]
        out[f"class_sums/{m}/{s}"] = float(ev.class_sum[(m, s)].sum())
        c = ev.comp[(m, s)].compute()
        out[f"components/{m}/{s}"] = [c["f1_star"], c["siou"], c["ppv"], c["n_gt_components"], c["n_pred_components"]]
        o = ev.official_acc[(m, s)].compute()
        out[f"official/{m}/{s}"] = [o["auprc"], o["fpr95"], o["n_frames"]]
        oc = ev.official_comp[(m, s)].compute()
        out[f"official_components/{m}/{s}"] = [oc["f1_star"], oc["n_gt_components"], oc["n_pred_components"]]
    for s in ev.set_names:
        cal = ev.calibration[s].compute()
        out[f"quality/{s}"] = [int(ev.confusion[s].sum()), int(np.trace(ev.confusion[s])), cal["ece"], cal["brier"],
                               int(ev.class_count[s].sum()), ev.images[s]]
    out["examples"] = sorted((s, i, k, float(np.asarray(v, np.float64).sum()))
                             for (s, i), ex in ev.examples.items() for k, v in ex.items())
    return out


@pytest.mark.filterwarnings("ignore", category=UndefinedMetricWarning)
def test_a_flat_state_file_loads_to_the_same_numbers(tmp_path):
    ev = Evaluation.load(FIXTURES / "flat_state.npz")
    assert numbers(ev) == FLAT_STATE_NUMBERS
    assert (ev.method_names, ev.set_names, ev.quality, ev.official) == (["max_softmax", "entropy"], ["s1", "s2"],
                                                                         True, "smiyc")
    assert ev.done == ev.images == {"s1": 3, "s2": 3} and ev.model_output["classes"] == 19
    ev.save(tmp_path / "state.npz")  # saved again (in today's format), the same numbers
    assert numbers(Evaluation.load(tmp_path / "state.npz")) == FLAT_STATE_NUMBERS


# ---- the contract: one merge, one all-reduce -----------------------------------------------------------------------

def _joint(k1, v1, k2, v2):
    """A table of distinct keys and their counts, merged (the literal way)."""
    table = {}
    for keys, values in ((k1, v1), (k2, v2)):
        for k, v in zip(keys.tolist(), values.tolist()):
            table[k] = table.get(k, 0) + v
    keys = sorted(table)
    return np.array(keys, np.int64), np.array([table[k] for k in keys], np.int64)


REDUCTIONS = {"n": "sum", "high": "max", "all": "min", "mine": "local", "rows": "cat", "offsets": "offsets",
              "values": "cat", ("keys", "counts"): _joint}


def _state(rank):
    """A state of every kind of key; rank 1's counts pass 2^53 (exact only as int64) and its rows are wider."""
    rows = [np.array([1.5, 2.5], np.float32), np.array([0.1, 0.2, 0.3])][rank]
    return {"format": np.array("test/1"), "n": np.array([3, 1 << 60][rank], np.int64) + np.arange(3),
            "high": np.array([2.0, 7.0][rank]), "all": np.array([True, False][rank]), "mine": np.array(rank),
            "rows": rows, "offsets": np.array([[0, 1, 2], [0, 3]][rank], np.int64),
            "values": np.full((1 + rank, 2), rank),
            "keys": np.array([[1, 4], [4, 9, 12]][rank], np.int64),
            "counts": np.array([[1, 1], [2, 3, 4]][rank], np.int64)}


def test_merge_states_combines_each_key_by_its_reduction():
    merged = merge_states(_state(0), _state(1), REDUCTIONS)
    assert merged["n"].tolist() == [3 + (1 << 60), 5 + (1 << 60), 7 + (1 << 60)] and merged["n"].dtype == np.int64
    assert merged["high"] == 7.0 and not merged["all"] and merged["mine"] == 0 and str(merged["format"]) == "test/1"
    assert merged["rows"].dtype == np.float64 and merged["rows"].tolist() == [1.5, 2.5, 0.1, 0.2, 0.3]
    assert merged["offsets"].tolist() == [0, 1, 2, 5] and merged["values"].shape == (3, 2)
    assert merged["keys"].tolist() == [1, 4, 9, 12] and merged["counts"].tolist() == [1, 3, 3, 4]
    with pytest.raises(ValueError, match="different configurations: 'format'"):
        merge_states(_state(0), {**_state(1), "format": np.array("test/2")}, REDUCTIONS)
    assert merge_states({"only": np.array(1)}, {"other": np.array(2)}, {}) == {"only": 1, "other": 2}


def test_a_tree_of_parts_flattens_to_paths_and_back():
    acc = FloatOrderAccumulator().update(np.array([0.1, 0.7]), np.array([0, 1], np.uint8))
    state, reductions = flatten({"pixels": {("a|b", "s"): acc}, "sums": {"s": np.zeros(2)}, "meta": "x"},
                                {"sums": "sum"})
    assert state["pixels/a|b/s/counts"].shape == acc.counts.shape and reductions["sums/s"] == "sum"
    assert reductions["meta"] == "same" and reductions[("pixels/a|b/s/binades", "pixels/a|b/s/counts")]
    tree = unflatten(state)
    assert FloatOrderAccumulator.from_state_dict(tree["pixels"]["a|b"]["s"]).compute()["auroc"] == 1.0


def _batch(rng, n):
    semantic = torch.from_numpy(rng.integers(0, 19, (n, 6, 8)).astype(np.uint8))
    ood = torch.from_numpy(rng.integers(0, 2, (n, 6, 8)).astype(np.uint8))
    image = torch.from_numpy(rng.integers(0, 256, (n, 3, 6, 8)).astype(np.uint8))
    return {"image": image, "ood_mask": ood, "semantic": semantic}, {"m|1": torch.from_numpy(rng.random((n, 6, 8)))}


def test_merged_shards_equal_one_run_and_names_may_hold_a_bar(tmp_path):
    rng = np.random.default_rng(0)
    batches = [_batch(rng, 2) for _ in range(2)]
    whole, shards = Evaluation(["m|1"], ["s|1"]), [Evaluation(["m|1"], ["s|1"]) for _ in range(2)]
    for k, (batch, scores) in enumerate(batches):
        for ev in (whole, shards[k]):
            ev.process("s|1", [2 * k, 2 * k + 1], batch, scores)
    merged = shards[0].merge(shards[1])
    expected = whole.arrays()
    assert set(merged.arrays()) == set(expected)
    for key, value in merged.arrays().items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)
    whole.save(tmp_path / "state.npz")
    assert Evaluation.load(tmp_path / "state.npz").acc[("m|1", "s|1")].compute()["auroc"] == \
        whole.acc[("m|1", "s|1")].compute()["auroc"]
    with pytest.raises(ValueError, match="free of '/'"):
        Evaluation(["a/b"], ["s"])
    with pytest.raises(ValueError, match="different configurations: 'meta'"):
        whole.merge(Evaluation(["m|1"], ["s|2"]))


def _all_reduce_worker(rank, world, out_dir):
    np.savez(f"{out_dir}/reduced{rank}.npz", **all_reduce_state(_state(rank), REDUCTIONS))


def test_all_reduce_state_equals_merging_the_ranks_states_in_rank_order(tmp_path):
    run_in_group(_all_reduce_worker, str(tmp_path))
    expected = merge_states(_state(0), _state(1), REDUCTIONS)
    for rank in range(2):
        with np.load(tmp_path / f"reduced{rank}.npz") as reduced:
            for key, value in expected.items():
                want = _state(rank)[key] if key == "mine" else value
                assert reduced[key].dtype == want.dtype, key
                np.testing.assert_array_equal(reduced[key], want, err_msg=key)


def test_exact_total_equals_the_sum_of_python_integers():
    from segood.metrics.state import exact_total

    rng = np.random.default_rng(35)
    for counts in (rng.integers(0, 1 << 58, 1000, dtype=np.int64), np.full((3, 2, 7), 1 << 58, np.uint64),
                   rng.integers(0, 5, (4, 2, 16)).astype(np.int32), np.zeros(0, np.int64)):
        assert exact_total(counts) == sum(int(v) for v in counts.ravel())
