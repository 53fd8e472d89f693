"""``segood.evaluate`` for any segmentation model, and the evaluation of black-box score maps."""

import contextlib
import dataclasses
import hashlib
import tempfile
import warnings
import weakref
from pathlib import Path

import numpy as np
import torch

from segood._threads import beside_readers
from segood.data.h5 import (H5SegmentationDataset, frame_ids, frame_sizes, read_manifest, require_labels,
                             set_identity)
from segood.evaluation.exchange import ScoreMaps
from segood.evaluation.layout import RunFolder
from segood.evaluation.options import EvaluateOptions, ScoreOptions, score_range_of
from segood.evaluation.reading import UnreadableFrame, batch_reader, default_workers
from segood.evaluation.report import build_results, skipped_note, warn_coarse, write_report
from segood.evaluation.results import Results
from segood.evaluation.runner import (Evaluation, check_given_thresholds, chosen_by_run, chosen_thresholds,
                                      default_methods, run, run_identity)
from segood.io import write_json
from segood.methods.methods import Method, check_grid, fits_grid, method_for_grid
from segood.methods.schedule import fit_methods, refuse_unrecordable, unfitted_methods
from segood.methods.scorer import Scorer
from segood.models.external import as_network
from segood.models.network import SegmentationNetwork, evaluation_mode


def start_distributed(device: str | None = None) -> str | None:
    """Join the process group when started by ``torchrun`` (WORLD_SIZE > 1): NCCL on CUDA (one GPU per local
    rank), gloo on CPU. Returns the device to evaluate on (``device`` unchanged outside torchrun)."""
    import os

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            device = device or f"cuda:{torch.cuda.current_device()}"
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return device


def evaluate(model: torch.nn.Module | Scorer, sets: dict[str, str | Path] | list[str | Path],
             methods: list[str | Method] | None = None, out_dir: str | Path | None = None,
             options: EvaluateOptions | None = None, **keywords) -> Results | None:
    """Evaluate pixel-level OOD methods of ``model`` on converted sets; returns the :class:`Results` (the results
    document, the content of results.json, with ``table()``, ``save(folder)`` and ``figures(folder)``).

    Args:
        model: a segood network; any ``nn.Module`` returning logits (N, C, h, w) of any number of classes C at any
            resolution (wrapped in :class:`~segood.models.external.ExternalModel`); or a
            :class:`~segood.methods.scorer.Scorer`, a callable that returns the anomaly scores itself
            (``methods`` then None: it is its own method). Logits at another resolution than the frames are
            resized to them bilinearly before scoring. With C other than the sets' 19 Cityscapes trainIds, every
            method that needs no class mapping runs and the report notes what is left out.
        sets: {name: path of a converted .h5 set} (or a list of paths, named by their stems).
        methods: None (every method the model's head serves; those needing a fit only with ``fit_set``), names,
            or method objects (e.g. tuned ones).
        out_dir: the run folder: run.json, the state (resumable with ``resume``), results.json, .csv, .md, .tex
            and, with ``figures``, the figures. None (the default): nothing is written (the run's state lives in
            a temporary folder while it runs); the results and the state are returned in memory.
        options: an :class:`EvaluateOptions` (batch size, device, grid, components, bootstrap, official mode,
            ...); ``keywords`` are its fields (``batch_size=4, grid="exact"``), put into ``options`` when both
            are given. Every option is documented there and checked there, once.

    Under ``torchrun`` (an initialised process group) each rank evaluates a contiguous block of each set's frames
    and the counts are all-reduced; rank 0 writes the outputs. Results equal a single-process run's (the Monte-Carlo
    methods' too: each frame's dropout masks are seeded by the frame; the network's own arithmetic on batches of
    other sizes may differ in the last bits).
    """
    options = EvaluateOptions.of(options, **keywords)
    if out_dir is None and options.resume:
        raise ValueError("resume continues a run saved in a folder: pass out_dir")
    with evaluation_mode(model), contextlib.ExitStack() as held:  # (its modules back in their own modes after)
        folder = out_dir if out_dir is not None else held.enter_context(
            tempfile.TemporaryDirectory(prefix="segood-run-"))  # (the run's state while it runs)
        model, sets, methods, description = prepare(model, sets, methods, options, out_dir)
        if out_dir is not None:  # (held until its report is written)
            held.enter_context(claimed_run(out_dir))
        ev = execute(model, sets, methods, folder, description, options)
        if ev is None:
            return None
        report = {"bootstrap": options.bootstrap, "commit_on": options.commit_on}
        doc = (build_results(RunFolder(folder).read_run(), ev, **report) if out_dir is None
               else write_report(out_dir, figures=options.figures, state=ev, **report))
    warn_coarse(doc)
    if doc["skipped_frames"]:
        warnings.warn(skipped_note(doc["skipped_frames"]), stacklevel=2)
    return Results(doc, ev)


