"""Judging a folder of submissions against a benchmark: recompute, never believe; one bad file never stops
the board. Outputs leaderboard.md, leaderboard.json and a self-contained index.html."""

import errno
import hashlib
import html
import io
import json
import math
import os
import re
import shutil
import tempfile
import unicodedata
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from segood.data.h5 import frame_ids, frame_sizes, ood_masks, read_array, read_manifest, set_identity
from segood.io import (atomic_write_bytes, atomic_write_text, exit_on_sigterm, make_folder, output_file,
                       write_json)
from segood.labels import IGNORE
from segood.leaderboard.maps import map_bytes, map_member, read_maps
from segood.leaderboard.safe import (Limits, MaintainerError, Rejected, is_map, load_npz, read_submission_files,
                                     strict_json)
from segood.leaderboard.submission import is_sha256, validate
from segood.metrics import (METRICS, UndefinedMetricWarning, accumulator_from_state, describe_grid, grid_spec,
                            make_accumulator)
from segood.metrics.streaming import OPTIONAL_STATE
from segood.metrics.bootstrap import COARSE_BITS, Bootstrap, coarse_keys, resampled_means, shifted_metrics, tied_ranks
from segood.metrics.components import PRESETS, ComponentAccumulator
from segood.metrics._kernels import BINADES
from segood.metrics.functional import metric_bounds
from segood.metrics.thresholds import commit

BENCHMARK_SCHEMA = "segood.benchmark/1"
TOLERANCE = 1e-6
COMPONENT_KEYS = ("siou", "ppv", "f1_star", "threshold")  # what the board shows of a verified entry's components


def make_benchmark(tracks, out, *, grid=None):
    """Write BENCH.json: ``tracks`` = {track: {"sets": {name: path of the maintainer's set}, "rank_by": metric,
    "private": [names of sets whose masks stay private], "verified_only": bool, "components": a preset of
    SegmentMeIfYouCan's component metrics ("anomaly" or "obstacle"; optional)}}; every submission must be binned
    on ``grid`` (:func:`segood.metrics.grid_spec`; default: the float-order grid), so that entries are comparable.
    With ``components``, each verified entry also gets the component metrics of each set (sIoU, PPV, F1*) at its
    best pixel-F1 threshold on that set, as SegmentMeIfYouCan chooses it (an oracle threshold, named so).

    A private set is scored only from submitted score maps (the verified track); beside BENCH.json goes its public
    copy ``<name>.public.h5`` (the images, every mask pixel ignore) to export maps from. BENCH.json records each
    set's path, frame ids and size, so it stays with the maintainer; the frame ids are what submitters need."""
    out = output_file(out, ".json", "the benchmark (BENCH.json)")
    grid = grid or grid_spec()
    if grid["kind"] == "exact":
        raise ValueError("a benchmark's submissions carry accumulator states, and a state of the exact grid holds "
                         "every counted pixel's score: choose the float-order grid (the default; its bounds say how "
                         "far a value can be from exact, more mantissa bits narrow them) or the linear one")
    make_accumulator(grid)  # (a grid no accumulator takes is refused here, not blamed on every submitter later)
    doc = {"schema": BENCHMARK_SCHEMA, "grid": grid, "tracks": {}}
    for track, spec in tracks.items():
        if not _is_track_name(track):
            raise ValueError(f"a track's name must be printable text, not blank, got {track!r} (--track NAME)")
        if spec["rank_by"] not in METRICS:
            raise ValueError(f"rank_by must be one of {sorted(METRICS)}, got {spec['rank_by']!r}")
        private = set(spec.get("private", ()))
        if not private <= set(spec["sets"]):
            raise ValueError(f"private sets {sorted(private - set(spec['sets']))} are not sets of track {track!r}")
        if spec.get("components") not in (None, *PRESETS):
            raise ValueError(f"components must be one of {sorted(PRESETS)} (SegmentMeIfYouCan's presets) or none, "
                             f"got {spec['components']!r}")
        doc["tracks"][track] = {"rank_by": spec["rank_by"], "verified_only": bool(spec.get("verified_only")),
                                **({"components": spec["components"]} if spec.get("components") else {}),
                                "sets": {name: _official(name, Path(path), name in private)
                                         for name, path in spec["sets"].items()}}
        for name in sorted(private):
            public = out.parent / f"{name}.public.h5"
            if public.resolve() == Path(spec["sets"][name]).resolve():
                raise ValueError(f"{public} is set {name!r} itself: its public copy would replace it; keep the "
                                 "maintainer's sets out of the benchmark's folder or name the set otherwise")
            write_public_set(spec["sets"][name], public)
            # maps exported from the public copy carry its manifest hash: matched to the set by it
            doc["tracks"][track]["sets"][name]["public_manifest_sha256"] = set_identity(public)["manifest_sha256"]
    write_json(out, doc)
    return doc


def _is_track_name(name):
    """Whether ``name`` can head a track's table: printable and not blank."""
    return isinstance(name, str) and name.isprintable() and bool(name.strip())


def _official(name, path, private):
    identity, manifest = set_identity(path), read_manifest(path)
    headline = {}
    if "per_image_headline" in identity:  # scored per image: each frame's (ID, OOD) pixels, to check images by
        headline = {"per_image_headline": identity["per_image_headline"],
                    "frame_pixels": [[int(np.count_nonzero(mask == 0)), int(np.count_nonzero(mask == 1))]
                                     for _, mask in ood_masks(path)]}
    return {"manifest_sha256": identity["manifest_sha256"], "ood_sources": identity["ood_sources"],
            "pixels": manifest["pixels"], "private": private, "path": str(path.resolve()),
            "frame_sizes": [list(size) for size in frame_sizes(path)], "frame_ids": frame_ids(path), **headline}


