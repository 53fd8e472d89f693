"""The embedded default benchmark: the whole paper pipeline on generated data, on a laptop CPU in minutes.

1. Generate raw trees in the published layouts (Cityscapes, IDD, SUN2012; ``segood.data.synthetic``), cached in
   ``datasets/demo/raw``; make Perlin and normal noise sets, and a pasted-object set (generated objects pasted
   onto the Cityscapes-format val frames, ``segood.data.paste``, in the spirit of Fishyscapes Static).
2. Convert them with the real converters and mix each OOD set with Cityscapes-format val frames (as the paper
   does; the pasted-object set already holds those frames); the tuning set is the SUN tune split mixed with
   Cityscapes-format train frames.
3. Load the shipped checkpoints (one small PSPNet per head, ``checkpoints/demo_*.pt``, and the plain one
   fine-tuned with outlier exposure, ``demo_plain_oe.pt``) or, with ``retrain``, train them with the project's
   own training code. The OE objects are SUN objects pasted onto the train frames: another source than the
   generated objects of the pasted test set (the sun test set shares their source and is flagged ‡).
4. Tune ODIN's temperature on the tuning set only (ε = 0), fit Mahalanobis on the training split, evaluate the
   seven methods and three baselines on the five sets, and combine the four runs into one report; evaluate the OE
   network's entropy beside its parent's, with a paired bootstrap per set (``doc["outlier_exposure"]``).
"""

import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

from segood.data import IDD, Cityscapes, Noise, Sun, convert, mix
from segood.data.h5 import H5SegmentationDataset, frame_loader, frame_sizes
from segood.data.paste import Paste
from segood.data.synthetic import write_cityscapes_tree, write_idd_tree, write_sun_tree
from segood.evaluation import Evaluation, combine_runs, evaluate
from segood.evaluation.layout import RunFolder
from segood.metrics.bootstrap import Bootstrap, compare
from segood.metrics.components import best_f1_threshold
from segood.io import write_json
from segood.methods import ODIN_TEMPERATURES, get_method
from segood.methods.tuning import tune
from segood.models import HEADS, load_model, save_checkpoint
from segood.models.train import TrainConfig, finetune_config, train

# checkpoints/ sits beside the package in a checkout and in <prefix>/share/segood/checkpoints when installed.
_CHECKPOINT_DIRS = (Path(__file__).resolve().parents[1] / "checkpoints", Path(sys.prefix) / "share/segood/checkpoints")
CHECKPOINTS = next((d for d in _CHECKPOINT_DIRS if (d / "demo_plain.pt").exists()), _CHECKPOINT_DIRS[0])
#: The demo's data, by scale: frames per split and the size every set is converted to.
FULL = {"size": (128, 256), "cs_train": 160, "cs_val": 32, "idd": 24, "sun": 32, "noise": 12, "tune_id": 16}
QUICK = {"size": (64, 128), "cs_train": 12, "cs_val": 4, "idd": 4, "sun": 4, "noise": 2, "tune_id": 4}
TRAIN = {"arch": "pspnet", "encoder": "mobilenet_v2", "epochs": 12, "batch_size": 8, "lr": 0.02,
         "scale": [0.75, 1.5]}
# The demo's frames are 128x256: SMIYC's obstacle size filters (50 / 10 px) suit them; the anomaly track's
# (500 / 100 px) are for 1024x2048.
COMPONENT_PRESET = "obstacle"
#: The pasted-object set: two generated OOD objects and one ID negative (a car or a person) per val frame, feathered
PASTE = {"objects": "demo", "blend": "feather", "per_frame": 2, "negatives": 1}
#: Outlier exposure: the plain network fine-tuned with Meta-OOD's entropy maximisation (λ 0.9, both terms over all
#: pixels as in the authors' code) on the train frames and the same frames with SUN objects pasted (two OOD objects
#: and one ID negative each, feathered), briefly.
OE = {"epochs": 2, "batch_size": 8, "lr": 0.01, "scale": [0.75, 1.5], "oe_loss": "entropy", "oe_reduction": "pixels"}
PASTE_OE = {"blend": "feather", "per_frame": 2, "negatives": 1}
#: the score the OE table compares (Meta-OOD's) and its metrics
OE_METHOD, OE_METRICS = "entropy", ("auroc", "auprc", "fpr95")
METHODS_BY_HEAD = {"plain": ["max_softmax", "odin", "entropy", "max_logit", "energy", "sml"], "dimreduce": ["mahalanobis"],
                   "dropout": ["varsum", "mutual_info"], "confidence": ["confidence"]}