def prepare(model, sets, methods, options, out_dir=None):
    """What :func:`evaluate` (and ``segood robustness``) run, checked before anything is written: (model, sets
    {name: path}, method objects (fitted), the run description for run.json), for ``options`` (an
    :class:`EvaluateOptions`). A run folder ``out_dir`` holding another run is refused before any fit."""
    o = options
    if isinstance(model, Scorer):
        given = [k for k, v in {"fit_set": o.fit_set, "feature_layer": o.feature_layer, "checkpoint": o.checkpoint,
                                "align_corners": o.align_corners}.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set up a network; scorer {model.name} returns its scores itself: "
                             "drop them")
        if methods is not None and [getattr(m, "name", m) for m in methods] != [model.name]:
            raise ValueError(f"scorer {model.name} is its own method: pass methods=None, or evaluate the methods "
                             "with a network instead")
        methods = [model]
    else:  # (in inference mode before a method is fitted on it: batch norm and dropout as when scoring)
        model = as_network(model, feature_layer=o.feature_layer, align_corners=o.align_corners).eval()
    if o.device is not None:
        model = model.to(o.device)
    if isinstance(sets, (list, tuple)):
        stems = [Path(p).stem for p in sets]
        if len(set(stems)) != len(stems):
            raise ValueError(f"sets named by their file stems must differ: {stems}; pass a dict {{name: path}}")
        sets = dict(zip(stems, sets))
    else:
        sets = dict(sets)
    frames = {name: len(_open_set(path, o.verify)) for name, path in sets.items()}
    if methods is None:
        # (on the linear grid: each in its [0, 1] form where it has one)
        methods = [method_for_grid(m.name, o.grid) for m in default_methods(model, fitted=o.fit_set is not None)]
        unfitted = [m.name for m in default_methods(model) if m.needs.fit and m.name not in {x.name for x in methods}]
        if unfitted:
            need = "it needs" if len(unfitted) == 1 else "they need"
            warnings.warn(f"{', '.join(unfitted)} left out: {need} a fit on training data (fit_set, --fit-set)",
                          stacklevel=3)
        unbinned = [m.name for m in methods if not fits_grid(m, o.grid)]
        if unbinned:
            warnings.warn(f"{', '.join(unbinned)} left out: the linear grid bins scores in its range only, and "
                          "theirs are unbounded (the float-order grid, the default, takes every method)", stacklevel=3)
            methods = [m for m in methods if m.name not in unbinned]
    methods = [method_for_grid(m, o.grid) if isinstance(m, str) else m for m in methods]  # by name: the grid's form
    refuse_unrecordable(methods)
    if o.commit_on is not None:
        _check_tuning_set(sets, o.commit_on, "commit_on (--commit-on)")
    if o.components and o.components.get("commit_on") is not None:
        _check_tuning_set(sets, o.components["commit_on"], "the component thresholds' tuning set")
    for method in methods:
        check_grid(method, o.grid)
    fitted = unfitted_methods(model, methods, o.fit_set)  # (fitted below, once the rest is checked)
    if o.fit_set is not None and not fitted:
        warnings.warn(f"fit_set (--fit-set) {o.fit_set} is not used: none of {', '.join(m.name for m in methods)} "
                      "needs a fit (or each came fitted)", stacklevel=3)
    description = {
        "toolkit": run_identity(),
        "model": {**_model_identity(model, o.checkpoint), **_outlier_exposure(model, sets)},
        "sets": {name: {**set_identity(path), "frames": frames[name]} for name, path in sets.items()},
        # a network fine-tuned with outlier exposure has seen OOD data, whatever the method
        "methods": {m.name: {**m.describe(), **({"uses_ood_data": True} if _exposed(model) else {})} for m in methods},
        "config": {"grid": o.grid, "batch_size": o.batch_size, **({"components": o.components} if o.components else {}),
                   **({"fit_set": set_identity(o.fit_set)} if fitted else {}),  # (a resume must fit on the same)
                   # each frame's dropout masks seeded by the frame (runs before drew them per batch: not resumed)
                   **({"mc_seeds": "per frame"} if any(m.needs.samples for m in methods) else {}),
                   **{key: getattr(o, key) for key in ("official", "amp", "compile") if getattr(o, key)}},
    }
    if out_dir is not None:  # (a folder holding another run is refused before a fit's pass over its training set)
        RunFolder(out_dir).refuse_another_run(description)
    fit_methods(model, fitted, o.fit_set, batch_size=o.batch_size, progress=o.progress)
    return model, sets, methods, description