def write_public_set(path, out):
    """A copy of a converted set with its images and frame ids, and every mask pixel ignore (255)."""
    import h5py

    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    sizes = frame_sizes(path)
    with h5py.File(path, "r") as f:
        writer = SetWriter(out, None, {"source": "public copy", "split": f"{Path(path).stem} (masks private)"},
                           overwrite=True)
        try:
            for index, frame_id in enumerate(frame_ids(path)):
                image = read_array(f, "images", index, sizes[index])
                hidden = np.full(image.shape[:2], IGNORE, np.uint8)
                writer.append(Sample(image, hidden, hidden, frame_id))
        except BaseException:
            writer.abort()
            raise
        writer.commit()


def judge(path, benchmark, limits=Limits(), masks=None, spill=None):
    """One submission: (accepted entries {track: row}, None) or (None, reason). Never raises for bad input; a
    fault on the maintainer's side (a private set that fails its checks, a full disk) raises
    :class:`MaintainerError` naming the maintainer's file, since it says nothing about the submission.

    ``masks``: {set path: [(frame id, ood_mask)]}, a cache of the maintainer's masks shared by one board's
    submissions (filled on first use); score maps are scored against them here, never believed. ``spill``: the
    folder score-map members are copied into (emptied afterwards; default: a temporary folder). ``benchmark``: the
    benchmark file or its parsed content, whose fields are checked first (:class:`MaintainerError` naming one that
    is not what segood benchmark writes)."""
    benchmark = _read_benchmark(benchmark) if isinstance(benchmark, (str, os.PathLike)) else \
        _checked_benchmark(benchmark, "the benchmark given")
    with tempfile.TemporaryDirectory(prefix="judge-", dir=spill) as folder:
        try:
            return _judge(path, benchmark, limits, masks if masks is not None else {}, folder), None
        except Rejected as reason:
            return None, shown(str(reason))
        except MaintainerError:
            raise
        except Exception as err:  # a board must survive whatever a stranger uploads
            if _out_of_room(err):
                raise MaintainerError(f"cannot judge {Path(path).name}: the maintainer's machine ran out of room "
                                      f"({type(err).__name__}: {err}); free space under {folder} and rerun") from err
            return None, shown(f"unreadable submission ({type(err).__name__}: {_no_paths(err, folder)})")


def _out_of_room(err):
    """Whether an error says the maintainer's machine ran out of room, not that a file is bad."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def _no_paths(err, spill):
    """An error's text with the judge's own folder left out (the board is public)."""
    return str(err).replace(str(spill), "<submission>")


def _judge(path, benchmark, limits, masks, spill):
    files = read_submission_files(path, limits, spill, select_maps=lambda read: _wanted_maps(read, benchmark, limits))
    doc = strict_json(files["submission.json"], limits)
    validate(doc)
    grid = benchmark_grid(benchmark)
    rows, uncovered = {}, []
    for track, spec in benchmark["tracks"].items():
        try:
            rows[track] = _track_row(path, doc, files, track, spec, grid, masks)
        except NotCovered as reason:  # (a track whose sets the submission does not cover: the others may rank it)
            uncovered.append(str(reason))
    if not rows:
        raise Rejected("; ".join(uncovered))
    return rows


class NotCovered(Rejected):
    """A submission lacks what one track needs (a set's results, or a private or verified-only set's maps)."""


def _track_row(path, doc, files, track, spec, grid, masks):
    """A submission's entry in one track (:class:`NotCovered` where it lacks what the track needs)."""
    matches = match_sets(doc, spec, track)
    recomputed, verified, images = {}, [], {}
    for set_name, official in spec["sets"].items():
        mine = matches[set_name]  # the submission's name for the set
        entry = doc["sets"][mine]
        if "scores" in entry:
            recomputed[set_name], images[set_name] = _verified(mine, files, official, grid, masks,
                                                               spec.get("components"))
            verified.append(set_name)
        elif official.get("private"):
            raise NotCovered(f"set {set_name!r} keeps its masks private: submit its score maps "
                             f"({map_member(mine)}, written by segood submit --scores)")
        else:
            recomputed[set_name], images[set_name] = _self_reported(mine, entry, files, official, grid)
        if official.get("per_image_headline"):  # a protocol that averages per image: ranked by those means
            recomputed[set_name] = _per_image_means(mine, images[set_name][0], official,
                                                    trusted=set_name in verified)
    if spec.get("verified_only") and len(verified) < len(spec["sets"]):
        raise NotCovered(f"track {track} ranks verified entries only: submit score maps for "
                         f"{sorted(set(spec['sets']) - set(verified))}")
    rank_by = spec["rank_by"]
    values = [r[rank_by] for r in recomputed.values()]
    return {
        "name": shown(doc["method"]["name"]), "description": shown(doc["method"].get("description", "")),
        "file": shown(Path(path).name), "sha256": _content_hash(files),
        "verified": len(verified) == len(spec["sets"]),
        "uses_ood_data": doc["method"].get("uses_ood_data", False),
        "same_source_tuning": any(_same_source(doc, matches[s], official)
                                  for s, official in spec["sets"].items()),
        "score": None if any(v is None for v in values) else sum(values) / len(values),
        "sets": recomputed,
        "_images": {k: v[0] for k, v in images.items()},  # per-image counts, for the intervals (not written out)
        "_curves": {k: v[1] for k, v in images.items()},  # ROC per set, for the entry's figure (not written out)
        **({"components": {k: v[2] for k, v in images.items()}} if spec.get("components") else {}),
    }