def prepare_data(data_dir, scale, seed=0, progress=True):
    """Raw trees (generated once per scale and seed) -> converted and mixed sets; returns {name: path}."""
    data_dir = Path(data_dir)
    raw = data_dir / "raw"
    # bump "generator" when the raw trees change, "sets" when converted sets do: both are then made anew
    stamp = {"scale": scale, "seed": seed, "generator": 3, "sets": 2}
    fresh = not (raw / "tree.json").exists() or json.loads((raw / "tree.json").read_text()) != stamp
    if fresh:
        write_cityscapes_tree(raw / "cityscapes", seed, (("train", scale["cs_train"]), ("val", scale["cs_val"])),
                              scale["size"])
        write_idd_tree(raw / "idd", seed + 1, scale["idd"], scale["size"])
        write_sun_tree(raw / "sun2012", seed + 2, scale["sun"])
    size = scale["size"]
    sources = {"cityscapes_train": Cityscapes(raw / "cityscapes", "train"),
               "cityscapes_val": Cityscapes(raw / "cityscapes", "val"),
               "idd_val": IDD(raw / "idd", "val"),
               "sun_tune": Sun(raw / "sun2012", "tune", seed=seed),
               "sun_eval": Sun(raw / "sun2012", "eval", seed=seed),
               "perlin": Noise("perlin", scale["noise"], size=size, seed=seed),
               "normal": Noise("normal", scale["noise"], size=size, seed=seed),
               "paste": Paste(raw / "cityscapes", "val", seed=seed, **PASTE)}
    sets = {}
    for name, adapter in sources.items():
        path = data_dir / f"{name}.h5"
        if fresh or not path.exists():
            convert(adapter, path, size=size, overwrite=True, progress=progress)
        sets[name] = path
    mixes = {"sun": ("sun_eval", "cityscapes_val", None), "idd": ("idd_val", "cityscapes_val", None),
             "perlin": ("perlin", "cityscapes_val", None), "normal": ("normal", "cityscapes_val", None),
             "tune": ("sun_tune", "cityscapes_train", scale["tune_id"])}
    for name, (ood, ident, frames) in mixes.items():
        path = data_dir / f"mixed_{name}.h5"
        if fresh or not path.exists():
            mix(sets[ood], sets[ident], path, seed=seed, id_frames=frames, overwrite=True, progress=False)
        sets[f"mixed_{name}"] = path
    write_json(raw / "tree.json", stamp)  # last: a run killed before this point makes everything anew
    return sets