@contextlib.contextmanager
def claimed_run(out_dir):
    """The run folder ``out_dir`` held by this run for the block (:meth:`RunFolder.claimed`): under torchrun rank 0
    takes it and every rank learns whether it did, so that no rank writes into a folder another run holds."""
    import torch.distributed as dist

    sharded = dist.is_available() and dist.is_initialized()
    with contextlib.ExitStack() as held:
        refused = None
        if not sharded or dist.get_rank() == 0:
            try:
                held.enter_context(RunFolder(out_dir).claimed())
            except FileExistsError as err:
                refused = str(err)
        if sharded:
            shared = [refused]
            dist.broadcast_object_list(shared, src=0)  # (between the run's own ranks)
            refused = shared[0]
        if refused:
            raise FileExistsError(refused)
        yield


def execute(model, sets, methods, out_dir, description, options, **run_options):
    """Run into ``out_dir`` (held with :func:`claimed_run` by the caller, until its report is written): refuse a
    folder that holds another run, write run.json (rank 0), evaluate (sharded under torchrun,
    :func:`segood.evaluation.runner.run` with ``options`` and ``run_options``) and save the merged state. Returns
    the :class:`Evaluation` on rank 0, None on the other ranks."""
    import torch.distributed as dist

    folder = RunFolder(out_dir)
    folder.refuse_another_run(description)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    fresh = not folder.run.exists()
    if rank == 0:
        write_json(folder.run, description)
    options = dataclasses.replace(options, progress=options.progress and rank == 0)
    try:
        ev = run(model, sets, methods, folder.path, options, rank=rank, world_size=world, **run_options)
    except BaseException:
        if fresh and rank == 0 and not list(folder.path.glob("state*.npz")):  # nothing to resume: no run here
            folder.run.unlink(missing_ok=True)
        raise
    if rank != 0:
        return None
    if world > 1:
        ev.save(folder.state())
    return ev


