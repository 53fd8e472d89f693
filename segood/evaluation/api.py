"""``segood.evaluate`` for any segmentation model, and the evaluation of black-box score maps."""

import hashlib
import json
from pathlib import Path

import torch

from segood.data.h5 import H5SegmentationDataset, frame_ids, frame_loader, require_labels, set_identity
from segood.evaluation.exchange import ScoreMaps
from segood.evaluation.layout import RunFolder
from segood.evaluation.report import grid_of_config, write_report
from segood.evaluation.runner import Evaluation, component_spec, default_methods, run, run_identity
from segood.io import write_json
from segood.methods import get_method
from segood.methods.methods import check_grid
from segood.methods.scorer import Scorer
from segood.metrics import grid_spec, make_accumulator
from segood.metrics.bootstrap import Bootstrap
from segood.metrics.official import check_benchmark
from segood.models.external import ExternalModel
from segood.models.network import SegmentationNetwork


def start_distributed(device=None):
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


def evaluate(model, sets, methods=None, out_dir="runs/eval", *, batch_size=2, device=None, num_thresholds=None,
             score_range=None, mantissa_bits=None, resume=False, save_every=20, progress=True, figures=True,
             skip_bad=False, fit_set=None, checkpoint=None, feature_layer=None, verify=True, components=None,
             bootstrap=Bootstrap(), commit_on=None, official=None, align_corners=None):
    """Evaluate pixel-level OOD methods of ``model`` on converted sets; writes ``out_dir`` and returns the
    results document (the content of results.json).

    Args:
        model: a segood network; any ``nn.Module`` returning logits (N, C, h, w) of any number of classes C at any
            resolution (wrapped in :class:`ExternalModel`; ``feature_layer`` names the layer whose output
            Mahalanobis models); or a :class:`~segood.methods.scorer.Scorer`, a callable that returns the
            anomaly scores itself (``methods`` then None: it is its own method). Logits at another resolution than
            the frames are resized to them bilinearly before scoring. With C other than the sets' 19 Cityscapes
            trainIds, every method that needs no class mapping runs and the report notes what is left out.
        align_corners: how such logits are resized: as the model's own library does (default False, torch and
            smp's ``F.interpolate(..., mode="bilinear", align_corners=False)``); for ``nn.Module`` models.
        sets: {name: path of a converted .h5 set} (or a list of paths, named by their stems).
        methods: None (every method the model's head serves; those needing a fit only with ``fit_set``), names,
            or method objects (e.g. tuned ones).
        fit_set: a converted training set to fit Mahalanobis on, when it is requested unfitted.
        checkpoint: the checkpoint file the model came from, recorded with its sha256.
        num_thresholds, score_range, mantissa_bits: the threshold grid (:func:`segood.metrics.grid_spec`): the
            float-order grid at ``mantissa_bits`` (default 10) for scores of any real value, or, when
            ``num_thresholds`` or ``score_range`` is given, the paper's linear grid (scores in the range).
        verify: check every frame against its set's manifest as it is read (a corrupt frame is an error naming
            it, or skipped with ``skip_bad``); False skips the check for speed.
        components: component-level metrics (SegmentMeIfYouCan's): {"preset": "anomaly" or "obstacle",
            "thresholds": {method: threshold, or {set: threshold}}, "source": "committed" (the default:
            thresholds chosen on a tuning set) or "oracle" (chosen on each test set itself)}, counted in the pixel
            pass. Without "thresholds" the run chooses them after its pixel pass and scores the frames again in a
            components pass: committed on the set ``commit_on`` by "rule" (default "f1", best pixel F1), or, with
            "source": "oracle", each set's own (:func:`segood.evaluation.runner.component_spec`).
        bootstrap, commit_on: the report's intervals and committed thresholds (:func:`write_report`); the
            component thresholds' tuning set when the run chooses them.
        official: "smiyc" or "fishyscapes": also that benchmark's own computation of its numbers (its AP and FPR95;
            SMIYC's component metrics too), reported beside segood's and named so (``docs/official.md``,
            :mod:`segood.metrics.official`).

    Under ``torchrun`` (an initialised process group) each rank evaluates every world_size-th frame and the
    counts are all-reduced; rank 0 writes the outputs. Results equal a single-process run exactly.
    """
    model, sets, methods, grid, components, description = prepare(
        model, sets, methods, batch_size=batch_size, device=device, num_thresholds=num_thresholds,
        score_range=score_range, mantissa_bits=mantissa_bits, progress=progress, fit_set=fit_set,
        checkpoint=checkpoint, feature_layer=feature_layer, verify=verify, components=components, commit_on=commit_on,
        official=official, align_corners=align_corners)
    ev = execute(model, sets, methods, out_dir, description, batch_size=batch_size, device=device, grid=grid,
                 resume=resume, save_every=save_every, progress=progress, skip_bad=skip_bad, verify=verify,
                 components=components, official=official)
    return None if ev is None else write_report(out_dir, figures=figures, bootstrap=bootstrap, commit_on=commit_on)