def demo_checkpoints(sets, *, retrain=False, directory=CHECKPOINTS, epochs=None, progress=True, raw=None):
    """{head: path} of the demo networks and {"plain_oe": path} of the plain one fine-tuned with outlier exposure;
    trains (and stores as fp16) the missing ones or all with ``retrain``. ``raw``: the raw trees (the OE set is
    made from them when the OE network is trained)."""
    paths, trained = {}, retrain
    for head in HEADS:
        path = Path(directory) / f"demo_{head}.pt"
        if retrain or not path.exists():
            work = path.parent / f".train_{head}"
            config = TrainConfig(train_set=str(sets["cityscapes_train"]), val_set=str(sets["cityscapes_val"]),
                                 out_dir=str(work), head=head, crop=list(_size(sets["cityscapes_train"])), seed=0,
                                 **{**TRAIN, "epochs": epochs or TRAIN["epochs"]})
            shutil.rmtree(work, ignore_errors=True)  # (left by a killed run)
            log = train(config, progress=progress)
            model, _ = load_model(work / "final.pt")
            save_checkpoint(path, model.half(), log=log, train_config={**config.__dict__, "train_set": "demo"})
            shutil.rmtree(work)
            trained = True
        paths[head] = path
    paths["plain_oe"] = Path(directory) / "demo_plain_oe.pt"
    if retrain or not paths["plain_oe"].exists():
        if raw is None:
            raise ValueError(f"{paths['plain_oe']} is missing: train it with the raw trees (run_demo does)")
        train_oe_checkpoint(paths["plain_oe"], paths["plain"], sets, raw, epochs=epochs, progress=progress)
        trained = True
    if trained or not (Path(directory) / "frozen.json").exists():
        freeze_outputs(paths, Path(directory) / "frozen.json")
    return paths


