"""``segood attack``: search each target method's worst case, write the sets, evaluate the transfer matrix and
write the report.

Layout of ``out_dir``: ``state/<method>/<frame>.json`` (the searches' per-frame states, for ``resume``),
``calibration/<network>.json``, ``sets/worst_<method>.h5`` and ``sets/random_<network>.h5`` (converted sets
with manifests), ``eval/<network>/`` (the evaluation runs), ``figures/worst_<method>.png``, ``attack.json``
(the document) and ``attack.md`` (the report).
"""

import hashlib
import os
import shutil
import time
from pathlib import Path

from segood.attack.constraints import ood_only
from segood.attack.generator import LATENT, load_generator, object_crops, save_generator, train
from segood.attack.options import AttackOptions
from segood.attack.report import example_figure, markdown
from segood.attack.search import Target, calibrate, search_set
from segood.attack.sets import transfer_matrix, write_set
from segood.attack.space import Scene, SearchSpace
from segood.data.h5 import H5SegmentationDataset, read_manifest, set_identity
from segood.data.paste import demo_objects, sun_objects
from segood.data.sun import SunLabelMap
from segood.evaluation.layout import refuse_another_command
from segood.io import atomic_write_text, output_file, write_json
from segood.methods import get_method
from segood.methods.schedule import fit_methods, unfitted_methods
from segood.models import load_model


def parse_targets(pairs):
    """[(method, checkpoint)] from ``METHOD=CHECKPOINT`` texts or pairs; a method named twice is refused (its
    worst-case set would be ambiguous)."""
    targets = []
    for pair in pairs:
        if isinstance(pair, str) and "=" not in pair:
            raise ValueError(f"target {pair!r}: write METHOD=CHECKPOINT, e.g. energy=checkpoints/demo_plain.pt")
        method, checkpoint = pair.split("=", 1) if isinstance(pair, str) else pair
        targets.append((str(method), Path(checkpoint)))
    names = [m for m, _ in targets]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"each target method is named once (METHOD=CHECKPOINT), got {names}")
    networks = {}
    for _, checkpoint in targets:  # a network is named by its file stem (its sets and calibration carry it)
        other = networks.setdefault(checkpoint.stem, checkpoint)
        if Path(os.path.abspath(other)) != Path(os.path.abspath(checkpoint)):
            raise ValueError(f"targets' checkpoints {other} and {checkpoint} share the name {checkpoint.stem!r}, by "
                             "which the attack names each network: copy or link one under another name")
    return targets


def object_bank(objects="demo", label_map="sun"):
    """(the label map, the bank's objects it calls OOD) of ``objects``: ``"demo"`` or a SUN2012 root."""
    labels = SunLabelMap(label_map)
    bank, _, _ = demo_objects(labels) if str(objects) == "demo" else sun_objects(objects, labels)
    return labels, ood_only(bank, labels)


def train_generator(path, *, objects="demo", label_map="sun", latent=LATENT, epochs=200, seed=0, progress=True):
    """Train the attack's generator (:mod:`segood.attack.generator`) on the crops of the OOD objects of
    ``objects`` and write it atomically to ``path``. Returns the training record (settings, loss per epoch, the
    final reconstruction loss, the objects' keys and the seconds it took)."""
    path = output_file(path, ".pt", "the generator")
    if path.exists():  # (a .pt file may be a network's checkpoint: a generator replaces only a generator)
        try:
            load_generator(path)
        except ValueError:
            raise ValueError(f"{path} exists and is not a segood generator (a network's checkpoint?); a generator "
                             "replaces only a generator: choose another --out") from None
    _, bank = object_bank(objects, label_map)
    started = time.perf_counter()
    images, _ = object_crops(bank, ObjectImages())
    model, record = train(images, latent=latent, epochs=epochs, seed=seed, progress=progress)
    record = {**record, "objects": str(objects), "label_map": label_map, "keys": [o.key for o in bank],
              "seconds": time.perf_counter() - started}
    save_generator(path, model, record)
    return record


