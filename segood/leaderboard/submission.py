"""Packaging a run into a submission, and validating a submission's JSON against its schema."""

import errno
import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from segood.io import atomic_output, exclusive, npz_bytes, output_file, zip_member
from segood.leaderboard.maps import map_member
from segood.leaderboard.safe import Rejected
from segood.metrics import METRICS

SCHEMA = "segood.submission/1"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+()/-]{0,79}$")
COUNTS = ("n_id", "n_ood", "n_ignored")


def submit(run_dir, out, *, method=None, name, description="", allow_same_source=False, score_maps=None,
           uses_ood_data=False, data=None):
    """Package ``method`` of the run in ``run_dir`` as a submission zip ``out``; returns the submission dict.

    ``score_maps`` = {set name: score maps in any layout ``segood score`` reads (:mod:`segood.evaluation.exchange`:
    segood's file, a SegmentMeIfYouCan folder of ``<fid>.hdf5``, a Fishyscapes folder of ``<fid>_anomaly.npy``)}
    adds per-pixel maps for the verified track, stored as float16 in ``scores/<set>.h5``: the board scores them
    against its own masks (for sets whose masks are private, the only way to enter). ``data`` = {set name: the
    converted set the maps belong to, or its public copy}: the frame ids, which the folder layouts need (their
    files carry only the last part of each id), and the set's manifest hash, by which the board matches the maps
    to its set. Without ``run_dir`` a submission holds maps only; ``uses_ood_data`` declares that the method saw OOD
    data (a run records it for its networks trained with outlier exposure; the declaration adds to that).
    Refuses a method tuned on its test source unless ``allow_same_source`` (the flag then travels with it), and
    score maps with NaN scores, which the board would refuse.
    """
    out = output_file(out, ".zip", "the submission")
    if not NAME_PATTERN.match(name):
        raise ValueError(f"method name {name!r}: use 1-80 letters, digits, spaces and ._+()/- (starting with a letter "
                         "or digit)")
    score_maps, data = dict(score_maps or {}), dict(data or {})
    if set(data) - set(score_maps):
        raise ValueError(f"sets {sorted(set(data) - set(score_maps))} are given (--data) without score maps "
                         "(--scores SET=PATH)")
    if run_dir is None and not score_maps:
        raise ValueError("nothing to submit: give a run (its accumulator states) or score maps (--scores SET=FILE)")
    _refuse_a_set_twice(run_dir, data)  # (before any map is packaged)
    document = ({"schema": SCHEMA, "method": {"name": name, "description": description, "params": {},
                                               "uses_ood_data": bool(uses_ood_data)}, "sets": {}}
                if run_dir is None else None)
    # one submit at a time into ``out``; the zip is written under a temporary name and renamed when complete, so
    # a failure (a full disk) leaves no partial zip and the previous one as it was
    with exclusive(out, "segood submit"), atomic_output(out) as tmp:
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
                if run_dir is not None:
                    document = _add_states(archive, run_dir, method, name, description, allow_same_source,
                                           skip=score_maps)
                    document["method"]["uses_ood_data"] |= bool(uses_ood_data)
                for set_name, path in score_maps.items():
                    _add_float16_maps(archive, map_member(set_name), path, data.get(set_name))
                    previous = document["sets"].get(set_name, {})
                    identity = _maps_identity(set_name, data.get(set_name), previous)
                    document["sets"][set_name] = {"scores": map_member(set_name), **identity,
                                                  "same_source_tuning": previous.get("same_source_tuning", False)}
                archive.writestr(zip_member("submission.json"), json.dumps(document, indent=2, allow_nan=False))
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OSError(err.errno, f"cannot write {out} ({err.strerror}); free space and rerun: "
                                         f"{'the previous zip is unchanged' if out.exists() else 'nothing was left'}") \
                    from None
            raise
    return document


def _add_float16_maps(archive, member, path, data=None):
    """Store a float16 copy of score maps in any layout :class:`segood.evaluation.exchange.ScoreMaps` reads as
    ``member``: the frames of the set ``data``, or (segood's file only) every map the file holds."""
    from segood.data.h5 import frame_ids, frame_sizes
    from segood.evaluation.exchange import ScoreMaps
    from segood.leaderboard.maps import write_maps

    try:
        ids, sizes = (None, None) if data is None else (frame_ids(data), frame_sizes(data))
    except KeyError as err:
        raise ValueError(f"{data} is not a converted segood set (it lacks {err}); give the set the maps belong to, "
                         "or its public copy") from None
    with ScoreMaps(path, ids, sizes) as maps, tempfile.TemporaryDirectory() as tmp:
        try:
            write_maps(maps, maps.frame_ids, Path(tmp) / "maps.h5", source=path)
        except Rejected as reason:  # refused here, not by the board after the upload
            raise ValueError(f"score maps {path}: {reason}; the leaderboard would refuse them") from None
        with open(Path(tmp) / "maps.h5", "rb") as source, \
                archive.open(zip_member(member, zipfile.ZIP_STORED), "w", force_zip64=True) as target:  # (lzf inside)
            shutil.copyfileobj(source, target, 1 << 20)


def _maps_identity(set_name, data, previous):
    """The manifest hash that travels with a set's maps: that of ``data`` (the set they belong to) or, without it,
    the run's record of the set; {} when neither is known (the board then matches the maps by name)."""
    if data is None:
        return {"manifest_sha256": previous["manifest_sha256"]} if "manifest_sha256" in previous else {}
    from segood.data.h5 import set_identity

    digest = set_identity(data)["manifest_sha256"]
    if "manifest_sha256" in previous and previous["manifest_sha256"] != digest:
        raise ValueError(f"set {set_name!r}: the run evaluated another version of the set than {data} (manifest "
                         f"hash {previous['manifest_sha256'][:12]}…, {data} has {digest[:12]}…)")
    return {"manifest_sha256": digest}