def train_oe_checkpoint(path, parent, sets, raw, *, epochs=None, progress=True):
    """Fine-tune ``parent`` with entropy-maximisation outlier exposure (``OE``) on the train frames and the same
    frames with SUN objects pasted (``PASTE_OE``, converted into ``sets``' folder), and store it as fp16 at
    ``path`` with its training log and OE record."""
    size = _size(sets["cityscapes_train"])
    oe_set = Path(sets["cityscapes_train"]).with_name("paste_sun_train.h5")
    convert(Paste(Path(raw) / "cityscapes", "train", Path(raw) / "sun2012", seed=0, **PASTE_OE), oe_set, size=size,
            overwrite=True, progress=progress)
    work = Path(path).parent / ".train_plain_oe"
    config = finetune_config(parent, train_set=str(sets["cityscapes_train"]), val_set=str(sets["cityscapes_val"]),
                             out_dir=str(work), outlier_exposure=str(oe_set), crop=list(size), seed=0,
                             **{**OE, "epochs": epochs and max(1, epochs // 2) or OE["epochs"]})
    shutil.rmtree(work, ignore_errors=True)  # (left by a killed run)
    log = train(config, progress=progress)
    model, state = load_model(work / "final.pt")
    save_checkpoint(path, model.half(), log=log, outlier_exposure=state["outlier_exposure"],
                    train_config={**config.__dict__, "train_set": "demo", "val_set": "demo", "out_dir": "demo",
                                  "init": Path(parent).name, "outlier_exposure": oe_set.name})
    shutil.rmtree(work)


def freeze_outputs(paths, out):
    """Record each checkpoint's sha256 and its output on a fixed input (the test that the shipped
    checkpoints load and compute the same as when they were made)."""
    import hashlib

    out = Path(out)
    kept = json.loads(out.read_text()) if out.exists() else {}
    frozen = {}
    for head, path in paths.items():
        sha256 = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if kept.get(head, {}).get("sha256") == sha256:  # an unchanged file keeps its record
            frozen[head] = kept[head]
            continue
        model, _ = load_model(path)
        torch.manual_seed(0)
        x = torch.rand(1, 3, 64, 128) * 2 - 1
        with torch.no_grad():
            logits = model(x).logits
        frozen[head] = {"sha256": sha256,
                        "logits_mean": float(logits.mean()), "logits_at_31_63": logits[0, :, 31, 63].tolist()}
    write_json(out, frozen)


def run_demo(out_dir="runs/demo", data_dir="datasets/demo", *, seed=0, quick=False, retrain=False,
             checkpoints_dir=CHECKPOINTS, progress=True):
    """The whole pipeline; returns the combined results document (runs/demo/results.json)."""
    started = time.perf_counter()
    scale = QUICK if quick else FULL
    sets = prepare_data(data_dir, scale, seed, progress)
    checkpoints = demo_checkpoints(sets, retrain=retrain, directory=checkpoints_dir,
                                   epochs=2 if quick else None, progress=progress, raw=Path(data_dir) / "raw")
    evaluation_sets = {name: sets[f"mixed_{name}"] for name in ("sun", "idd", "perlin", "normal")}
    evaluation_sets["paste"] = sets["paste"]  # pasted onto the val frames: ID and OOD pixels in every frame
    tune_loader = frame_loader(H5SegmentationDataset(sets["mixed_tune"]), 8)
    out_dir = Path(out_dir)
    runs = []
    for head, names in METHODS_BY_HEAD.items():
        model, _ = load_model(checkpoints[head])  # fp16 weights load into an fp32 network
        methods = []
        for name in names:
            if name == "odin":  # the paper tunes T on held-out OOD data; ε = 0 keeps the input unperturbed
                methods.append(tune("odin", model, tune_loader, {"temperature": list(ODIN_TEMPERATURES),
                                                                  "epsilon": [0.0]}, progress=False).method())
            else:
                methods.append(get_method(name))
        run_dir, tune_dir = out_dir / head, out_dir / f"{head}_tune"
        for folder in (run_dir, tune_dir):
            shutil.rmtree(folder, ignore_errors=True)  # the demo's own output of an earlier run: made anew
        # component metrics at thresholds committed on the tuning set (best pixel F1 there), never the test sets'
        fit_set = sets["cityscapes_train"] if not all(m.ready for m in methods) else None  # (SML, Mahalanobis)
        evaluate(model, {"tune": sets["mixed_tune"]}, methods, tune_dir, batch_size=8, progress=progress,
                 figures=False, checkpoint=checkpoints[head], fit_set=fit_set)  # (fits them: fitted from here on)
        tuned = Evaluation.load(RunFolder(tune_dir).state())
        thresholds = {m.name: best_f1_threshold(tuned.acc[(m.name, "tune")].compute()) for m in methods}
        evaluate(model, evaluation_sets, methods, run_dir, batch_size=8, progress=progress, figures=False,
                 checkpoint=checkpoints[head],  # the float-order grid
                 components={"preset": COMPONENT_PRESET, "thresholds": thresholds, "source": "committed"})
        runs.append(run_dir)
    doc = combine_runs(runs, out_dir)
    oe_dir = out_dir / "plain_oe"
    shutil.rmtree(oe_dir, ignore_errors=True)
    oe_model, _ = load_model(checkpoints["plain_oe"])
    with warnings.catch_warnings():  # the same-source warning: the demo's table flags the sun rows (‡) itself
        warnings.filterwarnings("ignore", message="the network was fine-tuned with outlier exposure")
        oe_doc = evaluate(oe_model, evaluation_sets, [OE_METHOD], oe_dir, batch_size=8, progress=progress,
                          figures=False, checkpoint=checkpoints["plain_oe"])
    doc["outlier_exposure"] = oe_comparison(out_dir / "plain", oe_dir, doc, oe_doc, OE_METHOD)
    doc["demo_seconds"] = round(time.perf_counter() - started, 1)
    write_json(out_dir / "results.json", doc)
    return doc


def oe_comparison(parent_dir, oe_dir, parent_doc, oe_doc, method, *, bootstrap=Bootstrap(), metrics=OE_METRICS):
    """The OE network against its parent, per set and metric, for ``method``: both pooled values with their
    intervals, P(OE better) and whether the difference is significant, from a paired bootstrap over the same
    resampled images (:func:`segood.metrics.bootstrap.compare`, the report's own). Returns {"method", "record",
    "rows": [...]} (``record``: the OE checkpoint's outlier-exposure record)."""
    parent, oe = (Evaluation.load(RunFolder(d).state()) for d in (parent_dir, oe_dir))
    rows = []
    for set_name in oe.set_names:
        before, after = parent_doc["results"][method][set_name], oe_doc["results"][method][set_name]
        found = compare({"parent": parent.acc[(method, set_name)].images, "oe": oe.acc[(method, set_name)].images},
                        bootstrap, metric_names=metrics, points={"parent": before["pooled"], "oe": after["pooled"]})
        for metric in metrics:
            rows.append({"set": set_name, "metric": metric, "parent": before["pooled"][metric],
                         "oe": after["pooled"][metric], "parent_interval": found["intervals"]["parent"][metric],
                         "oe_interval": found["intervals"]["oe"][metric],
                         "p_oe_better": found["p_better"][metric]["oe"]["parent"],
                         "significant": found["significant"][metric]["oe"]["parent"],
                         "same_source_oe": bool(after["same_source_oe"])})
    record = oe_doc["model"]["outlier_exposure"]
    return {"method": method, "record": {k: record[k] for k in ("loss", "paper", "weight", "object_sources",
                                                                "parent", "same_source_sets")}, "rows": rows}


def oe_table(doc):
    """The OE network beside its parent (``doc["outlier_exposure"]``): the table ``segood demo`` prints third."""
    from segood.metrics import METRICS

    oe = doc["outlier_exposure"]
    lines = ["| score | set | metric | plain | plain + OE | P(OE better) | OE wins? |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in oe["rows"]:
        metric = METRICS[r["metric"]]
        if r["parent"] is None or r["oe"] is None:
            verdict = "–"
        elif r["oe"] == r["parent"]:
            verdict = "tie"
        else:
            wins = (r["oe"] > r["parent"]) == metric.higher_is_better
            verdict = ("yes" if wins else "no") + (", significant" if r["significant"] else ", not significant")
        cells = [("–" if v is None else f"{v:.3f}" + _bounds(i)) for v, i in ((r["parent"], r["parent_interval"]),
                                                                           (r["oe"], r["oe_interval"]))]
        p = "–" if r["p_oe_better"] is None else f"{r['p_oe_better']:.2f}"
        lines.append(f"| {oe['method']} | {r['set']}{' ‡' if r['same_source_oe'] else ''} | "
                     f"{metric.label} {metric.arrow()} | {cells[0]} | {cells[1]} | {p} | {verdict} |")
    return "\n".join(lines) + "\n"


def _bounds(interval):
    lo, hi = interval or (None, None)
    return "" if lo is None else f" ({lo:.2f}–{hi:.2f})"


def summary_table(doc):
    """Pooled metrics with their 95% bootstrap intervals, one row per method and set: the table ``segood demo``
    prints."""
    from segood.evaluation.report import too_coarse
    from segood.metrics import METRICS

    lines = ["| method | set | " + " | ".join(f"{m.label} {m.arrow()}" for m in METRICS.values()) + " |",
             "|---|---|" + "---:|" * len(METRICS)]
    for method, by_set in doc["results"].items():
        for set_name, r in by_set.items():
            cells = " | ".join("–" if r["pooled"][m] is None
                               else f"{r['pooled'][m]:.3f}" + _interval(r, m) + " ≈" * too_coarse(m, r)
                               for m in METRICS)
            flag = " †" if r["same_source_tuning"] else ""
            lines.append(f"| {method}{flag} | {set_name} | {cells} |")
    return "\n".join(lines) + "\n"


def _interval(result, metric):
    lo, hi = (result.get("intervals") or {}).get(metric) or (None, None)
    return "" if lo is None else f" ({lo:.2f}–{hi:.2f})"


def component_table(doc):
    """sIoU, PPV and F1* per method and set (SMIYC's component metrics at thresholds committed on the tuning
    set): the second table ``segood demo`` prints."""
    lines = ["| method | set | sIoU ↑ | PPV ↑ | F1* ↑ |", "|---|---|---:|---:|---:|"]
    for method, by_set in doc["results"].items():
        for set_name, r in by_set.items():
            c = r.get("components")
            if c:
                lines.append(f"| {method} | {set_name} | " + " | ".join(
                    "–" if c[k] is None else f"{c[k]:.3f}" for k in ("siou", "ppv", "f1_star")) + " |")
    return "\n".join(lines) + "\n"


def _size(path):
    return frame_sizes(path)[0]  # the demo converts every set at one size
