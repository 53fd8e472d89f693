"""``make test-fast`` (``pytest -m fast``): the unit tests of the metric engine, the statistics, the command
line's start-up and the documentation, which need no network, model or generated dataset tree. The tests of
these files are marked ``fast``, but for the slowest (named in SLOW_NAMES); ``make test`` runs
everything."""

from pathlib import Path

import pytest

FAST_FILES = {"test_metrics.py", "test_float_order.py", "test_metric_arrays.py", "test_exact.py", "test_bootstrap.py",
              "test_calibration.py", "test_components.py", "test_architecture.py", "test_cli_startup.py",
              "test_docs.py"}
# Tests of those files that run an evaluation, start processes or count on the 65536-threshold grid (seconds
# each): make test only.
SLOW_NAMES = ("all_reduce", "evaluation", "a_run", "command_line", "combined_runs", "-65536-")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).name in FAST_FILES and not any(part in item.name for part in SLOW_NAMES):
            item.add_marker(pytest.mark.fast)


def pytest_ignore_collect(collection_path, config):
    """With ``-m fast``, the other test files are not even imported (their imports cost seconds)."""
    if config.getoption("markexpr") == "fast" and collection_path.name.startswith("test_"):
        return collection_path.name not in FAST_FILES or None
    return None
