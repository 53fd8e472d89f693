"""Every dataset adapter by name: ``segood convert NAME``, ``tools/convert.py NAME`` and :func:`get_adapter`.

A new adapter is its module plus one line here (``docs/extending.md``).
"""

from segood.data.bdd_anomaly import BDDAnomaly
from segood.data.cityscapes import Cityscapes
from segood.data.fishyscapes import FishyscapesLostAndFound, FishyscapesStatic
from segood.data.idd import IDD
from segood.data.lostandfound import LostAndFound
from segood.data.noise import Noise
from segood.data.paste import Paste
from segood.data.road_anomaly import RoadAnomaly, RoadObstaclesV0
from segood.data.smiyc import RoadAnomaly21, RoadObstacle21
from segood.data.streethazards import StreetHazards
from segood.data.sun import Sun

ADAPTERS = {cls.name: cls for cls in (Cityscapes, IDD, Sun, Noise, RoadAnomaly21, RoadObstacle21, LostAndFound,
                                      FishyscapesLostAndFound, FishyscapesStatic, StreetHazards, BDDAnomaly,
                                      RoadAnomaly, RoadObstaclesV0, Paste)}


def get_adapter(name):
    """The adapter class registered as ``name``; KeyError listing the valid names."""
    if name not in ADAPTERS:
        raise KeyError(f"unknown dataset adapter {name!r}; choose one of {sorted(ADAPTERS)}")
    return ADAPTERS[name]
