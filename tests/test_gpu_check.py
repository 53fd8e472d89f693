"""The GPU check's dry run: the same script on the CPU at tiny sizes, so that it never rots before a GPU run."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] and set(report["checks"]) == {"accumulator_counts", "methods_device_vs_cpu",
                                                            "amp_training", "distributed_evaluate", "overlap",
                                                            "blocks"}
    assert all(check["passed"] for check in report["checks"].values()), report["checks"]
    throughput = report["throughput"]
    assert set(throughput["methods"]["per_method"]) == {"max_softmax", "odin", "entropy", "mahalanobis", "varsum",
                                                        "mutual_info", "confidence"}
    assert throughput["accumulators"]["floor_ms"] > 0 and throughput["evaluate"]["images_per_s"] > 0
    pipeline = throughput["pipeline"]
    assert [(r["precision"], r["batch"], r["overlap"], r["blocks"]) for r in pipeline["rows"]] == [
        ("fp32", 1, True, "pinned"), ("fp32", 1, True, "registered"), ("fp32", 2, True, "pinned"),
        ("fp32", 2, True, "registered"), ("bf16", 1, True, "pinned"), ("bf16", 1, True, "registered"),
        ("bf16", 2, True, "pinned"), ("bf16", 2, True, "registered"), ("fp32", 2, False, "pinned"),
        ("bf16", 2, False, "pinned"), ("fp32", 2, False, "registered"), ("fp32", 2, False, "pageable"),
        ("fp32", 2, True, "pageable"), ("fp32", 2, True, "registered"), ("bf16", 2, True, "registered")]
    assert [r["counting"] for r in pipeline["rows"]] == ["triton"] * 13 + ["cuda"] * 2
    assert all({"data", "forward", "accumulate"} <= set(r["stages_ms_per_frame"]) for r in pipeline["rows"])
    assert all(r["forward_ms_per_frame"] > 0 and r["evaluate_ms_per_frame_with_startup"] > 0
               and np.isfinite(r["readers_page_faults_per_frame_warm"]) for r in pipeline["rows"])
    assert throughput["robustness"]["clean_and_one_condition_ms_per_frame"] > 0
    effect = throughput["amp_effect"]
    assert len(effect["rows"]) == 4 * 4 * 3 and 0 <= effect["largest_difference"] < 0.1
    assert len(report["targets"]) == 4 and "| target | met |" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_gpu_check_refuses_a_missing_device(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0 and "no CUDA device here; run with --dry-run" in run.stderr
