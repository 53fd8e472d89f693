"""The public benchmarks a converted set belongs to, read from its source (the adapter that converted it): each
benchmark's headline metrics (what the summary of a run shows first) and its own names for its splits (the
folders ``segood export`` writes in its layouts).

SegmentMeIfYouCan (RoadAnomaly21, RoadObstacle21, LostAndFound), Fishyscapes and Road Anomaly (as later work
reports it) rank methods by AUPRC (their "AP") and FPR95; CAOS (StreetHazards, BDD-Anomaly) prints AUROC, AUPR
and FPR95; every other set (the paper's: SUN pasted objects, noise, mixes) by AUROC.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """A public benchmark: its ``label`` in tables and its ``headline`` metrics (names of
    :data:`segood.metrics.METRICS`, the first first)."""

    label: str
    headline: tuple


SMIYC = Benchmark("SegmentMeIfYouCan", ("auprc", "fpr95"))
FISHYSCAPES = Benchmark("Fishyscapes", ("auprc", "fpr95"))
CAOS = Benchmark("CAOS", ("auroc", "auprc", "fpr95"))
ROAD_ANOMALY = Benchmark("Road Anomaly", ("auprc", "fpr95"))
PAPER = Benchmark("the paper's protocol", ("auroc",))

#: {source: the benchmark its sets belong to}; a source not listed is the paper's.
BY_SOURCE = {"smiyc_roadanomaly21": SMIYC, "smiyc_roadobstacle21": SMIYC, "lostandfound": SMIYC,
             "fishyscapes_laf": FISHYSCAPES, "fishyscapes_static": FISHYSCAPES, "streethazards": CAOS,
             "bdd_anomaly": CAOS, "road_anomaly": ROAD_ANOMALY, "road_obstacles_v0": ROAD_ANOMALY}

#: {export layout: {source: the folder the benchmark's own code reads a split's maps from, with ``{split}``}}:
#: SegmentMeIfYouCan's ``name_for_persistence`` (``road_anomaly_benchmark``'s datasets: every RoadAnomaly21 split
#: is stored under ``AnomalyTrack-all``, every RoadObstacle21 one under ``ObstacleTrack-all``, testNoKnown under
#: ``LostAndFound-test``), Fishyscapes' names of its ``LostAndFound`` and ``Static`` sets.
SPLIT_NAMES = {
    "smiyc": {"smiyc_roadanomaly21": "AnomalyTrack-all", "smiyc_roadobstacle21": "ObstacleTrack-all",
              "lostandfound": "LostAndFound-{folder}"},
    "fishyscapes": {"fishyscapes_laf": "LostAndFound", "fishyscapes_static": "Static"},
}


def benchmark_of(ood_sources):
    """The :class:`Benchmark` of a set with these OOD sources (its identity's ``ood_sources``: a mix of ID frames
    and a benchmark's OOD frames belongs to that benchmark); :data:`PAPER` for any other."""
    found = {BY_SOURCE[s] for s in ood_sources or () if s in BY_SOURCE}
    return found.pop() if len(found) == 1 else PAPER


def headline_metrics(ood_sources, metrics):
    """``metrics`` (names) reordered: the headline metrics of the set's benchmark first, the others after in
    their order."""
    first = [m for m in benchmark_of(ood_sources).headline if m in metrics]
    return first + [m for m in metrics if m not in first]


def split_name(manifest, layout):
    """The folder a benchmark's own code reads the score maps of a converted set (its ``manifest``) from in an
    export ``layout`` ("smiyc" or "fishyscapes"), e.g. ``AnomalyTrack-all`` for SMIYC's RoadAnomaly21 validation
    split; None where the set is none of a benchmark's splits (another source, a mix)."""
    if layout == "smiyc" and manifest.get("source") == "fishyscapes_laf":
        raise ValueError("SegmentMeIfYouCan reads the maps of Fishyscapes Lost & Found from its LostAndFound-train "
                         "and -test folders, by LostAndFound frame id: export the LostAndFound train and test sets "
                         "in the smiyc layout, or this set in the fishyscapes layout")
    pattern = SPLIT_NAMES.get(layout, {}).get(manifest.get("source"))
    split = manifest.get("split")
    return pattern.format(folder="test" if split == "testNoKnown" else split) if pattern else None
