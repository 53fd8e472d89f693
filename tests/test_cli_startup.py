"""``segood --help`` starts without the heavy libraries, the command line's name tuples match the registries,
and no segood import lets albumentations ask the package index for updates."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "albumentations", "h5py", "numba", "cv2", "segood.robustness", "segood.methods", "segood.data")


def run_python(code, **env):
    """Runs ``code`` in a fresh interpreter that imports this checkout's segood; its stdout."""
    environ = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")]), **env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
    return done.stdout


HELP = """
import json, sys
from segood.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("\\n" + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["evaluate", "--help"], ["robustness", "--help"],
                                  ["attack", "--help"], ["train", "--help"], ["leaderboard", "--help"],
                                  ["convert", "--help"]])
def test_help_imports_no_heavy_library(argv):
    out = run_python(HELP.format(argv=argv, heavy=HEAVY))
    assert json.loads(out.splitlines()[-1]) == []
    assert "segood" in out


def test_import_segood_alone_reaches_every_subpackage_and_imports_none():
    """``segood.models.load_model(...)`` after ``import segood`` (as the README writes it), with nothing heavy
    imported until a subpackage is asked for."""
    import segood

    code = ("import json, sys, segood\n"
            f"before = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
            "reached = [callable(segood.models.load_model), callable(segood.metrics.make_accumulator), "
            "callable(segood.data.convert)]\n"
            "print(json.dumps([before, reached, [getattr(segood, n).__name__ for n in segood.SUBPACKAGES]]))")
    before, reached, names = json.loads(run_python(code).splitlines()[-1])
    assert before == [] and reached == [True, True, True]
    assert names == [f"segood.{n}" for n in segood.SUBPACKAGES]
    assert sorted(p.name for p in (ROOT / "segood").iterdir() if (p / "__init__.py").exists()) == \
        sorted(segood.SUBPACKAGES)  # every subpackage is listed


def test_help_still_lists_the_registries_names():
    out = run_python(HELP.format(argv=["robustness", "--help"], heavy=HEAVY))
    assert "c:gaussian_noise" in out and "sun_flare" in out
    out = run_python(HELP.format(argv=["evaluate", "--help"], heavy=HEAVY))
    assert "max_softmax" in out and "mahalanobis" in out


def test_convert_help_lists_every_adapter():
    from segood.data.registry import ADAPTERS

    out = run_python(HELP.format(argv=["convert", "--help"], heavy=()))
    assert all(name in out for name in ADAPTERS)
    out = run_python(HELP.format(argv=["convert", "cityscapes", "--help"], heavy=()))
    assert "root" in out


def test_name_tuples_match_the_registries():
    from segood import names
    from segood.data.paste import BLENDS, HEIGHT_RATIO
    from segood.data.registry import ADAPTERS
    from segood.methods import METHODS
    from segood.metrics import METRICS
    from segood.metrics.official import BENCHMARKS
    from segood.metrics.thresholds import RULES
    from segood.models import ARCHS, HEADS, INFERENCE_MODES, list_model_types
    from segood.models.train import OE_LOSSES, TrainConfig
    from segood.robustness import FAMILIES, STANDARD_SIZES, corruption_names

    assert names.METHODS == tuple(METHODS)
    assert names.METRICS == tuple(METRICS)
    assert names.THRESHOLD_RULES == tuple(RULES)
    assert names.OFFICIAL == BENCHMARKS
    assert (names.ARCHS, names.HEADS) == (tuple(ARCHS), tuple(HEADS))
    assert names.OE_LOSSES == tuple(OE_LOSSES)
    assert names.TRAIN_DEFAULTS == {name: getattr(TrainConfig("t", "o"), name) for name in names.TRAIN_DEFAULTS}
    assert (names.FAMILIES, names.STANDARD_SIZES) == (tuple(FAMILIES), tuple(STANDARD_SIZES))
    assert names.CORRUPTIONS == corruption_names("segood")
    assert names.STANDARD_CORRUPTIONS == corruption_names("standard")
    assert (names.BLENDS, names.HEIGHT_RATIO) == (tuple(BLENDS), tuple(HEIGHT_RATIO))
    assert (names.MODEL_TYPES, names.INFERENCE_MODES) == (tuple(list_model_types()), tuple(INFERENCE_MODES))
    assert names.ADAPTERS == {name: adapter.help for name, adapter in ADAPTERS.items()}


NETWORK_GUARD = """
import json, urllib.request
calls = []
def refuse(self, *args, **kwargs):
    calls.append(str(args[0]) if args else "?")
    raise OSError("no network in this test")
urllib.request.OpenerDirector.open = refuse
{imports}
print(json.dumps(calls))
"""


def test_albumentations_makes_no_network_access_under_segood():
    code = NETWORK_GUARD.format(imports="import segood.robustness.corruptions, albumentations")
    assert json.loads(run_python(code).splitlines()[-1]) == []


def test_the_network_guard_sees_albumentations_update_check():
    """The check above can fail: albumentations imported without segood asks the index (caught by the guard)."""
    pytest.importorskip("albumentations.check_version", reason="this albumentations has no update check")
    code = NETWORK_GUARD.format(imports="import albumentations")
    assert json.loads(run_python(code).splitlines()[-1]) != []
