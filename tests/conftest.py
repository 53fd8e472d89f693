"""Fixtures shared by the test files: converted noise sets built once per session, and a small converted
Cityscapes-format set for the tests that damage it."""

import inspect
import shutil

import pytest

from rawtrees import cityscapes_tree, mixed_noise_sets


@pytest.fixture(scope="session")
def noise_sets(tmp_path_factory):
    """A factory: ``noise_sets(**params)`` is the root of ``mixed_noise_sets(root, **params)``, built once per
    distinct set of parameters (defaults filled in) in its own folder and shared by every test of the session.

    The shared root is read-only by contract: a test that writes next to the sets (a benchmark, a run folder,
    a converted copy) passes ``copy_to``, a folder that must not exist yet, and gets a private copy there."""
    signature = inspect.signature(mixed_noise_sets)
    built = {}

    def make(*, copy_to=None, **params):
        bound = signature.bind(None, **params)
        bound.apply_defaults()
        key = tuple(sorted((name, tuple(value) if isinstance(value, (list, tuple)) else value)
                           for name, value in bound.arguments.items() if name != "root"))
        if key not in built:
            built[key] = mixed_noise_sets(tmp_path_factory.mktemp("noise_sets"), **params)
        if copy_to is None:
            return built[key]
        shutil.copytree(built[key], copy_to)
        return copy_to

    return make


@pytest.fixture()
def small_set(tmp_path):
    """A converted Cityscapes-format set of three frames."""
    from segood.data import Cityscapes, convert

    frames = [("aachen", "000000", f"{k:06d}") for k in range(3)]
    cityscapes_tree(tmp_path / "cs", frames=frames)
    convert(Cityscapes(tmp_path / "cs"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    return tmp_path / "cs.h5"