def _wanted_maps(files, benchmark, limits):
    """{score-map member: the most bytes it may take} a submission may hold, read from its submission.json before
    any map is copied: those of the benchmark's sets it submits maps for, each at most what its frames need (as
    :func:`~segood.leaderboard.maps.read_maps` checks each map, :func:`~segood.leaderboard.maps.map_bytes`, and
    1 MiB for the file's own structures). Raises :class:`Rejected` for anything else."""
    if "submission.json" not in files:
        raise Rejected("no submission.json at the top of the submission")
    unexpected = [n for n in files if n != "submission.json" and not is_map(n)
                  and not (n.startswith("states/") and n.endswith(".npz"))]
    if unexpected:
        raise Rejected(f"unexpected members {unexpected[:3]}: only submission.json, states/*.npz and scores/*.h5 "
                       "are read")
    doc = strict_json(files["submission.json"], limits)
    validate(doc)
    wanted = {}
    for track, spec in benchmark["tracks"].items():
        try:
            matched = match_sets(doc, spec, track)
        except NotCovered:  # (a track the submission does not cover: the others may rank it)
            continue
        for name, mine in matched.items():
            if "scores" in doc["sets"][mine]:
                need = sum(map_bytes(h, w) for h, w in _frame_sizes(spec["sets"][name])) + (1 << 20)
                wanted[map_member(mine)] = max(need, wanted.get(map_member(mine), 0))
    return wanted


def match_sets(doc, spec, track):
    """{benchmark set name: the name the submission gives it}, matched by content: a submission's set is the
    benchmark's where its manifest sha256 (:func:`segood.data.h5.set_identity`) is the set's, or its public
    copy's (maps exported from it); names are labels, so a run of the set under another name is matched. An entry
    without a hash (score maps submitted without their set) is matched by name, its frames checked one by one.
    Raises :class:`Rejected` naming both sets when the submission's set of that name has other content, or
    when none matches."""
    matched = {}
    for name, official in spec["sets"].items():
        hashes = {official["manifest_sha256"], official.get("public_manifest_sha256")} - {None}
        same = [s for s, entry in doc["sets"].items() if entry.get("manifest_sha256") in hashes]
        if same:
            matched[name] = name if name in same else same[0]
            continue
        entry = doc["sets"].get(name)
        states_for_private = official.get("private") and entry is not None and "scores" not in entry  # refused later
        if entry is not None and "manifest_sha256" in entry and not states_for_private:
            raise Rejected(f"set {name!r}: evaluated on another version of the set: the submission's {name!r} has "
                           f"manifest hash {entry['manifest_sha256'][:12]}…, the benchmark's {name!r} "
                           f"{official['manifest_sha256'][:12]}… (sets are matched by content, not by name)")
        if entry is None:
            theirs = [f"{s!r} ({e['manifest_sha256'][:12]}…)" if "manifest_sha256" in e else f"{s!r} (no hash)"
                      for s, e in doc["sets"].items()]
            theirs = ", ".join(theirs[:5]) + (f" and {len(theirs) - 5} more" if len(theirs) > 5 else "")
            raise NotCovered(f"track {track}: no results for set {name!r} (manifest hash "
                             f"{official['manifest_sha256'][:12]}…): the submission's sets are {theirs}")
        matched[name] = name
    return matched


def _self_reported(set_name, entry, files, official, grid):
    """Metrics recomputed from a submitted accumulator state, checked against the claims and the set's pixels."""
    if entry["manifest_sha256"] != official["manifest_sha256"]:
        raise Rejected(f"set {set_name!r}: evaluated on another version of the set (manifest hash "
                       f"{entry['manifest_sha256'][:12]}…, the benchmark's {official['manifest_sha256'][:12]}…)")
    state_file = f"states/{set_name}.npz"
    if state_file not in files:
        raise Rejected(f"set {set_name!r}: no accumulator state {state_file}")
    _refuse_other_grid(set_name, files[state_file], grid)  # (before its keys are checked against this grid's)
    state = load_npz(files[state_file], tuple(make_accumulator(grid).state_dict()), optional=OPTIONAL_STATE,
                     sizes=_state_sizes(grid, _frame_sizes(official)))
    _check_state_config(set_name, state, grid)
    try:
        acc = accumulator_from_state(state)
    except (ValueError, KeyError, TypeError) as err:
        raise Rejected(f"set {set_name!r}: invalid accumulator state ({err})") from None
    values = _check(set_name, acc, entry["claims"], official["pixels"])
    _check_images(set_name, acc, official)
    return values, (acc.images, _roc(acc), None)


def _refuse_other_grid(set_name, data, grid):
    """:class:`Rejected` for a state of the other grid kind (linear or float-order), named so; anything else is
    left to :func:`load_npz`."""
    try:
        names = {name.removesuffix(".npy") for name in zipfile.ZipFile(io.BytesIO(data)).namelist()}
    except (zipfile.BadZipFile, ValueError):
        return
    kinds = {"num_thresholds": "linear", "mantissa_bits": "float-order", "max_pixels": "exact"}
    kind = next((kind for key, kind in kinds.items() if key in names), None)
    if kind is not None and kind != {"linear": "linear", "float": "float-order"}.get(grid["kind"]):
        raise Rejected(f"set {set_name!r}: binned on the {kind} grid; the benchmark asks for {describe_grid(grid)}: "
                       "evaluate on its grid and submit again")


def _frame_sizes(official):
    """(height, width) of each frame of a set's BENCH.json entry (older files: one size for all)."""
    return official.get("frame_sizes") or [official["size"]] * len(official["frame_ids"])


def _state_sizes(grid, sizes):
    """The most bytes each growing array of a state of frames of ``sizes`` on ``grid`` can hold: a float-order
    table's row per binade a pixel occupies, each image's coarse bin per pixel (at most every coarse bin of every
    binade). Larger arrays are refused before they are read."""
    pixels = [h * w for h, w in sizes]
    binades = min(BINADES, sum(pixels))
    coarse = sum(min(p, BINADES << COARSE_BITS) for p in pixels)
    return {"binades": 8 * binades, "counts": 8 * binades * (2 << grid.get("mantissa_bits", 0)),
            "image_keys": 8 * coarse, "image_counts": 16 * coarse}


