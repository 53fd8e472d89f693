"""Every dataset adapter by name: ``segood convert NAME``, ``tools/convert.py NAME`` and :func:`get_adapter`.

Each adapter registers itself with ``@register_adapter`` beside its definition; importing its module here makes
it known (``docs/extending.md``).
"""

# Each module registers its adapters as it is imported.
from segood.data import (bdd_anomaly, cityscapes, fishyscapes, idd, lostandfound, noise, paste,  # noqa: F401
                         road_anomaly, smiyc, streethazards, sun)
from segood.data.adapter import ADAPTERS, register_adapter

__all__ = ["ADAPTERS", "get_adapter", "list_adapters", "register_adapter"]


def get_adapter(name):
    """The adapter class registered as ``name``; KeyError listing the valid names."""
    return ADAPTERS[name]


def list_adapters():
    """The names of the registered adapters, in registration order."""
    return list(ADAPTERS)