def evaluate_score_maps(scores_path: str | Path, data_path: str | Path, out_dir: str | Path,
                        options: ScoreOptions | None = None, **keywords) -> dict:
    """Evaluate per-pixel scores computed elsewhere; writes the run folder ``out_dir`` and returns the results
    document.

    ``scores_path``: the score maps of every frame of the set (H×W, any real dtype, higher = more OOD) in one of
    the layouts of :mod:`segood.evaluation.exchange`: segood's HDF5 file (one dataset per frame id), a folder of
    SegmentMeIfYouCan's ``<fid>.hdf5`` files or of Fishyscapes' ``<fid>_anomaly.npy`` files. ``options``: a
    :class:`~segood.evaluation.options.ScoreOptions` (the method's name, the declared score range, the grid,
    clip, figures, verify, official mode); ``keywords`` are its fields (``num_thresholds=400``), put into
    ``options`` when both are given. On the float-order grid (the default) any real score is binned; a declared
    range (``score_range``, or the segood file's root attribute ``score_range``) is checked. With ``num_thresholds``
    the paper's linear grid is used, on the declared range; ``grid`` names a grid as in :func:`evaluate` (on the
    exact grid too a declared range is checked). Missing, extra or unreadable frames, shape mismatches and
    out-of-range values are errors that name the frames and files.
    """
    options = ScoreOptions.of(options, **keywords)
    name, grid = options.name, options.grid
    inside = Path(out_dir).resolve()
    if Path(scores_path).resolve() in (inside, *inside.parents):
        raise ValueError(f"{out_dir} is in the score maps {scores_path} (their digest would change with the run's "
                         "files): write the run into another folder")
    dataset = _open_set(data_path, options.verify)
    set_name = Path(data_path).stem
    with contextlib.ExitStack() as stack, ScoreMaps(scores_path, frame_ids(data_path), frame_sizes(data_path)) as maps:
        declared = None if maps.score_range is None else score_range_of(maps.score_range)  # (the file's, checked)
        score_range = options.score_range or declared
        if grid["kind"] == "linear" and grid["score_range"] is None:  # the linear grid on the file's declared range
            if score_range is None:
                raise ValueError(f"{scores_path} declares no score_range, which the linear grid needs: pass "
                                 "--score-range LO HI, or drop --num-thresholds (the float-order grid needs no range)")
            grid = {**grid, "score_range": list(score_range)}
        check_given_thresholds(options.components, [name], [set_name])
        description = {"toolkit": run_identity(),
                       "model": {"score_maps": str(scores_path), "layout": maps.layout, "sha256": _sha256(scores_path)},
                       "sets": {set_name: {**set_identity(data_path), "frames": len(dataset)}},
                       "methods": {name: {"name": name, "params": {"score_range": list(score_range) if score_range
                                                                   else None}, "uses_ood_data": None}},
                       "config": {"grid": grid, **{key: getattr(options, key) for key in ("components", "official")
                                                   if getattr(options, key)}}}
        folder = RunFolder(out_dir)
        stack.enter_context(folder.claimed())  # (a second run into the folder meanwhile: refused)
        folder.refuse_another_run(description)  # (held, and before the frames are read)
        ev = Evaluation([name], [set_name], grid, options.components, official=options.official)
        if grid["kind"] != "linear" and score_range is not None:  # a declared range is checked, not a grid
            for acc in ev.acc.values():
                acc.score_range = score_range
        _each_frame(dataset, maps, set_name, lambda index, batch: ev.process(
            set_name, [index], batch, {name: batch["score"]}, clip=options.clip))
        if chosen_by_run(ev.components):  # thresholds tuned on this set (oracle): the components in a second pass
            ev.choose_component_thresholds(chosen_thresholds(ev.components, {(name, set_name): ev.acc[
                (name, set_name)].compute()}))
            if (name, set_name) in ev.comp:  # (none where the set lacks ID or OOD pixels)
                _each_frame(dataset, maps, set_name, lambda index, batch: ev.update_components(
                    name, set_name, batch["score"], batch["ood_mask"]))
        write_json(folder.run, description)
        ev.save(folder.state())
        doc = write_report(folder.path, figures=options.figures, state=ev)
    warn_coarse(doc)
    return doc


def _each_frame(dataset, maps, set_name, update):
    """``update(index, batch)`` of each frame of a set with its score map (a batch of one frame, ``score`` beside
    the set's arrays), read by the reader processes; an unreadable frame, or one whose update fails, is a ValueError
    naming it."""
    frames = {set_name: ScoredFrames(dataset, maps)}
    plan = [(set_name, [index]) for index in range(len(dataset))]
    workers = default_workers(frames, plan)
    reads = batch_reader(frames, plan, workers=workers)
    with contextlib.closing(reads), beside_readers(workers):
        for index, frame_id in enumerate(maps.frame_ids):
            try:
                [(batch, _)], _ = next(reads)
                update(index, batch)
            except UnreadableFrame as err:
                raise ValueError(err.reason) from None
            except (ValueError, TypeError) as err:
                raise ValueError(f"frame {frame_id}: {err}") from None


class ScoredFrames(torch.utils.data.Dataset):
    """The frames of a set with their score maps (``score``, (H, W) as stored), read together: by the reader
    processes of :func:`~segood.evaluation.reading.batch_reader`, as an evaluation reads its frames."""

    def __init__(self, dataset, maps):
        self.dataset, self.maps = dataset, maps
        self.sizes = getattr(dataset, "sizes", None)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        item, frame_id = self.dataset[index], self.maps.frame_ids[index]
        score = self.maps[frame_id]  # (its shape checked against the frame's before it is read)
        return {**item, "score": torch.from_numpy(np.ascontiguousarray(score))}