def _check_images(set_name, acc, official):
    """A state's per-image counts (where it has them) must be those of the set's frames: one image per frame,
    each image's pixels fitting a frame (images may come in another order, so the largest images are matched to
    the largest frames), and their sum, bin by coarse bin, the pooled histogram's."""
    images = acc.images
    if not len(images):
        return
    sizes = _frame_sizes(official)
    if len(images) != len(sizes):
        raise Rejected(f"set {set_name!r}: the state holds counts of {len(images)} images; the set has "
                       f"{len(sizes)} frames")
    pixels = sorted((int(c.sum()) for c in images.counts), reverse=True)
    room = sorted((h * w for h, w in sizes), reverse=True)
    over = next((k for k, (n, r) in enumerate(zip(pixels, room)) if n > r), None)
    if over is not None:
        raise Rejected(f"set {set_name!r}: the state's images hold more pixels than the set's frames (an image of "
                       f"{pixels[over]} pixels where at most {room[over]} fit)")
    thresholds, hist = acc.curve_counts()
    pooled = _by_key(coarse_keys(thresholds), np.asarray(hist, np.int64).T)
    summed = _by_key(np.concatenate(images.keys).astype(np.int64), np.concatenate(images.counts))
    if pooled != summed:
        raise Rejected(f"set {set_name!r}: the pooled histogram is not the sum of the per-image counts (pixels "
                       "moved between bins?); submit the state as segood wrote it")


def _per_image_means(set_name, images, official, *, trusted):
    """{metric: mean over the images where it is defined (None where none)}: a set whose protocol averages per
    image (its ``per_image_headline``) is scored so. The board computed a verified entry's per-image values itself
    (``trusted``). A self-reported state's images must hold the set's frames' (ID, OOD) pixels (in any order), and,
    since a state keeps each image's values beside its counts on the coarse grid only, each value must lie within
    what its image's coarse counts allow."""
    if len(images) != len(official["frame_ids"]):
        raise Rejected(f"set {set_name!r} averages its metrics per image ({official['per_image_headline']}): the "
                       "state must hold the per-image counts of every frame, as segood evaluate writes them")
    values = np.array(images.values).reshape(len(images), len(images.names))
    columns = [images.names.index(metric) if metric in images.names else None for metric in METRICS]
    if None in columns:
        raise Rejected(f"set {set_name!r}: the state's per-image values lack "
                       f"{[m for m, c in zip(METRICS, columns) if c is None]}")
    values = values[:, columns]
    if not trusted:
        held = sorted((int(c[:, 0].sum()), int(c[:, 1].sum())) for c in images.counts)
        if "frame_pixels" in official and held != sorted(map(tuple, official["frame_pixels"])):
            raise Rejected(f"set {set_name!r}: the state's images hold other (ID, OOD) pixels than the set's frames "
                           "(pixels moved between images?); submit the state as segood wrote it")
        for k, counts in enumerate(images.counts):
            bounds = metric_bounds(np.asarray(counts).T)
            for metric, value in zip(METRICS, values[k]):
                lo, hi = bounds[metric]
                if math.isnan(lo) != math.isnan(value) or not math.isnan(value) and not (
                        lo - TOLERANCE <= value <= hi + TOLERANCE):
                    raise Rejected(f"set {set_name!r}: image {k}'s {metric} is {value}, which its counts do not "
                                   f"allow ([{lo}, {hi}])")
    defined = ~np.isnan(values)
    return {metric: float(values[defined[:, j], j].mean()) if defined[:, j].any() else None
            for j, metric in enumerate(METRICS)}


def _by_key(keys, counts):
    """{key: (ID, OOD)} of (n,) keys and (n, 2) counts, summed per key, empty bins left out."""
    unique, inverse = np.unique(keys, return_inverse=True)
    sums = np.zeros((unique.size, 2), np.int64)
    np.add.at(sums, inverse, counts)
    return {int(k): (int(a), int(b)) for k, (a, b) in zip(unique, sums) if a or b}


def _verified(set_name, files, official, grid, masks, components=None):
    """Metrics computed here from submitted score maps and the maintainer's own masks, on the benchmark's grid;
    with ``components`` (a preset), a second pass over the maps gives the component metrics at the best pixel-F1
    threshold of the first pass's curve."""
    member = map_member(set_name)
    if member not in files:
        raise Rejected(f"set {set_name!r}: no score maps {member}")
    if official["path"] not in masks:
        masks[official["path"]] = _maintainer_masks(official["path"])
    sizes = _frame_sizes(official)
    frames = [(frame_id, *size) for frame_id, size in zip(official["frame_ids"], sizes)]
    acc = make_accumulator(grid, per_image=True)
    for (frame_id, scores), (_, mask) in zip(read_maps(files[member], frames, member), masks[official["path"]]):
        try:
            acc.update(scores[None], mask[None])
        except (ValueError, TypeError) as err:
            raise Rejected(f"set {set_name!r}, frame {frame_id}: {err}") from None
    result, values = _values(acc)
    found = None
    if components and result["n_id"] and result["n_ood"]:  # at the threshold of best pixel F1, as SMIYC's
        comp = ComponentAccumulator(commit(result, "f1"), components, threshold_source="oracle")
        for (frame_id, scores), (_, mask) in zip(read_maps(files[member], frames, member), masks[official["path"]]):
            try:
                comp.update(scores, mask)
            except (ValueError, TypeError) as err:
                raise Rejected(f"set {set_name!r}, frame {frame_id}: {err}") from None
        found = {key: None if isinstance(v, float) and math.isnan(v) else v
                 for key, v in comp.compute().items() if key in COMPONENT_KEYS}
    return values, (acc.images, _roc(acc), found)


def _roc(acc, points=2000):
    """(FPR, TPR) of an accumulator's curve, at most ``points`` of its thresholds (for the entry's figure)."""
    _, hist = acc.curve_counts()
    fp, tp = (np.cumsum(np.asarray(h, np.float64)[::-1])[::-1] for h in hist)
    fpr, tpr = (np.r_[c / c[0] if c.size and c[0] else np.zeros(c.size), 0.0] for c in (fp, tp))
    keep = np.unique(np.linspace(0, fpr.size - 1, min(points, fpr.size)).astype(int))
    return fpr[keep], tpr[keep]


