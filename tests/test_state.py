"""The run's state as a tree of parts: a state file of the flat format before it still loads to the same numbers."""

from pathlib import Path

import numpy as np
import pytest

from segood.evaluation.runner import Evaluation
from segood.metrics import UndefinedMetricWarning

FIXTURES = Path(__file__).parent / "fixtures"

# the numbers of tests/fixtures/flat_state.npz (tests/fixtures/make_flat_state.py), as the flat format's reader gave them
FLAT_STATE_NUMBERS = {
    "pixels/max_softmax/s1": [0.3922785209050321, 0.017117081601732764, 0.9593536565050808, 24012, 564, 0.41614505539917457, 3],
    "class_sums/max_softmax/s1": 21616.830729663372,
    "components/max_softmax/s1": [0.0, 0.034423828125, 0.02294921875, 2, 3],
    "official/max_softmax/s1": [0.016962624899277277, 0.9576045310677994, 3],
    "official_components/max_softmax/s1": [0.0, 2, 3],
    "pixels/max_softmax/s2": [0.3479602161936665, 0.012180155510458106, 0.9519294468367009, 24152, 424, 0.3755012386235568, 3],
    "class_sums/max_softmax/s2": 21852.42591136694,
    "components/max_softmax/s2": [0.0, 0.02587890625, 0.017252604166666668, 2, 3],
    "official/max_softmax/s2": [0.012113029499979668, 0.9508529314342498, 3],
    "official_components/max_softmax/s2": [0.0, 2, 3],
    "pixels/entropy/s1": [0.3259143182545843, 0.01570027714621124, 0.9951690821256038, 24012, 564, 0.40276243006777, 3],
    "class_sums/entropy/s1": 23152.760938823223,
    "components/entropy/s1": [0.0, 0.034423828125, 0.02294921875, 2, 3],
    "official/entropy/s1": [0.015477667335767914, 0.9940029985007496, 3],
    "official_components/entropy/s1": [0.0, 2, 3],
    "pixels/entropy/s2": [0.28829573667089564, 0.01114803473601135, 0.9756955945677377, 24152, 424, 0.29296964161432104, 3],
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
