"""The two threshold grids, named in one place: the float-order grid (the default) and the paper's linear one.

A grid is a plain dict, recorded in run files and benchmark files: ``{"kind": "float", "mantissa_bits": m}`` or
``{"kind": "linear", "num_thresholds": T, "score_range": [lo, hi]}``.
"""

from segood.metrics.accumulator import STATE_FORMAT as LINEAR_FORMAT
from segood.metrics.accumulator import LinearGridAccumulator
from segood.metrics.float_order import DEFAULT_MANTISSA_BITS
from segood.metrics.float_order import STATE_FORMAT as FLOAT_FORMAT
from segood.metrics.float_order import FloatOrderAccumulator


def grid_spec(num_thresholds=None, score_range=None, mantissa_bits=None):
    """The grid asked for: the linear grid (the paper's) iff ``num_thresholds`` or ``score_range`` is given
    (defaults 400 and (0, 1)), else the float-order grid at ``mantissa_bits`` (default 10)."""
    if num_thresholds is not None or score_range is not None:
        if mantissa_bits is not None:
            raise ValueError("choose one grid: the linear one (num_thresholds, score_range) or the float-order one "
                             "(mantissa_bits), not both")
        return {"kind": "linear", "num_thresholds": int(400 if num_thresholds is None else num_thresholds),
                "score_range": [float(v) for v in (score_range or (0.0, 1.0))]}
    return {"kind": "float", "mantissa_bits": int(DEFAULT_MANTISSA_BITS if mantissa_bits is None else mantissa_bits)}


def describe_grid(grid):
    """The grid in words: "400 linear thresholds on [0, 1]" or "the float-order grid at 10 mantissa bits"."""
    if grid["kind"] == "linear":
        lo, hi = grid["score_range"]
        return f"{grid['num_thresholds']} linear thresholds on [{lo:g}, {hi:g}]"
    return f"the float-order grid at {grid['mantissa_bits']} mantissa bits"


def make_accumulator(grid=None, *, per_image=False):
    """An empty accumulator on ``grid`` (a :func:`grid_spec` dict; None: the default float-order grid)."""
    grid = grid or grid_spec()
    if grid["kind"] == "linear":
        return LinearGridAccumulator(grid["num_thresholds"], tuple(grid["score_range"]), per_image=per_image)
    if grid["kind"] == "float":
        return FloatOrderAccumulator(grid["mantissa_bits"], per_image=per_image)
    raise ValueError(f"unknown grid {grid!r}: 'kind' must be 'float' or 'linear'")


def grid_of(acc):
    """The :func:`grid_spec` dict of an accumulator."""
    if isinstance(acc, FloatOrderAccumulator):
        return {"kind": "float", "mantissa_bits": acc.mantissa_bits}
    return {"kind": "linear", "num_thresholds": acc.num_thresholds, "score_range": list(acc.score_range)}


def accumulator_from_state(state):
    """Rebuild either accumulator from its ``state_dict`` (the format entry says which)."""
    import numpy as np

    if "format" not in state:
        raise ValueError("accumulator state lacks 'format': it was not written by a segood accumulator's state_dict()")
    form = str(np.asarray(state["format"]))
    if form == FLOAT_FORMAT:
        return FloatOrderAccumulator.from_state_dict(state)
    if form == LINEAR_FORMAT:
        return LinearGridAccumulator.from_state_dict(state)
    raise ValueError(f"unknown accumulator state format {form!r}; expected {FLOAT_FORMAT!r} or {LINEAR_FORMAT!r}")


def load_accumulator(path):
    """Either accumulator from a file written by its ``save`` (never unpickles); errors name the file."""
    from segood.io import read_npz

    try:
        return accumulator_from_state(read_npz(path, "accumulator state"))
    except (ValueError, KeyError) as err:
        raise ValueError(f"{path}: {err}") from None