def prepare(model, sets, methods=None, *, batch_size=2, device=None, num_thresholds=None, score_range=None,
            mantissa_bits=None, progress=True, fit_set=None, checkpoint=None, feature_layer=None, verify=True,
            components=None, commit_on=None, official=None, align_corners=None):
    """What :func:`evaluate` (and ``segood robustness``) run, checked before anything is written: (model, sets
    {name: path}, method objects (fitted), grid, components spec, the run description for run.json)."""
    if isinstance(model, Scorer):
        given = [k for k, v in {"fit_set": fit_set, "feature_layer": feature_layer, "checkpoint": checkpoint,
                                "align_corners": align_corners}.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set up a network; scorer {model.name} returns its scores itself: "
                             "drop them")
        if methods is not None and [getattr(m, "name", m) for m in methods] != [model.name]:
            raise ValueError(f"scorer {model.name} is its own method: pass methods=None, or evaluate the methods "
                             "with a network instead")
        methods = [model]
    elif not isinstance(model, torch.nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, not a torch nn.Module; a callable that returns anomaly "
                        "scores itself is evaluated as segood.Scorer(fn)")
    elif not isinstance(model, (SegmentationNetwork, ExternalModel)):
        model = ExternalModel(model, feature_layer, align_corners=bool(align_corners))
    elif align_corners is not None:
        if isinstance(model, SegmentationNetwork):
            raise ValueError("align_corners sets how a model's smaller logits are resized to the frame; a segood "
                             "network gives them at the frame's size already: drop it")
        model.align_corners = bool(align_corners)
    if device is not None:
        model = model.to(device)
    if isinstance(sets, (list, tuple)):
        stems = [Path(p).stem for p in sets]
        if len(set(stems)) != len(stems):
            raise ValueError(f"sets named by their file stems must differ: {stems}; pass a dict {{name: path}}")
        sets = dict(zip(stems, sets))
    else:
        sets = dict(sets)
    frames = {name: len(_open_set(path, verify)) for name, path in sets.items()}
    if methods is None:
        methods = default_methods(model, fitted=fit_set is not None)
    methods = [get_method(m) if isinstance(m, str) else m for m in methods]
    grid = grid_spec(num_thresholds, score_range, mantissa_bits)
    make_accumulator(grid)  # a bad grid is refused before anything is written
    components = component_spec(components, commit_on)
    check_benchmark(official)
    if components and components.get("commit_on") is not None and components["commit_on"] not in sets:
        raise ValueError(f"the component thresholds' tuning set {components['commit_on']!r} is not a set of the "
                         f"run; choose one of {list(sets)}")
    for method in methods:
        check_grid(method, grid)
        method.check(model)
        if method.needs.fit and not method.ready:
            if fit_set is None:
                raise ValueError(f"{method.name} needs its training statistics: pass fit_set (--fit-set), a "
                                 "converted training set, or a fitted method")
            method.fit(model, frame_loader(H5SegmentationDataset(fit_set), batch_size),
                       progress=progress)
    description = {
        "toolkit": run_identity(),
        "model": _model_identity(model, checkpoint),
        "sets": {name: {**set_identity(path), "frames": frames[name]} for name, path in sets.items()},
        "methods": {m.name: m.describe() for m in methods},
        "config": {"grid": grid, "batch_size": batch_size, **({"components": components} if components else {}),
                   **({"official": official} if official else {})},
    }
    return model, sets, methods, grid, components, description


def execute(model, sets, methods, out_dir, description, **options):
    """Run into ``out_dir``: refuse a folder that holds another run, write run.json (rank 0), evaluate (sharded
    under torchrun, :func:`segood.evaluation.runner.run` with ``options``) and save the merged state. Returns the
    :class:`Evaluation` on rank 0, None on the other ranks."""
    import torch.distributed as dist

    folder = RunFolder(out_dir)
    _check_run_folder(folder, description)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    if rank == 0:
        write_json(folder.run, description)
    progress = options.pop("progress", True) and rank == 0
    ev = run(model, sets, methods, folder.path, progress=progress, rank=rank, world_size=world, **options)
    if rank != 0:
        return None
    if world > 1:
        ev.save(folder.state())
    return ev