def _check_tuning_set(sets, name, what):
    """A set to commit thresholds on must be one of the run's, with ID and OOD pixels (read from its manifest):
    refused before the run rather than reported as thresholds of none."""
    if name not in sets:
        raise ValueError(f"{what} {name!r} is not a set of the run; choose one of {list(sets)}")
    pixels = read_manifest(sets[name]).get("pixels", {}) if isinstance(sets[name], (str, Path)) else {}
    if pixels and not (pixels.get("id") and pixels.get("ood")):
        raise ValueError(f"{what} {name!r}: a threshold needs ID and OOD pixels on the tuning set, and it has "
                         f"{pixels.get('id', 0)} ID and {pixels.get('ood', 0)} OOD; choose a set of both (a mix)")


def _open_set(path, verify=True):
    """The set as a Dataset, or a ValueError saying why the file is not a converted segood set (or holds frames
    without public labels)."""
    try:
        dataset = H5SegmentationDataset(path, verify=verify)
    except KeyError as err:
        raise ValueError(f"{path} is not a segood set ({err}); convert the data with segood convert") from None
    if len(dataset) == 0:
        raise ValueError(f"{path} holds no frames: nothing to evaluate; check the conversion's skipped frames in "
                         "its manifest and convert again")
    require_labels(path)
    return dataset


def _model_identity(model, checkpoint):
    """What the model is, down to its weights (so that --resume never mixes two models); a scorer, its function."""
    if isinstance(model, Scorer):
        return model.identity()
    if checkpoint is not None:
        return {"checkpoint": str(checkpoint), "sha256": _sha256(checkpoint), "config": model.config.to_dict()}
    weights = _weights_sha256(model)
    if isinstance(model, SegmentationNetwork):
        return {"config": model.config.to_dict(), "weights_sha256": weights}
    inner = model.module
    return {"class": f"{type(inner).__module__}.{type(inner).__qualname__}",
            "parameters": int(sum(p.numel() for p in inner.parameters())),
            "served_heads": sorted(model.served_heads), "weights_sha256": weights,
            **({"align_corners": True} if model.align_corners else {}),  # (False, the default, as before it existed)
            **(model.describe() if hasattr(model, "describe") else {})}  # a library adapter: its inference mode


def _outlier_exposure(model, sets):
    """{"outlier_exposure": the checkpoint's OE record with ``same_source_sets``} for a network fine-tuned with
    outlier exposure ({} for others), warning about test sets whose OOD objects share the OE objects' source."""
    from segood.models.train import same_source_sets

    record = getattr(model, "outlier_exposure", None)
    if not isinstance(record, dict):
        return {}
    same = same_source_sets(record, sets)
    if same:
        warnings.warn(f"the network was fine-tuned with outlier exposure on objects from "
                      f"{', '.join(record.get('object_sources') or [])}, the same source as the OOD objects of test "
                      f"set(s) {', '.join(same)}: their results are flagged (same_source_oe); test on objects of "
                      "another source", stacklevel=4)
    return {"outlier_exposure": {**record, "same_source_sets": same}}


def _exposed(model):
    return isinstance(getattr(model, "outlier_exposure", None), dict)


def _weights_sha256(model):
    """sha256 of the model's state dict (names and bytes), hashed again only when a tensor changed (its storage or
    its in-place version counter): a notebook evaluating one model many times hashes its weights once."""
    state = sorted(model.state_dict().items())
    versions = tuple((name, tensor.data_ptr(), tensor._version) for name, tensor in state)
    cached = _WEIGHT_DIGESTS.get(model)
    if cached is not None and cached[0] == versions:
        return cached[1]
    digest = hashlib.sha256()
    for name, tensor in state:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # (no bytes copy)
    _WEIGHT_DIGESTS[model] = versions, digest.hexdigest()
    return digest.hexdigest()


_WEIGHT_DIGESTS = weakref.WeakKeyDictionary()


def _sha256(path):
    """sha256 of a file, or of a folder's files (names and contents, in sorted order)."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()

