"""Convert a raw dataset once into a segood set (HDF5 + manifest), and mix OOD sets with ID frames."""

import multiprocessing
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from segood.data.common import Sample, SkipFrame, resize_sample
from segood.data.h5 import ARRAYS, SetWriter, encode, read_manifest
from segood.io import atomic_write_text


class ConversionError(RuntimeError):
    """A frame could not be converted and ``strict`` was asked for."""


_ADAPTER = None  # the adapter of a pool worker, set once by the pool initialiser


def _init_worker(adapter):
    global _ADAPTER
    _ADAPTER = adapter


def _load(job):
    """Worker: (frame_id, EncodedFrame or None, skip reason or None)."""
    ref, size = job
    try:
        return _ADAPTER.frame_id(ref), encode(resize_sample(_ADAPTER.load(ref), size)), None
    except SkipFrame as reason:
        return _ADAPTER.frame_id(ref), None, str(reason)


def convert(adapter, out, *, size=None, workers=0, strict=False, overwrite=False, progress=True, attrs=None):
    """Write every frame of ``adapter`` (an :class:`~segood.data.adapter.Adapter`), resized to ``size`` = (H, W)
    (default: the adapter's ``native_size``), to the set ``out``.

    Frames that cannot be converted are skipped and listed with their reason in the manifest, unless
    ``strict``. ``workers`` > 0 decodes and rasterises in a process pool. Returns the manifest.
    """
    size = tuple(int(v) for v in (size or adapter.native_size))
    skipped = list(adapter.prefiltered)
    if strict and skipped:
        raise ConversionError(f"{skipped[0][0]}: {skipped[0][1]} (and {len(skipped) - 1} more)")
    refs = adapter.refs()
    attrs = {**adapter.provenance(), "resize": list(size), **(attrs or {})}
    writer = SetWriter(out, size, attrs, overwrite=overwrite)
    jobs = [(ref, size) for ref in refs]
    pool = multiprocessing.get_context("fork").Pool(workers, _init_worker, (adapter,)) if workers > 0 else None
    extras = []
    try:
        if pool is None:
            _init_worker(adapter)
        results = pool.imap(_load, jobs, chunksize=2) if pool else map(_load, jobs)
        for frame_id, sample, reason in tqdm(results, total=len(jobs), desc=f"convert {adapter.source}",
                                             unit="frame", disable=not progress):
            if reason is not None:
                if strict:
                    raise ConversionError(f"{frame_id}: {reason}")
                skipped.append((frame_id, reason))
                continue
            writer.append(sample)
            if sample.extra:
                extras.append(sample.extra)
        summary = adapter.summary(extras) if extras else {}
        for suffix, text in (adapter.reports(summary) if summary else {}).items():
            atomic_write_text(Path(out).with_suffix(suffix), text)
        return writer.commit(skipped, summary)
    except BaseException:
        writer.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()


def mix(ood_path, id_path, out, *, seed=0, id_frames=None, overwrite=False, progress=True):
    """An evaluation set: every frame of the OOD set plus ``id_frames`` (default all) frames of the ID set
    (e.g. Cityscapes val), in a seeded order. Frame ids become ``<source>/<frame_id>``. Returns the manifest,
    whose ``id_to_ood_ratio`` is the set's ID:OOD pixel ratio (the paper: about 7.5:1 IDD, 3:1 SUN)."""
    sources = []
    for path in (ood_path, id_path):
        manifest = read_manifest(path)
        sources.append({"file": str(path), "source": manifest["source"], "split": manifest["split"],
                        "frames": manifest["frames"], "sha256": manifest["sha256"]})
    with h5py.File(ood_path, "r") as a, h5py.File(id_path, "r") as b:
        if a["images"].shape[1:] != b["images"].shape[1:]:
            raise ValueError(f"the sets differ in size: {a['images'].shape[1:3]} vs {b['images'].shape[1:3]}; "
                             "convert both with the same --size")
        n_id = len(b["frame_id"]) if id_frames is None else min(int(id_frames), len(b["frame_id"]))
        frames = [(0, i) for i in range(len(a["frame_id"]))] + [(1, i) for i in range(n_id)]
        order = np.random.default_rng(seed).permutation(len(frames))
        writer = SetWriter(out, a["images"].shape[1:3], {"source": "mix", "split": "eval", "seed": seed,
                                                         "components": sources}, overwrite=overwrite)
        try:
            for k in tqdm(order, desc="mix", unit="frame", disable=not progress):
                which, i = frames[k]
                f, source = (a, b)[which], sources[which]["source"]
                arrays = [f[name][i] for name in ARRAYS]
                writer.append(Sample(*arrays, f"{source}/{f['frame_id'][i].decode()}"))
            return writer.commit()
        except BaseException:
            writer.abort()
            raise