def _maintainer_masks(path):
    """[(frame id, ood_mask)] of a maintainer's set, each checked against its digest; any failure is the
    maintainer's (:class:`MaintainerError`), never a submission's."""
    try:
        return list(ood_masks(path))
    except Exception as err:  # noqa: BLE001 - whatever it is, it is the maintainer's file
        raise MaintainerError(f"the maintainer's set {path} cannot be read ({type(err).__name__}: {err}); no "
                              "submission was judged against it: restore or reconvert the set, write the "
                              "benchmark again (segood benchmark) if it changed, and rerun the board") from err


def _same_source(doc, set_name, official):
    """Whether the method was tuned on an OOD source of the set: derived from its tuning provenance and the
    benchmark's record of the set's OOD sources, never taken from the submission's own flag (benchmarks written
    before they recorded sources: the flag, or the provenance, whichever says so)."""
    params = doc["method"].get("params")
    tuning = params.get("tuning") if isinstance(params, dict) else None
    tuning_set = tuning.get("set") if isinstance(tuning, dict) else None
    if tuning_set is not None and not isinstance(tuning_set, dict):
        raise Rejected("method.params.tuning.set must be an object: the tuning set's identity (segood records it)")
    sources = (tuning_set or {}).get("ood_sources") or []
    if not isinstance(sources, list) or not all(isinstance(source, str) for source in sources):
        raise Rejected("method.params.tuning.set.ood_sources must be a list of the tuning set's OOD source names")
    tuned_on = set(sources)
    if "ood_sources" in official:
        return bool(tuned_on & set(official["ood_sources"]))
    return bool(doc["sets"][set_name]["same_source_tuning"]) or bool(tuned_on)


def _content_hash(files):
    """The first 12 hex digits of the sha256 of a submission's members (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0")
        if isinstance(files[name], Path):  # a score-map file, read in pieces
            with open(files[name], "rb") as f:
                while piece := f.read(1 << 20):
                    digest.update(piece)
        else:
            digest.update(files[name])
    return digest.hexdigest()[:12]


def shown(text):
    """A submitted string made safe to show anywhere: control, format (bidi, zero-width) and other non-printing
    characters become U+FFFD, so nothing can retitle or clear a terminal or reorder a line."""
    return "".join("\ufffd" if unicodedata.category(ch).startswith("C") else ch for ch in str(text))


def benchmark_grid(benchmark):
    """The threshold grid every submission to ``benchmark`` must use (benchmark files before the float-order
    grid name the linear grid's num_thresholds and score_range)."""
    if "grid" in benchmark:
        return benchmark["grid"]
    return grid_spec(benchmark["num_thresholds"], benchmark["score_range"])


def _check_state_config(set_name, state, grid):
    """The grid must be the benchmark's and the counts int64 of the right shape, before anything is built."""
    try:
        if grid["kind"] == "linear":
            mine = {"kind": "linear", "num_thresholds": int(state["num_thresholds"]),
                    "score_range": [float(v) for v in state["score_range"]]}
            shape = (2, mine["num_thresholds"])
            counts = state["hist"]
        else:
            mine = {"kind": "float", "mantissa_bits": int(state["mantissa_bits"])}
            counts = state["counts"]
            shape = (len(state["binades"]), 2, 1 << min(mine["mantissa_bits"], 30))
    except (TypeError, ValueError, KeyError):
        raise Rejected(f"set {set_name!r}: unreadable grid settings in the accumulator state") from None
    if mine != grid:
        raise Rejected(f"set {set_name!r}: binned on {describe_grid(mine)}; the benchmark asks for "
                       f"{describe_grid(grid)}")
    if counts.dtype != np.int64 or counts.shape != shape:
        raise Rejected(f"set {set_name!r}: counts must be int64 of shape {shape}")


def _values(acc):
    """(the accumulator's result, {metric: value or None where undefined})."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        result = acc.compute()
    return result, {metric: None if math.isnan(result[metric]) else float(result[metric]) for metric in METRICS}


def _check(set_name, acc, claims, pixels):
    result, values = _values(acc)
    counts = {"n_id": result["n_id"], "n_ood": result["n_ood"], "n_ignored": int(acc.n_ignored)}
    expected = {"n_id": pixels["id"], "n_ood": pixels["ood"], "n_ignored": pixels["ignore"]}
    if counts != expected:
        raise Rejected(f"set {set_name!r}: counts {counts} do not match the set's pixels {expected}")
    for key in counts:
        if claims[key] != counts[key]:
            raise Rejected(f"set {set_name!r}: claimed {key} {claims[key]} but the state holds {counts[key]}")
    for metric, value in values.items():
        claimed = claims.get(metric)
        if (value is None) != (claimed is None) or (value is not None and abs(value - claimed) > TOLERANCE):
            raise Rejected(f"set {set_name!r}: claimed {metric} {claimed} but the counts give {value}")
    return values


def leaderboard(submissions_dir, benchmark_path, out_dir, limits=Limits(), bootstrap=Bootstrap(), *, work=None):
    """Judge every zip / folder in ``submissions_dir``; write the board; returns its JSON document. Each entry's
    score gets an image-level bootstrap interval where its per-image counts cover every frame (``bootstrap``;
    None: none), and verified entries, scored here frame by frame, are compared pairwise: one not significantly
    worse than a better one shares its rank.

    Score maps are copied into a folder ``.judge-*`` under ``work`` (default ``out_dir``), removed on every exit
    (SIGTERM included; one left by a killed board is removed by the next). A fault on the maintainer's side (a
    private set that fails its checks, a full disk) raises :class:`MaintainerError` and writes no board."""
    own = {Path(out_dir).resolve(), Path(work or out_dir).resolve()}
    if Path(submissions_dir).resolve() in own:
        raise ValueError(f"the board's folder (--out, --work) is the submissions' folder {submissions_dir}: its files "
                         "would be judged as submissions, and its own would be cleared; give another folder")
    benchmark = _read_benchmark(benchmark_path)
    _check_official_sets(benchmark)
    tracks = {track: [] for track in benchmark["tracks"]}
    rejected, masks, seen = [], {}, {}  # seen: {content hash: the file first judged with it}
    with _work_folder(Path(work or out_dir)) as spill:
        for path in sorted(Path(submissions_dir).iterdir()):
            if path.resolve() in own:
                continue  # the board's own folders, were they put among the submissions
            rows, reason = judge(path, benchmark, limits, masks, spill)
            digest = next(iter(rows.values()))["sha256"] if rows else None
            if digest in seen:
                reason = f"the same submission as {seen[digest]} (sha256 {digest}); an entry is ranked once"
            if reason:
                rejected.append({"file": shown(path.name), "reason": reason})
                continue
            seen[digest] = shown(path.name)
            for track, row in rows.items():
                tracks[track].append(row)
    for track, rows in tracks.items():
        metric = benchmark["tracks"][track]["rank_by"]
        sign = -1 if METRICS[metric].higher_is_better else 1
        rows.sort(key=lambda r: (r["score"] is None, sign * (r["score"] or 0.0), r["name"]))
        _intervals_and_ties(rows, benchmark["tracks"][track], bootstrap)
    out_dir = Path(out_dir)
    for t, rows in enumerate(tracks.values()):
        for k, row in enumerate(rows):
            row["figure"] = f"figures/roc_{t}_{k}.png"  # named by position: no submitted string in a path
            _draw_roc(out_dir / row["figure"], row.pop("_curves"), f"{row['name']} ({row['file']})")
    doc = {"schema": "segood.leaderboard/1", "bootstrap": vars(bootstrap) if bootstrap else None,
           "tracks": {t: _track_doc(benchmark["tracks"][t], rows) for t, rows in tracks.items()}, "rejected": rejected}
    write_json(out_dir / "leaderboard.json", doc)
    atomic_write_text(out_dir / "leaderboard.md", board_markdown(doc))
    atomic_write_text(out_dir / "index.html", board_html(doc))
    return doc


def _draw_roc(path, curves, title):
    """One entry's ROC curve on each set of its track, as a PNG (written atomically)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4))
    for set_name, (fpr, tpr) in curves.items():
        ax.plot(fpr, tpr, label=set_name)
    ax.plot([0, 1], [0, 1], color="#bbb", lw=0.8)
    ax.set(xlabel="false positive rate (ID pixels)", ylabel="true positive rate (OOD pixels)", xlim=(0, 1),
           ylim=(0, 1))
    ax.set_title(title[:80], fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _read_benchmark(path):
    """The parsed benchmark file; a ValueError naming it when it is unreadable or not one, a
    :class:`MaintainerError` naming the field when one is not what segood benchmark writes
    (:func:`_check_benchmark`)."""
    try:
        benchmark = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable benchmark file ({err}); write it again with segood "
                         "benchmark") from None
    except OSError as err:
        raise OSError(err.errno, f"cannot read the benchmark file {path} ({err.strerror})") from None
    return _checked_benchmark(benchmark, path)