def evaluate_score_maps(scores_path, data_path, out_dir, *, name="external", score_range=None, num_thresholds=None,
                        mantissa_bits=None, clip=False, figures=True, verify=True):
    """Evaluate per-pixel scores computed elsewhere.

    ``scores_path``: the score maps of every frame of the set (H×W, any real dtype, higher = more OOD) in one of
    the layouts of :mod:`segood.evaluation.exchange`: segood's HDF5 file (one dataset per frame id), a folder of
    SegmentMeIfYouCan's ``<fid>.hdf5`` files or of Fishyscapes' ``<fid>_anomaly.npy`` files. On the float-order
    grid (the default) any real score is binned; a declared range (``score_range``, or the segood file's root
    attribute ``score_range``) is checked. With ``num_thresholds`` the paper's linear grid is used, on the
    declared range. Missing, extra or unreadable frames, shape mismatches and out-of-range values are errors that
    name the frames and files.
    """
    dataset = _open_set(data_path, verify)
    set_name = Path(data_path).stem
    with ScoreMaps(scores_path, frame_ids(data_path)) as maps:
        score_range = score_range or maps.score_range
        if num_thresholds is not None and score_range is None:
            raise ValueError(f"{scores_path} declares no score_range, which the linear grid needs: pass --score-range "
                             "LO HI, or drop --num-thresholds (the float-order grid needs no range)")
        linear = num_thresholds is not None
        grid = grid_spec(num_thresholds, score_range if linear else None, None if linear else mantissa_bits)
        make_accumulator(grid)
        if clip and not linear:
            raise ValueError("clip has no meaning on the float-order grid (every real score has a bin): drop "
                             "--clip, or use the linear grid with --num-thresholds")
        ev = Evaluation([name], [set_name], grid)
        if not linear and score_range is not None:  # a declared range is checked, not a grid
            for acc in ev.acc.values():
                acc.score_range = tuple(score_range)
        for index, frame_id in enumerate(maps.frame_ids):
            item = dataset[index]
            score = maps[frame_id]
            if score.shape != tuple(item["ood_mask"].shape):
                raise ValueError(f"frame {frame_id}: scores of shape {score.shape}, the frame is "
                                 f"{tuple(item['ood_mask'].shape)} (maps are exchanged at each frame's own size)")
            batch = {key: item[key][None] for key in ("image", "ood_mask", "semantic")}
            try:
                ev.process(set_name, [index], batch, {name: torch.from_numpy(score)[None]}, clip=clip)
            except (ValueError, TypeError) as err:
                raise ValueError(f"frame {frame_id}: {err}") from None
    description = {"toolkit": run_identity(),
                   "model": {"score_maps": str(scores_path), "layout": maps.layout,
                             "sha256": _sha256(scores_path)},
                   "sets": {set_name: {**set_identity(data_path), "frames": len(dataset)}},
                   "methods": {name: {"name": name, "params": {"score_range": list(score_range) if score_range else None},
                                      "uses_ood_data": None}},
                   "config": {"grid": grid}}
    folder = RunFolder(out_dir)
    _check_run_folder(folder, description)
    write_json(folder.run, description)
    ev.save(folder.state())
    return write_report(folder.path, figures=figures)


def _check_run_folder(folder, description):
    """Refuse an output folder that holds a different run (another model, sets, methods or settings)."""
    if folder.run.exists():
        previous = folder.read_run()
        config = previous.get("config") or {}  # runs before the float-order grid name num_thresholds: the linear grid
        previous["config"] = {**{k: v for k, v in config.items() if k not in ("num_thresholds", "score_range")},
                              "grid": grid_of_config(config)}
        if any(_comparable(previous.get(k)) != _comparable(description[k]) for k in ("model", "sets", "methods", "config")):
            raise ValueError(f"{folder.path} holds a different run (another model, sets, methods or settings); "
                             "choose another --out")


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


def _some(names):
    return "none" if not names else ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


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


def _weights_sha256(model):
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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


def _comparable(obj):
    return json.loads(json.dumps(obj, sort_keys=True, default=str))