def attack(targets: list[str | tuple[str, str | Path]], frames: str | Path, out_dir: str | Path,
           options: AttackOptions | None = None, **keywords) -> dict:
    """Search every target's worst case on the clean frames of ``frames`` and evaluate every method on every set.

    Args:
        targets: [(method name, checkpoint path)] or ``METHOD=CHECKPOINT`` texts (:func:`parse_targets`).
        frames: a converted set of clean ID frames with road or sidewalk (e.g. Cityscapes val).
        out_dir: the attack's folder (its layout: this module's docstring).
        options: an :class:`~segood.attack.options.AttackOptions` (objects, blending, the search's
            :class:`~segood.attack.search.SearchConfig`, fit set, resume, device, generator, ...); ``keywords`` are
            its fields (``config=SearchConfig(budget=50), max_frames=10``), put into ``options`` when both are
            given. Every option is documented there and checked there, once.

    Returns the document written to ``attack.json``.
    """
    o = AttackOptions.of(options, **keywords)
    config, fit_set, progress = o.config, o.fit_set, o.progress
    out = Path(out_dir)
    refuse_another_command(out, "attack.json")
    if (out / "state").exists() and not o.resume:
        raise ValueError(f"{out} holds an attack; pass resume=True (--resume) to continue it, or choose another --out")
    targets = parse_targets(targets)
    pixels = None if o.standard is None else read_manifest(o.standard)["pixels"]
    if pixels is not None and not (pixels["ood"] and pixels["id"]):
        raise ValueError(f"the standard set {o.standard} has {pixels['id']} ID and {pixels['ood']} OOD pixels, so "
                         "every metric on it is undefined: give a set with both (e.g. segood convert paste), or drop "
                         "--standard")
    dataset = H5SegmentationDataset(frames)
    count = len(dataset) if o.max_frames is None else min(o.max_frames, len(dataset))
    scenes = [Scene.from_item(dataset[i]) for i in range(count)]
    labels, bank = object_bank(o.objects, o.label_map)
    decoder = None if o.generator is None else load_generator(o.generator)[0]
    space = SearchSpace(bank, ObjectImages(), blend=o.blend, height_ratio=o.height_ratio, generator=decoder)
    base = {"config": config.to_dict(), "space": space.describe(), "label_map": o.label_map,
            "label_map_sha256": labels.sha256, "frames": {**set_identity(frames), "count": count}}

    networks = {}  # name: (model, [methods], checkpoint)
    for method_name, checkpoint in targets:
        name = checkpoint.stem
        if name not in networks:
            model, _ = load_model(checkpoint)
            networks[name] = (model.to(o.device) if o.device else model, [], checkpoint)
        networks[name][1].append(get_method(method_name))
    for name, (model, methods, _) in networks.items():
        fit_methods(model, unfitted_methods(model, methods, fit_set), fit_set, batch_size=4)

    started = time.perf_counter()
    calibration, doc_targets, set_paths, passes, reused = {}, {}, {}, 0, 0
    for name, (model, methods, checkpoint) in networks.items():
        calibration[name] = calibrate(model, methods, scenes, seed=config.seed)
        write_json(out / "calibration" / f"{name}.json", calibration[name])
        network = {"name": name, "checkpoint": str(checkpoint), "sha256": _sha256(checkpoint)}
        for method in methods:
            identity = {**base, "network": network, "method": method.describe(),
                        "fit_set": None if fit_set is None or not method.needs.fit else set_identity(fit_set)}
            target = Target(model, method, threshold=calibration[name]["weakest_inlier"],
                            scale=calibration[name]["score_std"][method.name])
            records = search_set(target, space, scenes, config, out / "state" / method.name, identity=identity,
                                 progress=progress, desc=f"attack {method.name} ({name})")
            passes += sum(r["passes"] for r in records)
            reused += sum(r.get("reused", 0) for r in records)
            extra = {**identity, "weakest_inlier": target.threshold, "energy_unit": target.scale}
            path = out / "sets" / f"worst_{method.name}.h5"
            write_set(path, space, scenes, records, labels, attrs={"seed": config.seed}, extra=extra, overwrite=True)
            random_path = out / "sets" / f"random_{name}.h5"
            if name not in {t["network"] for t in doc_targets.values()}:  # the starts: the same for the network's methods
                write_set(random_path, space, scenes, records, labels, state="start", attrs={"seed": config.seed},
                          extra={k: v for k, v in extra.items() if k != "method"}, overwrite=True)
                set_paths[random_path.stem] = random_path
            set_paths[path.stem] = path
            found = [r for r in records if r["found"]]
            doc_targets[method.name] = {
                "network": name, "set": path.stem, "random_set": random_path.stem, "frames": len(found),
                "mean_score_start": sum(r["start"]["score"] for r in found) / max(len(found), 1),
                "mean_score_found": sum(r["score"] for r in found) / max(len(found), 1)}
    search_seconds = time.perf_counter() - started

    started = time.perf_counter()
    sets = {**({"standard": Path(o.standard)} if o.standard else {}), **set_paths}
    shutil.rmtree(out / "eval", ignore_errors=True)  # the evaluation is derived: made anew from the sets
    matrix = transfer_matrix(networks, sets, out / "eval", progress=progress)
    evaluation_seconds = time.perf_counter() - started
    doc = {"config": config.to_dict(), "frames": count, "space": space.describe(),
           "networks": {n: {"weakest_inlier": c["weakest_inlier"], "score_std": c["score_std"]}
                        for n, c in calibration.items()},
           "targets": doc_targets, "sets": {k: str(v) for k, v in sets.items()}, "matrix": matrix,
           "passes": passes, "reused": reused, "search_seconds": search_seconds, "evaluation_seconds": evaluation_seconds}
    write_json(out / "attack.json", doc)
    atomic_write_text(out / "attack.md", markdown(doc))
    if o.figures:
        for name, (model, methods, _) in networks.items():
            for method in methods:
                example_figure(out / "figures" / f"worst_{method.name}.png", model, method,
                               set_paths[f"worst_{method.name}"], mc_seed=config.seed)
    return doc


class ObjectImages:
    """An object's (h, w, 3) uint8 pixels: its array, or its SUN2012 image read once and kept."""

    def __init__(self):
        self.cache = {}

    def __call__(self, obj):
        if isinstance(obj.image, str):
            from segood.data.common import read_rgb

            if obj.image not in self.cache:
                self.cache[obj.image] = read_rgb(obj.image)
            return self.cache[obj.image]
        return obj.image


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