def _checked_benchmark(benchmark, path):
    """``benchmark`` (parsed from ``path``) after :func:`_check_benchmark`; a ValueError where it is not one."""
    if not isinstance(benchmark, dict) or benchmark.get("schema") != BENCHMARK_SCHEMA or "tracks" not in benchmark \
            or not ({"grid"} <= set(benchmark) or {"num_thresholds", "score_range"} <= set(benchmark)):
        raise ValueError(f"{path} is not a segood benchmark file (schema {BENCHMARK_SCHEMA!r}); write one "
                         "with segood benchmark")
    _check_benchmark(benchmark, path)
    return benchmark


def _check_benchmark(benchmark, path):
    """Every field of a benchmark file the board reads, of the type segood benchmark writes, checked once as the
    file is read: a hand-edited or damaged file stops the board with a :class:`MaintainerError` naming the field,
    rather than a traceback later or every submission rejected as unreadable."""

    def need(ok, field, what):
        if not ok:
            raise MaintainerError(f"{path}: {field} must be {what}; write it again with segood benchmark")

    def integers(values, length, least=0):
        return isinstance(values, list) and len(values) == length and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values)

    def pairs(values, length, least=0):
        return isinstance(values, list) and len(values) == length and all(integers(v, 2, least) for v in values)

    try:  # (a submission's grid is compared with it key by key: no key more or less than segood benchmark writes)
        grid = benchmark_grid(benchmark)
        if not isinstance(grid, dict) or grid.get("kind") not in ("float", "linear"):
            raise ValueError(f"got {grid!r}")
        if set(grid) != set(grid_spec(kind=grid["kind"])):
            raise ValueError(f"its keys {sorted(grid)} are not {sorted(grid_spec(kind=grid['kind']))}")
        make_accumulator(grid)
    except (TypeError, ValueError) as err:
        need(False, "grid", f"the float-order or the linear grid as segood benchmark writes it ({err})")
    tracks = benchmark["tracks"]
    need(isinstance(tracks, dict) and tracks, "tracks", "a non-empty object {track name: track}")
    for track, spec in tracks.items():
        at = f"tracks.{track}"
        need(_is_track_name(track), f"the track name {track!r}", "printable text, not blank")
        need(isinstance(spec, dict), at, "an object (rank_by, sets, ...)")
        need(isinstance(spec.get("rank_by"), str) and spec["rank_by"] in METRICS, f"{at}.rank_by",
             f"one of {sorted(METRICS)} (a metric of your own module: segood --plugin MODULE leaderboard ...)")
        need(isinstance(spec.get("verified_only", False), bool), f"{at}.verified_only", "true or false")
        need(spec.get("components") in (None, *PRESETS), f"{at}.components", f"one of {sorted(PRESETS)} or absent")
        need(isinstance(spec.get("sets"), dict) and spec["sets"], f"{at}.sets",
             "a non-empty object {set name: the set's record}")
        for name, official in spec["sets"].items():
            at = f"tracks.{track}.sets.{name}"
            need(isinstance(official, dict), at, "an object (manifest_sha256, pixels, frame_ids, ...)")
            need(is_sha256(official.get("manifest_sha256")), f"{at}.manifest_sha256", "64 hex digits")
            need(is_sha256(official.get("public_manifest_sha256", "0" * 64)), f"{at}.public_manifest_sha256",
                 "64 hex digits or absent")
            need(isinstance(official.get("path"), str), f"{at}.path", "the path of the maintainer's set")
            need(isinstance(official.get("private", False), bool), f"{at}.private", "true or false")
            need(isinstance(official.get("ood_sources", []), list) and all(
                isinstance(v, str) for v in official.get("ood_sources", [])), f"{at}.ood_sources",
                "a list of strings or absent")
            pixels = official.get("pixels")
            need(isinstance(pixels, dict) and integers([pixels.get(k) for k in ("id", "ood", "ignore")], 3),
                 f"{at}.pixels", "an object of non-negative integers {id, ood, ignore}")
            ids = official.get("frame_ids")
            need(isinstance(ids, list) and all(isinstance(v, str) for v in ids), f"{at}.frame_ids",
                 "a list of frame ids (strings)")
            sizes = official.get("frame_sizes") or [official.get("size")] * len(ids)  # (older files: one size)
            need(pairs(sizes, len(ids), least=1), f"{at}.frame_sizes",
                 f"a list of {len(ids)} [height, width] pairs of positive integers, one a frame")
            need(isinstance(official.get("per_image_headline", ""), str), f"{at}.per_image_headline",
                 "a string or absent")
            need("frame_pixels" not in official or pairs(official["frame_pixels"], len(ids)), f"{at}.frame_pixels",
                 f"a list of {len(ids)} [ID, OOD] pixel counts, one a frame, or absent")


