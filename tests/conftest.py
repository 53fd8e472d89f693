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
