"""Shared test setup: converted noise sets built once per session, a small converted Cityscapes-format set for
the tests that damage it, and ``make test-fast`` (``pytest -m fast``): the unit tests of the metric engine, the
statistics, the command line's start-up and the documentation, which need no network, model or generated dataset
tree. The tests of those files are marked ``fast``, but for the slowest (named in SLOW_NAMES); ``make test`` runs
everything."""

import inspect
import shutil
from pathlib import Path

import pytest

from rawtrees import cityscapes_tree, mixed_noise_sets


@pytest.fixture(scope="session")
def noise_sets(tmp_path_factory):
    """A factory: ``noise_sets(**params)`` is the root of ``mixed_noise_sets(root, **params)``, built once per
    distinct set of parameters (defaults filled in) in its own folder and shared by every test of the session.

    The shared root is read-only: a test that writes next to the sets (a benchmark, a run folder, a converted
    copy) passes ``copy_to``, a folder that must not exist yet, and gets a private copy there. At the end of the
    session every shared root must hold what it held when built, file for file."""
    signature = inspect.signature(mixed_noise_sets)
    built = {}

    def make(*, copy_to=None, **params):
        bound = signature.bind(None, **params)
        bound.apply_defaults()
        key = tuple(sorted((name, tuple(value) if isinstance(value, (list, tuple)) else value)
                           for name, value in bound.arguments.items() if name != "root"))
        if key not in built:
            root = mixed_noise_sets(tmp_path_factory.mktemp("noise_sets"), **params)
            built[key] = root, listing(root)
        if copy_to is None:
            return built[key][0]
        shutil.copytree(built[key][0], copy_to)
        return copy_to

    yield make
    for root, before in built.values():
        changed = sorted(set(before.items()) ^ set(listing(root).items()))
        assert not changed, f"tests wrote into the shared sets under {root}: {changed[:5]}; a test that writes " \
            "beside its sets takes a private copy with noise_sets(..., copy_to=FOLDER)"


def listing(root):
    """Every file under ``root`` with its size and modification time."""
    return {path.relative_to(root).as_posix(): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in root.rglob("*") if path.is_file()}


@pytest.fixture()
def small_set(tmp_path):
    """A converted Cityscapes-format set of three frames."""
    from segood.data import Cityscapes, convert

    frames = [("aachen", "000000", f"{k:06d}") for k in range(3)]
    cityscapes_tree(tmp_path / "cs", frames=frames)
    convert(Cityscapes(tmp_path / "cs"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    return tmp_path / "cs.h5"

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