@contextmanager
def _work_folder(parent):
    """A fresh folder ``parent/.judge-<pid>-*`` for this board's copies of score maps, removed on every exit:
    SIGTERM is turned into SystemExit while it exists, and folders of boards whose process is gone (killed) are
    removed first."""
    make_folder(parent)
    for stale in parent.glob(".judge-*"):
        pid = stale.name.split("-")[1] if stale.name.count("-") >= 2 else ""
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f".judge-{os.getpid()}-", dir=parent))
    try:
        with exit_on_sigterm():
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _track_doc(spec, rows):
    """A track of the board's document: its metric, its sets (``per_image``: the headline of each whose protocol
    averages per image), its component preset where it has one, and its ranked entries."""
    return {"rank_by": spec["rank_by"], "sets": list(spec["sets"]),
            "per_image": {s: o["per_image_headline"] for s, o in spec["sets"].items() if o.get("per_image_headline")},
            **({"components": spec["components"]} if spec.get("components") else {}), "entries": rows}


def _intervals_and_ties(rows, spec, settings):
    """Set each row's ``interval`` (of its score, the mean over the sets of the rank_by metric) and ``rank``; drop
    the per-image counts. The same resampled images serve every entry, so verified entries (the board's own
    per-frame counts, in frame order) are paired; self-reported counts may come in another order (sharded runs),
    so they get intervals but never a tie. A set whose protocol averages per image resamples its per-image means."""
    metric, sets = spec["rank_by"], list(spec["sets"])
    samples = {}
    if settings:
        weights = {s: Bootstrap(settings.resamples, settings.seed + k, settings.confidence).weights(
            len(spec["sets"][s].get("frame_ids", ())) or 1) for k, s in enumerate(sets)}
        for k, row in enumerate(rows):
            images = row["_images"]
            if row["score"] is not None and all(len(images[s]) == len(weights[s][0]) for s in sets):
                samples[k] = np.mean([resampled_means(images[s], weights[s], (metric,))[metric]
                                      if spec["sets"][s].get("per_image_headline") else
                                      shifted_metrics(images[s], weights[s], (metric,), row["sets"][s])[metric]
                                      for s in sets], axis=0)
    sign = 1.0 if METRICS[metric].higher_is_better else -1.0
    paired = [k for k in samples if rows[k]["verified"]]
    significant = {a: {b: True for b in range(len(rows))} for a in range(len(rows))}
    for a in paired:
        for b in paired:
            if a != b:
                lo, hi = settings.interval(sign * (samples[a] - samples[b]))
                significant[a][b] = lo is not None and (lo > 0 or hi < 0)
    ranks = tied_ranks({k: row["score"] for k, row in enumerate(rows)}, significant, METRICS[metric].higher_is_better,
                       compared=set(paired))
    for k, row in enumerate(rows):
        del row["_images"]
        row["interval"] = settings.interval(samples[k]) if k in samples else None
        row["rank"] = ranks[k]


def _check_official_sets(benchmark):
    """The maintainer's sets must still be the ones the benchmark was written for (a ValueError otherwise)."""
    for spec in benchmark["tracks"].values():
        for name, official in spec["sets"].items():
            try:
                digest = set_identity(official["path"])["manifest_sha256"]
            except Exception as err:  # noqa: BLE001 - whatever it is, it is the maintainer's file
                raise MaintainerError(f"set {name}: the maintainer's set {official['path']} cannot be read "
                                      f"({type(err).__name__}: {err}); restore it, or write the benchmark again "
                                      "with segood benchmark") from err
            if digest != official["manifest_sha256"]:
                raise ValueError(f"set {name} at {official['path']} is not the one the benchmark was written for: "
                                 "its manifest changed; write the benchmark again with segood benchmark")


def _flags(row):
    """An entry's notes: verified or self-reported, and what it used, joined by "; "."""
    flags = ["verified" if row.get("verified") else "self-reported", "OOD data used" if row["uses_ood_data"] else "",
             "same-source tuning" if row["same_source_tuning"] else ""]
    return "; ".join(flag for flag in flags if flag)


