"""Running a test module's ``__main__`` part under Triton's interpreter (TRITON_INTERPRET=1, which Triton reads
when it makes a kernel), so that a Triton kernel runs on CPU tensors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_under_triton_interpreter(test_file, timeout=900):
    """The standard output of ``python test_file`` with TRITON_INTERPRET=1 (skipped where Triton does not import);
    fails the test with the end of its output where the run fails."""
    pytest.importorskip("triton", reason="Triton does not import here; its kernels cannot run")
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(test_file)], capture_output=True, text=True, timeout=timeout, cwd=root,
                         env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout
