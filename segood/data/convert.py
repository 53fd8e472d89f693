"""Convert a raw dataset once into a segood set (HDF5 + manifest), and mix OOD sets with ID frames."""

import multiprocessing
import signal
import warnings
from pathlib import Path

import numpy as np
from tqdm import tqdm

from segood.data.common import LeftOut, Sample, SkipFrame, resize_sample
from segood.data.h5 import H5SegmentationDataset, SetWriter, check_output, encode, object_sources, read_manifest
from segood.io import atomic_write_text


class ConversionError(RuntimeError):
    """A frame could not be converted and ``strict`` was asked for, or no frame could be converted."""


class ConversionWarning(UserWarning):
    """Something in the raw data that the conversion handled by a rule but a user should know about."""


_ADAPTER = None  # the adapter of a pool worker, set once by the pool initialiser


def _init_worker(adapter, in_pool=False):
    global _ADAPTER
    _ADAPTER = adapter
    if in_pool:  # SIGTERM ends a pool's worker at once, as multiprocessing expects of Pool.terminate: a worker that
        # inherited the command's handler (SystemExit, exit_on_sigterm) could die holding the task queue's lock,
        # and the pool then waited for it for ever
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _load(job):
    """Worker: (frame_id, EncodedFrame or None, skip reason or None, the file a rule left out or None). An
    unexpected error (a bug, not a bad frame) stops the conversion with a ConversionError that names the frame."""
    ref, size = job
    frame_id = _ADAPTER.frame_id(ref)
    try:
        return frame_id, encode(resize_sample(_ADAPTER.load(ref), size)), None, None
    except SkipFrame as reason:
        return frame_id, None, str(reason), reason.path if isinstance(reason, LeftOut) else None
    except Exception as err:  # noqa: BLE001 - re-raised with the frame named
        raise ConversionError(f"{frame_id}: unexpected {type(err).__name__} while converting: {err}") from err


def convert(adapter, out, *, size=None, workers=0, strict=False, overwrite=False, progress=True, attrs=None):
    """Write every frame of ``adapter`` (an :class:`~segood.data.adapter.Adapter`) to the set ``out``, each at its
    native size, or resized to ``size`` = (H, W) (default: the adapter's ``default_size``, None for most), recorded
    as the manifest's ``resize``.

    Frames that cannot be converted are skipped and listed with their reason in the manifest, unless
    ``strict``. ``workers`` > 0 decodes and rasterises in a process pool. A conversion in which no frame
    converts is an error; files of the raw tree the adapter did not use are listed under ``unused_files``;
    the adapter's warnings (``manifest["warnings"]``) are also issued as :class:`ConversionWarning`. Nothing
    is written unless the whole set is. Frames without public labels (``adapter.has_labels``) are listed under
    ``unlabelled_frames``: such a set can be scored and exported, never evaluated. Returns the manifest.
    """
    size = size or adapter.default_size
    size = None if size is None else tuple(int(v) for v in size)
    skipped = list(adapter.prefiltered)
    if strict and skipped:
        raise ConversionError(f"{skipped[0][0]}: {skipped[0][1]} (and {len(skipped) - 1} more)")
    refs = adapter.refs()
    unlabelled = {adapter.frame_id(ref) for ref in refs if not adapter.has_labels(ref)}
    attrs = {**adapter.provenance(), "resize": None if size is None else list(size), **(attrs or {})}
    writer = SetWriter(out, size, attrs, overwrite=overwrite)
    jobs = [(ref, size) for ref in refs]
    pool = multiprocessing.get_context("fork").Pool(workers, _init_worker, (adapter, True)) if workers > 0 else None
    extras, left_out = [], []
    try:
        if pool is None:
            _init_worker(adapter)
        results = pool.imap(_load, jobs, chunksize=2) if pool else map(_load, jobs)
        for frame_id, sample, reason, unused in tqdm(results, total=len(jobs), desc=f"convert {adapter.source}",
                                                     unit="frame", disable=not progress):
            if unused is not None:
                left_out.append((unused, reason))
                continue
            if reason is not None:
                if strict:
                    raise ConversionError(f"{frame_id}: {reason}")
                skipped.append((frame_id, reason))
                continue
            if frame_id in unlabelled and sample.pixels["id"] + sample.pixels["ood"]:
                raise ConversionError(f"{frame_id}: {type(adapter).__name__} says the frame has no labels but "
                                      "its mask is not all ignore (a bug in the adapter)")
            writer.append(sample)
            if sample.extra:
                extras.append(sample.extra)
        if not writer.frame_ids:
            reasons = "; ".join(f"{f}: {r}" for f, r in skipped[:3]) or "the adapter listed no frame"
            unused = [*adapter.unused_files, *left_out]
            if unused:  # e.g. every frame left out by a rule of the dataset
                path, reason = unused[0]
                reasons += f"; {len(unused)} files of the raw tree not used, e.g. {path}: {reason}"
            raise ConversionError(f"no frame of {adapter.source} could be converted ({len(skipped)} skipped: "
                                  f"{reasons}); nothing was written")
        summary = adapter.summary(extras) if extras else {}
        unused = [{"path": path, "reason": reason} for path, reason in [*adapter.unused_files, *left_out]]
        unlabelled = [f for f in writer.frame_ids if f in unlabelled]
        manifest = writer.commit(skipped, {**summary, **({"unused_files": unused} if unused else {}),
                                           **({"unlabelled_frames": unlabelled} if unlabelled else {})})
    except BaseException:
        writer.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
    for suffix, text in (adapter.reports(summary) if summary else {}).items():
        atomic_write_text(Path(out).with_suffix(suffix), text)
    for message in manifest.get("warnings", ()):
        warnings.warn(f"{out}: {message}", ConversionWarning, stacklevel=2)
    return manifest


