"""Argument types of the command line: a value out of range is argparse's one-line usage error, naming the option,
rather than a traceback (or a silent fallback) deep in the run."""

import argparse
import math
import re


def positive_int(text):
    """An integer of at least 1 (a count, a batch size, a size)."""
    return _checked(int, text, lambda v: v >= 1, "a positive integer")


def natural(text):
    """An integer of at least 0 (a seed, a number of workers or resamples)."""
    return _checked(int, text, lambda v: v >= 0, "an integer of at least 0")


def positive_float(text):
    """A finite number above 0 (a learning rate, a step)."""
    return _checked(float, text, lambda v: 0 < v < math.inf, "a finite number above 0")


def non_negative_float(text):
    """A finite number of at least 0 (a standard deviation)."""
    return _checked(float, text, lambda v: 0 <= v < math.inf, "a finite number of at least 0")


def device(text):
    """A torch device of this machine, TYPE or TYPE:INDEX (cpu, cuda, cuda:1, mps, ...)."""
    from segood.models.network import check_device

    _checked(str, text, lambda v: re.fullmatch(r"[a-z][a-z0-9_]*(:(0|[1-9][0-9]*))?", v) is not None,
             "a device such as cpu, cuda or cuda:1")
    try:
        return check_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("device (--device) ")) from None


def _checked(kind, text, ok, rule):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value