def board_markdown(doc):
    lines = ["# Leaderboard", ""]
    for track, t in doc["tracks"].items():
        metric = t["rank_by"]
        lines += [f"## {track} — ranked by mean {metric} over {', '.join(t['sets'])}", "",
                  "| rank | method | score | " + " | ".join(_set_label(t, s) for s in t["sets"])
                  + " | notes | file (sha256) |",
                  "|---:|---|---:|" + "---:|" * len(t["sets"]) + "---|---|"]
        for k, row in enumerate(t["entries"], 1):
            cells = " | ".join(_fmt(row["sets"][s][metric]) for s in t["sets"])
            lines.append(f"| {_rank(row, k)} | {_md(row['name'])} | {_score(row)} | {cells} | {_md(_flags(row))} | "
                         f"{_md(row['file'])} ({row['sha256']}) |")
        lines.append("")
        if t.get("components"):
            lines += [f"### {track} — component metrics", "", _components_note(t), "",
                      "| rank | method | " + " | ".join(f"{_set_label(t, s)} sIoU / PPV / F1*" for s in t["sets"])
                      + " |", "|---:|---|" + "---:|" * len(t["sets"])]
            lines += [f"| {_rank(row, k)} | {_md(row['name'])} | "
                      + " | ".join(_components_cell(row, s) for s in t["sets"]) + " |"
                      for k, row in enumerate(t["entries"], 1)]
            lines.append("")
    if doc.get("bootstrap"):
        lines += [_INTERVAL_NOTE.format(**doc["bootstrap"]), ""]
    if doc["rejected"]:
        lines += ["## Rejected", "", "| file | reason |", "|---|---|"]
        lines += [f"| {_md(r['file'])} | {_md(r['reason'])} |" for r in doc["rejected"]]
    return "\n".join(lines) + "\n"


def board_html(doc):
    """A self-contained page (no external assets); every submitted string is escaped; columns sort on click."""
    esc = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>segood leaderboard</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}",
             "td,th{border:1px solid #ccc;padding:4px 8px}th{cursor:pointer;background:#eee}</style></head><body>",
             "<h1>segood leaderboard</h1>"]
    for track, t in doc["tracks"].items():
        metric = t["rank_by"]
        parts.append(f"<h2>{esc(track)} — ranked by mean {esc(metric)}</h2><table class='sortable'><thead><tr>"
                     + "".join(f"<th>{esc(h)}</th>" for h in ["rank", "method", "score",
                                                              *(_set_label(t, s) for s in t["sets"]), "notes",
                                                              "file (sha256)", "curves"])
                     + "</tr></thead><tbody>")
        for k, row in enumerate(t["entries"], 1):
            cells = [_rank(row, k), row["name"], _score(row), *(_fmt(row["sets"][s][metric]) for s in t["sets"]),
                     _flags(row), f"{row['file']} ({row['sha256']})"]
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                         + f"<td><a href='{esc(row['figure'])}'>ROC</a></td></tr>")
        parts.append("</tbody></table>")
        if t.get("components"):
            parts.append(f"<h3>{esc(track)} — component metrics</h3><p>{esc(_components_note(t))}</p>"
                         "<table class='sortable'><thead><tr>"
                         + "".join(f"<th>{esc(h)}</th>" for h in ["rank", "method", *(
                             f"{_set_label(t, s)} sIoU / PPV / F1*" for s in t["sets"])]) + "</tr></thead><tbody>")
            parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in [_rank(row, k), row["name"], *(
                _components_cell(row, s) for s in t["sets"])]) + "</tr>" for k, row in enumerate(t["entries"], 1)]
            parts.append("</tbody></table>")
    if doc["rejected"]:
        parts.append("<h2>Rejected</h2><table><thead><tr><th>file</th><th>reason</th></tr></thead><tbody>")
        parts += [f"<tr><td>{esc(r['file'])}</td><td>{esc(r['reason'])}</td></tr>" for r in doc["rejected"]]
        parts.append("</tbody></table>")
    parts.append("""<script>
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
  const key = r => { const t = r.cells[col].textContent, n = parseFloat(t); return isNaN(n) ? t : n; };
  const up = th.dataset.up !== '1'; th.dataset.up = up ? '1' : '0';
  rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1));
  rows.forEach(r => body.appendChild(r));
}));
</script></body></html>""")
    return "".join(parts) + "\n"


_INTERVAL_NOTE = ("[lo, hi]: {confidence:.0%} image-level bootstrap interval of the score ({resamples} resamples, seed "
                  "{seed}). Verified entries not significantly worse than a better one (paired bootstrap) share "
                  "its rank; self-reported entries are never tied (their images may come in another order).")


def _components_note(track):
    return (f"SegmentMeIfYouCan's component metrics ({track['components']} preset) of verified entries, each set at "
            "the entry's best pixel-F1 threshold on that set, as SegmentMeIfYouCan chooses it: ORACLE, tuned on the "
            "test set. Self-reported entries: –.")


def _components_cell(row, set_name):
    found = (row.get("components") or {}).get(set_name)
    return "–" if not found else " / ".join(_fmt(found[k]) for k in ("siou", "ppv", "f1_star"))


def _set_label(track, set_name):
    """A set's column: its name, and its headline where its protocol averages per image."""
    headline = track.get("per_image", {}).get(set_name)
    return f"{set_name} ({headline})" if headline else set_name


def _rank(row, position):
    return str(row.get("rank") or position)


def _score(row):
    interval = row.get("interval")
    return _fmt(row["score"]) + (f" [{interval[0]:.4f}, {interval[1]:.4f}]" if interval and interval[0] is not None
                                 else "")


def _fmt(value):
    return "–" if value is None else f"{value:.4f}"


def _md(text):
    """Markdown-safe: every character with a Markdown meaning backslash-escaped, which CommonMark shows as the
    character itself: no HTML (``<``, ``&``), no links or emphasis, and no autolinks (``www.``, ``://``, ``@``: a
    renderer finds those within one run of text, and an escape ends the run)."""
    return _MARKDOWN.sub(r"\\\g<0>", shown(text))


_MARKDOWN = re.compile(r"[\\`*_\[\]()!#|~<>&.:@]")