def _refuse_a_set_twice(run_dir, data):
    """Refuse two set names of one set (the same manifest hash) among the run's sets and the sets of ``data``: the
    board would judge the second as a set it lacks."""
    from segood.data.h5 import set_identity
    from segood.evaluation.layout import RunFolder

    digests = {} if run_dir is None else {s: r.get("manifest_sha256")
                                          for s, r in RunFolder(run_dir).read_run()["sets"].items()}
    digests.update({s: set_identity(path)["manifest_sha256"] for s, path in data.items()})
    seen = {}
    for set_name, digest in digests.items():
        if digest in seen:
            raise ValueError(f"sets {seen[digest]!r} and {set_name!r} are one set (manifest sha256 {digest[:12]}…): "
                             "give it once, under its own name")
        if digest is not None:
            seen[digest] = set_name


def _add_states(archive, run_dir, method, name, description, allow_same_source, skip):
    """Write the run's accumulator states (but for the sets in ``skip``) and return the submission document."""
    from segood.evaluation.layout import RunFolder  # here, so that judging submissions never imports torch
    from segood.evaluation.runner import Evaluation

    folder = RunFolder(run_dir)
    run = folder.read_run()
    results = folder.read_results()["results"]
    if method not in results:
        raise ValueError(f"the run has no method {method!r}; it has {sorted(results)}")
    same_source = {s: r["same_source_tuning"] for s, r in results[method].items()}
    if any(same_source.values()) and not allow_same_source:
        raise ValueError(f"{method} was tuned on data from the same source as {[s for s, v in same_source.items() if v]}; "
                         "pass --allow-same-source to submit it anyway (the board will show the flag)")
    ev = Evaluation.load(folder.state())
    document = {
        "schema": SCHEMA,
        "method": {"name": name, "description": description, "run_method": method,
                   "params": run["methods"][method]["params"],
                   "uses_ood_data": bool(run["methods"][method].get("uses_ood_data"))},
        "model": run["model"][run["method_models"][method]] if "method_models" in run else run["model"],  # (a
        # combined report's method: its own run's network)
        "toolkit": run["toolkit"],
        "sets": {},
    }
    for set_name, r in results[method].items():
        document["sets"][set_name] = {"manifest_sha256": run["sets"][set_name]["manifest_sha256"],
                                      "same_source_tuning": same_source[set_name]}
        if set_name in skip:
            continue
        archive.writestr(zip_member(f"states/{set_name}.npz"), npz_bytes(ev.acc[(method, set_name)].state_dict()))
        document["sets"][set_name]["claims"] = {**{m: r["pooled"].get(m) for m in METRICS},
                                                **{c: r[c] for c in COUNTS}}
    return document


def validate(doc):
    """Check a parsed submission.json: types, ranges, names. Raises :class:`Rejected` with the first problem."""
    _require(isinstance(doc, dict), "submission.json must hold an object")
    _require(doc.get("schema") == SCHEMA, f"schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    method = doc.get("method")
    _require(isinstance(method, dict), "'method' must be an object")
    name = method.get("name")
    _require(isinstance(name, str) and NAME_PATTERN.match(name) is not None,
             f"method name {name!r} is not allowed: 1-80 letters, digits, spaces and ._+()/-")
    _require(isinstance(method.get("description", ""), str) and len(method.get("description", "")) <= 2000,
             "method description must be a string of at most 2000 characters")
    _require(isinstance(method.get("uses_ood_data", False), bool), "'uses_ood_data' must be true or false")
    sets = doc.get("sets")
    _require(isinstance(sets, dict) and sets, "'sets' must be a non-empty object")
    for set_name, entry in sets.items():
        _require(isinstance(entry, dict), f"set {set_name!r}: must be an object")
        _require(isinstance(entry.get("same_source_tuning", False), bool),
                 f"set {set_name!r}: same_source_tuning must be a bool")
        if "scores" in entry:  # the verified track: maps, scored by the board; no claims
            _require(entry["scores"] == map_member(set_name),
                     f"set {set_name!r}: 'scores' must name {map_member(set_name)!r}")
            _require("manifest_sha256" not in entry or is_sha256(entry["manifest_sha256"]),
                     f"set {set_name!r}: manifest_sha256 must be 64 hex digits")
            continue
        _require(is_sha256(entry.get("manifest_sha256")), f"set {set_name!r}: manifest_sha256 must be 64 hex digits")
        _require(isinstance(entry.get("same_source_tuning"), bool), f"set {set_name!r}: same_source_tuning must be a bool")
        claims = entry.get("claims")
        _require(isinstance(claims, dict), f"set {set_name!r}: 'claims' must be an object")
        for name, metric in METRICS.items():
            value = claims.get(name)
            _require(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                       and metric.in_range(value)),
                     f"set {set_name!r}: claimed {name} {value!r} is not a number "
                     + (f"in [{metric.range[0]:g}, {metric.range[1]:g}]" if metric.range else "(finite)"))
        for count in COUNTS:
            value = claims.get(count)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                     f"set {set_name!r}: claimed {count} {value!r} is not a non-negative integer")


def is_sha256(value):
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def _require(condition, reason):
    if not condition:
        raise Rejected(reason)
