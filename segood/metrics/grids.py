"""The three threshold grids, named in one place: the float-order grid (the default), the paper's linear one, and
the exact one (every distinct score a threshold).

A grid is a plain dict, recorded in run files and benchmark files: ``{"kind": "float", "mantissa_bits": m}``,
``{"kind": "linear", "num_thresholds": T, "score_range": [lo, hi]}`` or ``{"kind": "exact", "max_pixels": n}``.
"""

from segood.metrics.accumulator import STATE_FORMAT as LINEAR_FORMAT
from segood.metrics.accumulator import LinearGridAccumulator
from segood.metrics.exact import DEFAULT_MAX_PIXELS
from segood.metrics.exact import STATE_FORMAT as EXACT_FORMAT
from segood.metrics.exact import ExactAccumulator
from segood.metrics.float_order import DEFAULT_MANTISSA_BITS
from segood.metrics.float_order import STATE_FORMAT as FLOAT_FORMAT
from segood.metrics.float_order import FloatOrderAccumulator

GRID_KINDS = ("float", "linear", "exact")


def grid_spec(num_thresholds: int | None = None, score_range: tuple[float, float] | None = None,
              mantissa_bits: int | None = None, *, kind: str | dict | None = None,
              max_pixels: int | None = None) -> dict:
    """The grid asked for. ``kind`` names it ("float", "linear" or "exact"; or is a whole grid dict, taken as it
    is); without it, the exact grid where ``max_pixels`` is given, the linear grid (the paper's) where
    ``num_thresholds`` or ``score_range`` is (defaults 400 and (0, 1)), else the float-order grid at
    ``mantissa_bits`` (default 10). The exact grid keeps at most ``max_pixels`` scores (default 2^28). Options of
    another grid than the one named are an error."""
    if isinstance(kind, dict):
        if any(v is not None for v in (num_thresholds, score_range, mantissa_bits, max_pixels)):
            raise ValueError(f"choose one grid: {kind!r} is a whole grid, with no further options")
        if kind.get("kind") not in GRID_KINDS:
            raise ValueError(f"unknown grid {kind!r}: 'kind' must be one of {', '.join(GRID_KINDS)}")
        return dict(kind)
    if kind is not None and kind not in GRID_KINDS:
        raise ValueError(f"unknown grid kind {kind!r}; choose one of {', '.join(GRID_KINDS)}")
    values = {"num_thresholds": num_thresholds, "score_range": score_range, "mantissa_bits": mantissa_bits,
              "max_pixels": max_pixels}
    given = {name for name, value in values.items() if value is not None}
    if kind is None:
        kind = "exact" if "max_pixels" in given else "linear" if given & {"num_thresholds", "score_range"} else "float"
    options = {"float": {"mantissa_bits"}, "linear": {"num_thresholds", "score_range"}, "exact": {"max_pixels"}}[kind]
    if given - options:
        raise ValueError(f"choose one grid: {', '.join(sorted(given - options))} belong to another grid than the "
                         f"{kind} one ({', '.join(sorted(options))})")
    if kind == "linear":
        return {"kind": "linear", "num_thresholds": int(400 if num_thresholds is None else num_thresholds),
                "score_range": [float(v) for v in (score_range or (0.0, 1.0))]}
    if kind == "exact":
        return {"kind": "exact", "max_pixels": int(DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels)}
    return {"kind": "float", "mantissa_bits": int(DEFAULT_MANTISSA_BITS if mantissa_bits is None else mantissa_bits)}


def describe_grid(grid):
    """The grid in words: "400 linear thresholds on [0, 1]", "the float-order grid at 10 mantissa bits" or "the
    exact grid (every distinct score a threshold)"."""
    if grid["kind"] == "linear":
        lo, hi = grid["score_range"]
        return f"{grid['num_thresholds']} linear thresholds on [{lo:g}, {hi:g}]"
    if grid["kind"] == "exact":
        return "the exact grid (every distinct score a threshold)"
    return f"the float-order grid at {grid['mantissa_bits']} mantissa bits"


def make_accumulator(grid: dict | None = None, *, per_image: bool = False):
    """An empty accumulator on ``grid`` (a :func:`grid_spec` dict; None: the default float-order grid)."""
    grid = grid or grid_spec()
    if grid["kind"] == "linear":
        return LinearGridAccumulator(grid["num_thresholds"], tuple(grid["score_range"]), per_image=per_image)
    if grid["kind"] == "float":
        return FloatOrderAccumulator(grid["mantissa_bits"], per_image=per_image)
    if grid["kind"] == "exact":
        return ExactAccumulator(max_pixels=grid["max_pixels"], per_image=per_image)
    raise ValueError(f"unknown grid {grid!r}: 'kind' must be one of {', '.join(GRID_KINDS)}")


def grid_of(acc):
    """The :func:`grid_spec` dict of an accumulator."""
    if isinstance(acc, FloatOrderAccumulator):
        return {"kind": "float", "mantissa_bits": acc.mantissa_bits}
    if isinstance(acc, ExactAccumulator):
        return {"kind": "exact", "max_pixels": acc.max_pixels}
    return {"kind": "linear", "num_thresholds": acc.num_thresholds, "score_range": list(acc.score_range)}


def accumulator_from_state(state):
    """Rebuild any accumulator from its ``state_dict`` (the format entry says which)."""
    import numpy as np

    if "format" not in state:
        raise ValueError("accumulator state lacks 'format': it was not written by a segood accumulator's state_dict()")
    form = str(np.asarray(state["format"]))
    readers = {FLOAT_FORMAT: FloatOrderAccumulator, LINEAR_FORMAT: LinearGridAccumulator,
               EXACT_FORMAT: ExactAccumulator}
    if form not in readers:
        raise ValueError(f"unknown accumulator state format {form!r}; expected one of {', '.join(map(repr, readers))}")
    return readers[form].from_state_dict(state)


def load_accumulator(path):
    """Any accumulator from a file written by its ``save`` (never unpickles); errors name the file."""
    from segood.io import read_npz

    try:
        return accumulator_from_state(read_npz(path, "accumulator state"))
    except (ValueError, KeyError) as err:
        raise ValueError(f"{path}: {err}") from None
