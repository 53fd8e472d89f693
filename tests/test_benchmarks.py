"""The benchmark scripts still run against the current API (at toy sizes; their timings are not checked here:
timings belong in benchmarks/ and the README)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("script,args", [
    ("bench_metrics.py", ["--images", "1", "--height", "32", "--width", "64", "--repeat", "1", "--skip-slow"]),
    ("bench_intervals.py", ["--methods", "2", "--sets", "1", "--images", "5", "--resamples", "20"]),
    ("bench_board.py", ["--submissions", "2", "--frames", "2", "--height", "32", "--width", "64", "--components",
                        "obstacle"]),
    ("bench_evaluate.py", ["--frames", "2", "--height", "64", "--width", "128", "--device", "cpu"]),
    ("bench_score.py", ["--frames", "2", "--height", "64", "--width", "128", "--repeat", "1"]),
    ("bench_device_histogram.py", ["--images", "2", "--height", "32", "--width", "64", "--repeat", "1"]),
    ("bench_gil.py", ["--images", "1", "--height", "32", "--width", "64", "--repeat", "1"]),
    ("bench_malloc.py", ["--sizes", "32x64", "--rounds", "1", "--encoder", "resnet18"]),
    ("bench_pipeline.py", ["--frames", "4", "--height", "32", "--width", "64", "--repeat", "1", "--profile",
                           "--many", "2", "--reading"]),
])
def test_a_benchmark_runs_at_a_toy_size(script, args, tmp_path):
    option = {"bench_evaluate.py": "--workdir", "bench_board.py": "--work", "bench_pipeline.py": "--workdir",
              "bench_score.py": "--workdir"}.get(script)
    args = [*args, option, str(tmp_path / "work")] if option else args
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), done.stderr[-3000:]