def mix(ood_path, id_path, out, *, seed=0, id_frames=None, overwrite=False, progress=True):
    """An evaluation set: every frame of the OOD set plus ``id_frames`` (default all) frames of the ID set
    (e.g. Cityscapes val), in a seeded order. Frame ids become ``<source>/<frame_id>``. Returns the manifest,
    whose ``id_to_ood_ratio`` is the set's ID:OOD pixel ratio (the paper: about 7.5:1 IDD, 3:1 SUN)."""
    if id_frames is not None and int(id_frames) < 0:
        raise ValueError(f"id_frames must be at least 0, got {id_frames}")
    check_output(out, overwrite=overwrite, inputs=(ood_path, id_path))  # (before reading anything)
    sources, unlabelled = [], []
    for path, role in ((ood_path, "OOD"), (id_path, "ID")):
        manifest = read_manifest(path)
        if manifest["source"] == "mix":  # its ID frames would come twice, or its OOD frames count as ID
            made_of = " and ".join(c["file"] for c in manifest.get("components", ()))
            raise ValueError(f"{path} is already a mixed set (of {made_of}); give the {role} set itself")
        unlabelled += [f"{manifest['source']}/{f}" for f in manifest.get("unlabelled_frames", ())]
        sources.append({"file": str(path), "source": manifest["source"], "split": manifest["split"],
                        "frames": manifest["frames"], "sha256": manifest["sha256"],
                        "object_sources": object_sources(manifest)})
    a, b = (H5SegmentationDataset(path) for path in (ood_path, id_path))  # frames verified as they are read
    n_id = len(b) if id_frames is None else min(int(id_frames), len(b))
    frames = [(0, i) for i in range(len(a))] + [(1, i) for i in range(n_id)]
    order = np.random.default_rng(seed).permutation(len(frames))
    writer = SetWriter(out, None, {"source": "mix", "split": "eval", "seed": seed, "components": sources},
                       overwrite=overwrite, inputs=(ood_path, id_path))
    try:
        for k in tqdm(order, desc="mix", unit="frame", disable=not progress):
            which, i = frames[k]
            item = (a, b)[which][i]
            writer.append(Sample(item["image"].permute(1, 2, 0).numpy(), item["ood_mask"].numpy(),
                                 item["semantic"].numpy(), f"{sources[which]['source']}/{item['frame_id']}"))
        return writer.commit(extra={"unlabelled_frames": unlabelled} if unlabelled else None)
    except BaseException:
        writer.abort()
        raise
