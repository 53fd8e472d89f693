"""The evaluation run: every method on every set in one pass per set, resumable and shardable over ranks.

Three steps per batch: reading (:mod:`segood.evaluation.reading`: ahead of the network, in worker processes),
scoring (:func:`segood.methods.schedule.score_frames`:
one forward pass for every single-pass method, one set of Monte-Carlo samples for the dropout methods, own
passes for perturbing methods; or a :class:`~segood.methods.scorer.Scorer`'s own call) and accumulation
(:meth:`Evaluation.process`: an accumulator on the run's threshold grid per (method, set), per-class score sums
for the paper's Figure 2, a few example frames). State is saved atomically every ``save_every`` batches (in a
background thread), so a killed run resumes to exactly the counts of an uninterrupted one.

Component metrics whose thresholds the run chooses itself (committed on a tuning set, or tuned on each test set)
need the pixel counts first: after the pixel pass the thresholds are chosen (:func:`chosen_thresholds`) and a
components pass scores the frames again (the scores are not kept), in the same loop, saved and resumed alike.
"""

import contextlib
import copy
import functools
import json
import math
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from segood._threads import beside_readers
from segood.data.h5 import H5SegmentationDataset, require_labels
from segood.evaluation.class_sums import class_counts, class_sums
from segood.evaluation.layout import RunFolder
from segood.evaluation.reading import UnreadableFrame, batch_reader, default_workers
from segood.io import make_folder, read_npz, write_npz
from segood.labels import NUM_CLASSES
from segood.methods import METHODS, get_method
from segood.methods.schedule import check_methods, compiled, frame_seeds, refuse_unrecordable, score_frames
from segood.methods.methods import served_heads
from segood.methods.scorer import Scorer
from segood.models.network import device_of
from segood.models.predict import predicted_classes
from segood.metrics import METRICS, UndefinedMetricWarning, accumulator_from_state, grid_of, grid_spec, make_accumulator
from segood.metrics.calibration import CalibrationAccumulator
from segood.metrics.components import PRESETS, ComponentAccumulator
from segood.metrics.official import (SMIYCComponentAccumulator, check_benchmark, pixel_accumulator,
                                     pixel_accumulator_from_state)
from segood.metrics.segmentation import confusion_counts
from segood.metrics.state import Part, all_gather_json, all_reduce_state, distributed, flatten, unflatten
from segood.metrics.thresholds import RULES, commit
from segood.version import __version__

EXAMPLES_PER_SET = 3
EXAMPLE_WIDTH = 512  # example frames kept at most this wide (every k-th pixel): a figure panel is ~290 px wide
# (2.6 inches at 110 dpi); a wider frame costs its run more predicted classes to compute and more bytes to save


def default_methods(model, *, fitted=True):
    """Every method the model's head can serve, with default parameters (ε = 0); without ``fitted`` (no
    training set to fit on), only the methods that need no fit."""
    methods = [get_method(name) for name in METHODS]
    return [m for m in methods if (m.needs.head is None or m.needs.head in served_heads(model))
            and (fitted or not m.needs.fit)]


class Evaluation(Part):
    """The mutable state of a run: accumulators, per-class sums, examples, timings, progress; a tree of parts
    (:attr:`parts`) that saves, merges and all-reduces by the contract of :mod:`segood.metrics.state`."""

    def __init__(self, method_names, set_names, grid=None, components=None, *, quality=False,
                 examples=(EXAMPLES_PER_SET, EXAMPLE_WIDTH), official=None):
        """``quality``: also the network's segmentation quality per set (confusion matrix for mIoU, calibration
        of its softmax); ``examples``: (frames kept per set, their largest width or None) for the figures;
        ``official``: also a benchmark's own computation ("smiyc", "fishyscapes" or "caos",
        :mod:`segood.metrics.official`) beside segood's numbers."""
        self.method_names, self.set_names = list(method_names), list(set_names)
        self.quality = bool(quality)
        self.example_count, self.example_width = examples
        self.confusion = {s: np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64) for s in set_names} if quality else {}
        self.calibration = {s: CalibrationAccumulator() for s in set_names} if quality else {}
        self.probabilities = KeptTensor()  # the softmax of a batch's logits, for the calibration
        odd = [n for n in self.method_names + self.set_names if not n or "/" in n]
        if odd:
            raise ValueError(f"method and set names must be non-empty and free of '/' (the state's path separator): "
                             f"{odd}")
        self.grid = grid or grid_spec()
        self.components = components  # None, or a spec of component_spec()
        self.official = check_benchmark(official)
        self.official_acc = {(m, s): pixel_accumulator(self.official) for m in self.method_names
                             for s in self.set_names} if self.official else {}
        self.comp = self._component_accumulators()
        self.official_comp = self._component_accumulators(official=True)
        self.acc = {(m, s): make_accumulator(self.grid, per_image=True) for m in method_names
                    for s in set_names}
        self.class_sum = {(m, s): np.zeros(NUM_CLASSES) for m in method_names for s in set_names}
        self.class_count = {s: np.zeros(NUM_CLASSES, np.int64) for s in set_names}
        self.pending_sums = {}  # per-class counts and score sums still on the device (see _add_sums)
        self.examples = {}
        self.seconds = {"data": 0.0, "forward": 0.0, "accumulate": 0.0, **{f"score/{m}": 0.0 for m in method_names}}
        self.images = {s: 0 for s in set_names}
        self.done = {s: 0 for s in set_names}  # frames of this rank's shard already accumulated
        self.components_done = {s: 0 for s in set_names}  # the same, in the components pass
        self.skipped = []  # [set, frame index, reason] of unreadable frames passed over with skip_bad
        self.model_output = {}  # {"classes": the model's (None: a scorer), "resized", "align_corners"} once seen

    def note_output(self, logits, *, resized=False, align_corners=False):
        """Record what the model's forward pass gave: its ``logits`` (None for a scorer's scores): their number of
        classes, whether they look like probabilities (looked at once, on the first batch: a warning where they
        do) and whether they were ``resized`` to the frames (with ``align_corners``)."""
        probabilities = self.model_output.get("probabilities")
        if probabilities is None and logits is not None:
            probabilities = _probabilities(logits)
            if probabilities:
                warnings.warn(PROBABILITIES_NOTE, stacklevel=2)
        self.model_output = {"classes": None if logits is None else int(logits.shape[1]),
                             "resized": bool(resized or self.model_output.get("resized")),
                             "align_corners": bool(align_corners),
                             **({} if probabilities is None else {"probabilities": bool(probabilities)})}

    def classes_match(self):
        """Whether the model predicts the sets' classes (the 19 Cityscapes trainIds), so that its predictions can
        be compared with their labels (mIoU, confusion, calibration, the example figures' classes)."""
        return self.model_output.get("classes", NUM_CLASSES) == NUM_CLASSES

    def notes(self):
        """What the report must say about the model's outputs: resized logits, another number of classes."""
        out, classes = self.model_output, self.model_output.get("classes", NUM_CLASSES)
        notes = []
        if out.get("resized"):
            notes.append("The model's logits came out at another resolution than the frames and were resized to "
                         f"them bilinearly (align_corners={out.get('align_corners', False)}) before scoring.")
        if out.get("probabilities"):
            notes.append(PROBABILITIES_NOTE)
        if classes is not None and classes != NUM_CLASSES:
            notes.append(f"The model predicts {classes} classes, not the sets' {NUM_CLASSES} Cityscapes trainIds: "
                         "its predicted classes are left out of the example figures"
                         + (" and its segmentation quality (mIoU, confusion, calibration) is not computed"
                            if self.quality else "")
                         + ". The mean score per class is over the sets' own labels.")
        return notes

    def _component_accumulators(self, *, official=False):
        """segood's component accumulators, or (``official``) SMIYC's own beside them in the SMIYC official mode."""
        c = self.components
        if official and self.official != "smiyc":
            return {}
        kind = SMIYCComponentAccumulator if official else ComponentAccumulator
        return {(m, s): kind(component_threshold(c, m, s), c["preset"], threshold_source=c["source"])
                for m in self.method_names for s in self.set_names if c and component_threshold(c, m, s) is not None}

    def choose_component_thresholds(self, thresholds):
        """Fix the thresholds a run chooses itself (:func:`chosen_thresholds`), making the components' accumulators."""
        self.components = {**self.components, "thresholds": thresholds}
        self.comp = self._component_accumulators()
        self.official_comp = self._component_accumulators(official=True)

    def update_components(self, method, set_name, scores, ood_mask):
        """Add frames to the component accumulators of (``method``, ``set_name``): segood's and, in the SMIYC
        official mode, SMIYC's own."""
        self.comp[(method, set_name)].update(scores, ood_mask)
        if (method, set_name) in self.official_comp:
            self.official_comp[(method, set_name)].update(scores, ood_mask)

    def update_pixels(self, set_name, indices, batch, scored, names):
        """The pixel pass's update: one scored batch (:class:`~segood.methods.schedule.ScoredBatch` of the methods
        ``names``) into :meth:`process`; predictions of other classes than the sets' are not compared with their
        labels. First the per-image bookkeeping the accumulators queued for the batch before (host work, while the
        device still runs this batch's network)."""
        for acc in self.acc.values():
            acc.settle()
        comparable = self.classes_match() and scored.output is not None
        self.process(set_name, indices, batch, dict(zip(names, scored.scores)),
                     logits=scored.output.logits if comparable else None)

    def update_components_pass(self, set_name, indices, batch, scored, names):
        """The components pass's update: the batch's scores into the component accumulators only."""
        for name, score in zip(names, scored.scores):
            self.update_components(name, set_name, score, batch["ood_mask"])

    def process(self, set_name, indices, batch, scores, classes=None, *, clip=False, logits=None):
        """Accumulate one batch of a set: ``batch`` holds ``image`` (N, 3, H, W), ``ood_mask`` and ``semantic``
        (N, H, W) tensors of the frames ``indices``; ``scores`` {method: (N, H, W)}; ``logits`` (N, C, H, W) the
        network's (None for score maps from elsewhere), needed with ``quality``; ``classes`` its predicted classes,
        where they are at hand (else computed from ``logits`` where needed: an argmax over every map costs as much
        as a method). Updates
        the accumulators, the per-class score sums (pixels without a class go to an overflow bin, no masked
        copies), the segmentation quality and the example frames."""
        ood_mask, semantic = batch["ood_mask"], batch["semantic"]
        device = next(iter(scores.values())).device if scores else semantic.device
        labels, semantic_there = (x.to(device, non_blocking=True) for x in (ood_mask, semantic))  # (from pinned)
        if self.quality and self.classes_match():  # (another number of classes: skipped, said in notes())
            if logits is None:
                raise ValueError("an evaluation with quality=True needs the network's logits")
            classes = predicted_classes(logits) if classes is None else classes
            targets = semantic_there.to(logits.device)  # (no copy where the scores are: the logits' device)
            confusion, _ = confusion_counts(classes, targets.to(classes.device), NUM_CLASSES)  # (where they are; a
            self._add_sums(self.confusion, set_name, confusion)  # label of no class: the calibration refuses it)
            self.calibration[set_name].update(softmax(logits, self.probabilities), targets)
        self._add_sums(self.class_count, set_name, class_counts(semantic_there, NUM_CLASSES))
        # every method's update begun before any is completed: one wait for the device, not one or two a method
        for complete in [self.acc[(name, set_name)].begin_update(score, labels, clip=clip)
                         for name, score in scores.items()]:
            complete()
        for name, score in scores.items():
            if self.official:
                self.official_acc[(name, set_name)].update(score, ood_mask)
            if (name, set_name) in self.comp and not chosen_by_run(self.components):  # else: the components pass
                self.update_components(name, set_name, score, ood_mask)
            self._add_sums(self.class_sum, (name, set_name), class_sums(semantic_there, score, NUM_CLASSES))
        for k, index in enumerate(indices):
            if index < self.example_count:
                step = -(-semantic.shape[-1] // self.example_width) if self.example_width else 1  # keep every step-th
                kept = (slice(None, None, step),) * 2  # pixel each way
                if classes is not None:
                    predicted = classes[k][kept]
                elif logits is not None:  # (of the kept pixels only)
                    predicted = predicted_classes(logits[k : k + 1], step)[0]
                else:
                    predicted = torch.full(semantic[k][kept].shape, 255)
                # (copies: a view would keep the whole batch alive, in a reader's shared memory)
                self.examples[(set_name, index)] = {key: np.array(value, order="C") for key, value in {
                    "image": batch["image"][k].permute(1, 2, 0)[kept].numpy(), "ood_mask": ood_mask[k][kept].numpy(),
                    "semantic": semantic[k][kept].numpy(), "classes": predicted.cpu().numpy().astype(np.uint8),
                    **{f"score_{n}": s[k][kept].float().cpu().numpy() for n, s in scores.items()}}.items()}
        self.images[set_name] += len(indices)

    def _add_sums(self, store, key, sums):
        """Add per-class ``sums`` (numpy, or a tensor) to ``store[key]``; a device tensor waits on the device until
        :meth:`settle` (no wait for the device per frame)."""
        if isinstance(sums, torch.Tensor) and sums.device.type != "cpu":
            pending = self.pending_sums.get((id(store), key))
            self.pending_sums[(id(store), key)] = (store, key, sums if pending is None else pending[2] + sums)
        else:
            store[key] += np.asarray(sums)

    def settle(self):
        """Bring the per-class counts and sums still on the device into the state (before reading it)."""
        for store, key, sums in self.pending_sums.values():
            store[key] += sums.cpu().numpy()
        self.pending_sums = {}
        return self

    @property
    def parts(self):
        """The run's state as a tree of parts by name: accumulators and arrays (see :meth:`arrays`)."""
        return {"format": STATE_FORMAT, "meta": json.dumps(
                    {"methods": self.method_names, "sets": self.set_names, "grid": self.grid,
                     "components": self.components, "quality": self.quality,
                     "examples": [self.example_count, self.example_width], "official": self.official}),
                "progress": json.dumps({"seconds": self.seconds, "done": self.done,
                                        "components_done": self.components_done, "skipped": self.skipped,
                                        "model_output": self.model_output}),
                "images": {s: np.array(n, np.int64) for s, n in self.images.items()}, "pixels": self.acc,
                "class_sums": self.class_sum, "class_counts": self.class_count, "confusion": self.confusion,
                "calibration": self.calibration, "components": self.comp, "official": self.official_acc,
                "official_components": self.official_comp, "examples": self.examples}

    @property
    def reductions(self):
        """How two states of the run combine, path by path (:mod:`segood.metrics.state`)."""
        return flatten(self.parts, PART_REDUCTIONS)[1]

    def arrays(self):
        """The state as plain arrays, a tree of parts by path (docs/evaluating.md, "The run's state"): "format",
        "meta" (the run's settings, JSON), "progress" (this process's frames done, timings, skipped frames, the
        model's outputs, JSON), "images/<set>", "pixels/<method>/<set>/<key>" (the accumulator's state),
        "class_sums/<method>/<set>", "class_counts/<set>", "confusion/<set>", "calibration/<set>/<key>", "components/<method>/<set>/<key>",
        "official/<method>/<set>/<key>", "official_components/<method>/<set>/<key>" and
        "examples/<set>/<frame index>/<field>"."""
        self.settle()
        return flatten(self.parts, PART_REDUCTIONS)[0]

    state_dict = arrays

    @classmethod
    def from_arrays(cls, arrays, path="the evaluation state"):
        """Rebuild from :meth:`arrays` (or a state of the flat format before it, "acc|<method>|<set>|<key>", ...);
        every field is validated before anything is allocated from it."""
        try:
            tree = unflatten(arrays if "format" in arrays else _from_flat(arrays))
            if str(tree["format"]) != STATE_FORMAT:
                raise ValueError(f"unknown evaluation state format {str(tree['format'])!r}; expected {STATE_FORMAT!r}")
            meta = {**json.loads(str(tree["meta"])), **json.loads(str(tree.get("progress", "{}")))}
            methods, sets = [str(m) for m in meta["methods"]], [str(v) for v in meta["sets"]]
            accumulators = {(m, s): accumulator_from_state(_node(tree, "pixels", m, s)) for m in methods for s in sets}
            grid = meta["grid"] if "grid" in meta else grid_spec(meta["num_thresholds"], meta["score_range"])
            if any(grid_of(a) != grid for a in accumulators.values()):
                raise ValueError(f"an accumulator's thresholds differ from the run's grid {grid}")
            examples = meta.get("examples", [EXAMPLES_PER_SET, None])
            if not (isinstance(examples, list) and len(examples) == 2 and type(examples[0]) is int
                    and (examples[1] is None or type(examples[1]) is int and examples[1] > 0)):
                raise ValueError("'examples' must be [frames per set, width or null]")
            ev = cls(methods, sets, grid, meta.get("components"), quality=meta.get("quality") is True,
                     examples=tuple(examples), official=meta.get("official"))
            ev.acc = accumulators
            for (m, s), acc in ev.official_acc.items():
                ev.official_acc[(m, s)] = pixel_accumulator_from_state(_node(tree, "official", m, s))
                if type(ev.official_acc[(m, s)]) is not type(acc):
                    raise ValueError(f"the official accumulator of {m} on {s} is not {ev.official}'s")
            for kind, comps in (("components", ev.comp), ("official_components", ev.official_comp)):
                for (m, s), comp in comps.items():
                    comp.load_state_dict(_node(tree, kind, m, s))
            for s in ev.confusion:
                ev.confusion[s] = _array(_node(tree, "confusion", s), (NUM_CLASSES, NUM_CLASSES), np.int64, counts=True)
                ev.calibration[s] = CalibrationAccumulator.from_state_dict(_node(tree, "calibration", s))
            images = {s: int(_array(v, (), np.int64, counts=True)) for s, v in tree["images"].items()} \
                if "images" in tree else meta["images"]
            ev.images, ev.done = (_frame_counts(value, sets, key) for key, value in (("images", images),
                                                                                      ("done", meta["done"])))
            ev.components_done = _frame_counts(meta.get("components_done", dict.fromkeys(sets, 0)), sets,
                                               "components_done")
            if not isinstance(meta["seconds"], dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                    for v in meta["seconds"].values()):
                raise ValueError("'seconds' must map stages to non-negative seconds")
            ev.seconds.update({str(k): float(v) for k, v in meta["seconds"].items()})
            if not isinstance(meta["skipped"], list) or not all(
                    isinstance(e, list) and len(e) == 3 and e[0] in sets and type(e[1]) is int for e in meta["skipped"]):
                raise ValueError("'skipped' must list [set, frame index, reason] entries")
            ev.skipped = meta["skipped"]
            ev.model_output = _model_output(meta.get("model_output", {}))
            for m, s in ev.acc:
                ev.class_sum[(m, s)] = _array(_node(tree, "class_sums", m, s), (NUM_CLASSES,), np.float64)
            for s in sets:
                ev.class_count[s] = _array(_node(tree, "class_counts", s), (NUM_CLASSES,), np.int64, counts=True)
            for s, frames in tree.get("examples", {}).items():
                for i, example in frames.items():
                    if s not in sets or not i.isdigit() or not isinstance(example, dict):
                        raise ValueError(f"example {s}/{i} belongs to no set of the run")
                    ev.examples[(s, int(i))] = {field: np.asarray(v) for field, v in example.items()}
        except KeyError as err:
            raise ValueError(f"{path} is not a complete evaluation state: it lacks {err}") from None
        except (ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not a valid evaluation state: {err}") from None
        return ev

    from_state_dict = from_arrays

    def save(self, path):
        write_state(path, self.arrays())

    @classmethod
    def load(cls, path):
        """Read a state written by :meth:`save` (never unpickles); a ValueError names the file when it is not one."""
        return cls.from_arrays(_state_arrays(path), path)

    def unregistered_metrics(self):
        """The metrics the run counted per image that no metric registered now computes (a plugin's, its module not
        imported), sorted."""
        return sorted({name for acc in self.acc.values() for name in acc.metric_names} - set(METRICS))

    def warn_unregistered(self):
        """Warn that a report of this state leaves out the pooled values of :meth:`unregistered_metrics`."""
        unknown = self.unregistered_metrics()
        if unknown:
            warnings.warn(f"the run counted {', '.join(unknown)}, which no metric registered now computes: left out "
                          "(a plugin's metric: segood --plugin MODULE ...; in Python, import MODULE first)",
                          stacklevel=3)

    def all_reduce(self):
        """Combine the run's state over torch.distributed ranks by its :attr:`reductions` (a no-op without a process
        group): counts and sums are summed; each rank keeps its own example frames and timings; the frames done
        are those of every rank (a merged state resumed by one process has none left to count again) and the
        skipped frames every rank's."""
        self.settle()
        if distributed():
            self.load_state_dict(all_reduce_state(*flatten(self.parts, PART_REDUCTIONS)))
            ranks = all_gather_json({"done": self.done, "components_done": self.components_done,
                                     "skipped": self.skipped})
            for name in ("done", "components_done"):
                setattr(self, name, {s: sum(rank[name][s] for rank in ranks) for s in self.set_names})
            self.skipped = sorted(entry for rank in ranks for entry in rank["skipped"])
        return self


STATE_FORMAT = "segood.Evaluation/2"  # a tree of parts; the flat format before it has no "format"
EXAMPLE_FILES = "example_files"  # the member of state.npz naming its example files (write_state)
# how the arrays of the run's tree combine (the accumulators declare their own)
PART_REDUCTIONS = {"meta": "same", "progress": "local", "images": "sum", "class_sums": "sum", "class_counts": "sum",
                   "confusion": "sum", "examples": "local"}
_FLAT_NAMES = {"acc": "pixels", "cls": "class_sums", "clscount": "class_counts", "cal": "calibration",
               "comp": "components", "off": "official", "offcomp": "official_components", "ex": "examples"}


def _from_flat(arrays):
    """A state of the flat format ("acc|<method>|<set>|<key>", "cls|<method>|<set>", "clscount|<set>",
    "confusion|<set>", "cal|<set>|<key>", "comp|...", "off|...", "offcomp|...", "ex|<set>|<index>|<field>", and
    "meta" holding the progress and frame counts too) under the tree's paths."""
    out = {"/".join([_FLAT_NAMES.get(kind, kind), *names]): value
           for key, value in arrays.items() for kind, *names in [key.split("|")]}
    return {**out, "format": np.array(STATE_FORMAT)}


def _node(tree, *names):
    """The node of ``tree`` at the path ``names``; a KeyError names the path."""
    try:
        for name in names:
            tree = tree[name]
    except (KeyError, IndexError, TypeError):  # (an array where a part should be)
        raise KeyError("/".join(names)) from None
    return tree


def write_state(path, arrays, *, examples=None):
    """Write a state's :meth:`Evaluation.arrays` as files: each set's example frames beside ``path`` (a file a set,
    :func:`examples_path`; first; stored as they are: they hardly compress), then everything else at ``path``
    (deflated: mostly zeros at 65536 thresholds) with the names of its example files. ``examples``: the sets whose
    file is written (default: all); the others are left as they are. A set's frames change only when it takes a new
    example, and rewriting every set's (tens of MB each) at every save made a run wait for its saves, a run over
    many sets (the robustness suite) longer with each set."""
    sets, frames = json.loads(str(arrays["meta"]))["sets"], _examples_by_set(arrays)
    files = {name: examples_path(path, sets.index(name)) for name in frames}
    for name, file in files.items():
        if examples is None or name in examples:
            write_npz(file, frames[name], compressed=False)
    rest = {k: v for k, v in arrays.items() if not _is_example(k)}
    write_npz(path, {**rest, EXAMPLE_FILES: np.array(sorted(file.name for file in files.values()), dtype=str)})


def examples_path(path, index):
    """The file of the example frames of the run's ``index``-th set: ``state.examples.<index>.npz`` beside
    ``state.npz``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.examples.{index}.npz")


def _state_arrays(path):
    """A state's arrays (:func:`write_state`) with those of the example files it names (a state written before
    each set had a file of its own names none: its examples are in ``state.examples.npz`` or in itself)."""
    path = Path(path)
    arrays = read_npz(path, "evaluation state")
    names = arrays.pop(EXAMPLE_FILES, None)
    if names is None:
        names = [f"{path.stem}.examples.npz"] if path.with_name(f"{path.stem}.examples.npz").exists() else []
    examples = {}
    for name in map(str, np.atleast_1d(names)):
        if not re.fullmatch(rf"{re.escape(path.stem)}\.examples(\.\d+)?\.npz", name):
            raise ValueError(f"{path} names {name!r} as a file of example frames; expected "
                             f"{examples_path(path, 0).name!r} and the like")
        if not path.with_name(name).exists():
            raise ValueError(f"{path} lists {name} (example frames), which is missing beside it: copy the run "
                             "folder whole")
        examples.update(read_npz(path.with_name(name), "evaluation examples"))
    return {**examples, **arrays}


def _examples_by_set(arrays):
    """{set name: {key: frame array}} of the example frames among a state's ``arrays``."""
    frames = {}
    for key in filter(_is_example, arrays):
        frames.setdefault(key.split("/")[1], {})[key] = arrays[key]
    return frames


def _is_example(key):
    return key.startswith("examples/")


def component_spec(components, commit_on=None):
    """The component-metrics spec of a run, checked: {"preset": "anomaly" | "obstacle", "thresholds": {method:
    threshold, or {set: threshold}}, "source": "committed" (chosen on a tuning set; the default) or "oracle"
    (chosen on each test set itself, e.g. with segood.metrics.components.best_f1_threshold)}.

    Without "thresholds" the run chooses them from its pixel counts (:func:`chosen_thresholds`) by "rule" (one of
    :data:`segood.metrics.thresholds.RULES`, default "f1"): "committed" on the run's set "commit_on" (default
    ``commit_on``, the run's own) and applied unchanged to every set, or "oracle" on each set itself. The spec
    then reads {"preset", "thresholds": None, "source", "rule", "commit_on": the set or None}."""
    if components is None:
        return None
    preset, thresholds = components.get("preset", "anomaly"), components.get("thresholds")
    source = components.get("source", "committed")
    if preset not in PRESETS or source not in ("committed", "oracle") or not (thresholds is None
                                                                             or isinstance(thresholds, dict)):
        raise ValueError(f"components must be {{'preset': one of {sorted(PRESETS)}, 'thresholds': {{method: threshold "
                         f"or {{set: threshold}}}} or absent, 'source': 'committed' or 'oracle'}}, got {components!r}")
    if thresholds is not None:
        if components.get("rule") is not None:
            raise ValueError("a rule ('rule', --component-rule) chooses thresholds the run picks itself; given "
                             "thresholds ('thresholds', --component-thresholds FILE) are used as they are: drop one")
        return {"preset": preset, "thresholds": thresholds, "source": source}
    rule = components.get("rule") or "f1"
    if rule not in RULES:
        raise ValueError(f"unknown threshold rule {rule!r} for the component metrics; choose one of {', '.join(RULES)}")
    tuning = components.get("commit_on", commit_on) if source == "committed" else None
    if source == "committed" and tuning is None:
        raise ValueError("the component metrics need a threshold per method: commit it on a tuning set of the run "
                         "(--commit-on SET; commit_on=SET), give it in a file (--component-thresholds FILE.json; "
                         "'thresholds': {method: threshold}), or tune it on each test set itself, reported as an "
                         "oracle (--component-thresholds oracle; 'source': 'oracle')")
    return {"preset": preset, "thresholds": None, "source": source, "rule": rule, "commit_on": tuning}


def check_given_thresholds(components, method_names, set_names):
    """Given component thresholds ({method: threshold or {set: threshold}}) must reach the run: a method or set
    they name outside it is warned about (a file may hold more methods than a run evaluates), none reaching it is
    an error (a misspelt name left the run without component metrics, silently)."""
    given = (components or {}).get("thresholds")
    if given is None or chosen_by_run(components):
        return
    unknown = [m for m in given if m not in method_names]
    unknown += [f"{m}/{s}" for m, v in given.items() if m in method_names and isinstance(v, dict)
                for s in v if s not in set_names]
    if not any(component_threshold(components, m, s) is not None for m in method_names for s in set_names):
        raise ValueError(f"the component thresholds given ({', '.join(map(str, given)) or 'none'}) name none of the "
                         f"run's methods {method_names} on its sets {set_names}: name them as the run does")
    if unknown:
        warnings.warn(f"component thresholds of {', '.join(unknown)} left unused: not methods (or sets) of this run")


def chosen_by_run(components):
    """Whether the run chooses the component thresholds itself (after its pixel pass)."""
    return components is not None and "rule" in components


def component_threshold(components, method, set_name):
    """The threshold of ``method`` on ``set_name`` (None: no component metrics for it, or not chosen yet)."""
    value = (components["thresholds"] or {}).get(method) if components else None
    return value.get(set_name) if isinstance(value, dict) else value


def chosen_thresholds(components, results):
    """The thresholds a run chooses itself, from its pooled pixel results {(method, set): ``compute()`` or None}:
    committed, {method: the threshold ``components["rule"]`` picks on the set ``components["commit_on"]``}; oracle,
    {method: {set: the threshold the rule picks on that set}} for the sets with ID and OOD pixels."""
    rule, tuning = components["rule"], components["commit_on"]
    methods = list(dict.fromkeys(m for m, _ in results))
    if components["source"] == "committed":
        for m in methods:
            r = results.get((m, tuning))
            if r is None or not (r["n_ood"] and r["n_id"]):
                raise ValueError(f"cannot commit {m}'s component threshold on {tuning!r}: it needs ID and OOD pixels "
                                 f"there ({0 if r is None else r['n_id']} ID, {0 if r is None else r['n_ood']} OOD); "
                                 "choose another --commit-on set")
        return {m: commit(results[(m, tuning)], rule) for m in methods}
    return {m: {s: commit(r, rule) for (m2, s), r in results.items() if m2 == m and r and r["n_ood"] and r["n_id"]}
            for m in methods}


def _array(value, shape, dtype, *, counts=False):
    """``value`` as a finite array of ``shape`` and ``dtype`` (``counts``: non-negative integers), or a
    ValueError."""
    array = np.asarray(value)
    kind = np.integer if counts else np.number
    if array.shape != shape or not (np.issubdtype(array.dtype, kind) and np.isfinite(array).all()) \
            or (counts and (array < 0).any()):
        raise ValueError(f"expected {'counts' if counts else 'finite numbers'} of shape {shape}, got {array.dtype} "
                         f"of shape {array.shape}")
    return array.astype(dtype)


def _model_output(value):
    """A state's record of the model's outputs (:meth:`Evaluation.note_output`), checked."""
    if value == {}:
        return {}
    flags = ("resized", "align_corners", "probabilities")
    if not (isinstance(value, dict) and {"classes", "resized", "align_corners"} <= set(value) <= {"classes", *flags}
            and (value["classes"] is None or type(value["classes"]) is int and value["classes"] > 0)
            and all(isinstance(value[k], bool) for k in flags if k in value)):
        raise ValueError("'model_output' must be {\"classes\": a positive int or null, \"resized\": bool, "
                         "\"align_corners\": bool} (and \"probabilities\": bool)")
    return dict(value)


#: what a run says of a network whose outputs look like probabilities, not logits
PROBABILITIES_NOTE = ("The network's outputs lie in [0, 1] and sum to 1 over its classes: probabilities, not logits? "
                      "Every method takes them as logits (max_logit then scores a max softmax, and the softmax "
                      "methods a softmax of probabilities): give the network's logits.")


def _probabilities(logits):
    """Whether the first frame's outputs (every 8th row and column) lie in [0, 1] and sum to 1 over the classes."""
    sample = logits[:1, :, ::8, ::8].float()
    return bool(sample.min() >= 0 and sample.max() <= 1 and (sample.sum(dim=1) - 1).abs().max() < 1e-3)


def _frame_counts(value, sets, key):
    """{set: non-negative int} for every set of the run, or a ValueError."""
    if not isinstance(value, dict) or set(value) != set(sets) or not all(
            type(v) is int and v >= 0 for v in value.values()):
        raise ValueError(f"{key!r} must give a non-negative number of frames for every set {sets}")
    return dict(value)


def shard_bounds(frames, rank, world_size):
    """(start, stop) of the frames rank ``rank`` of ``world_size`` scores: contiguous blocks in rank order, so that a
    merged state's per-image rows (concatenated rank by rank) are in frame order, as one process's are: resamples
    of the same seed draw the same images, and runs sharded differently pair image by image."""
    return frames * rank // world_size, frames * (rank + 1) // world_size


def run(model, sets, methods, out_dir, options, *, rank=0, world_size=1, seed=0, quality=False,
        examples=(EXAMPLES_PER_SET, EXAMPLE_WIDTH)):
    """Evaluate ``methods`` (method objects) of ``model`` on ``sets`` ({name: .h5 path, or a Dataset of segood
    items such as :class:`segood.robustness.CorruptedSet`}) with ``options`` (an
    :class:`~segood.evaluation.options.EvaluateOptions`: batch size, device, grid, resume, save_every, progress,
    skip_bad, verify, components, official mode); returns the :class:`Evaluation` (all-reduced over ranks).
    Writes ``state.npz`` (per rank) in ``out_dir``. ``quality`` and ``examples``: see :class:`Evaluation`. When
    the run chooses its component thresholds, a components pass over the sets follows the pixel pass (only the
    methods and sets with a threshold).

    Monte-Carlo dropout is seeded per frame from (seed, set, frame), so a resumed, sharded or re-batched run draws
    the samples of an uninterrupted one."""
    grid, components, official = options.grid, options.components, options.official
    scorer = isinstance(model, Scorer)
    if scorer and quality:
        raise ValueError(f"segmentation quality (mIoU, calibration) needs a network's logits; scorer {model.name} "
                         "gives anomaly scores only")
    device = options.device or (torch.device("cpu") if scorer else device_of(model))
    check_methods(model, methods)
    refuse_unrecordable(methods)
    folder = RunFolder(out_dir)
    make_folder(folder.path)
    datasets = {name: path if hasattr(path, "__getitem__") and not isinstance(path, (str, Path)) else
                H5SegmentationDataset(path, verify=options.verify) for name, path in sets.items()}
    for path in sets.values():
        if isinstance(path, (str, Path)):  # (datasets built elsewhere, e.g. corrupted on the fly, check their own)
            require_labels(path)
    names = [m.name for m in methods]
    state_path = folder.state(rank, world_size)
    if options.resume and state_path.exists():
        ev = Evaluation.load(state_path)
        if ev.method_names != names or ev.set_names != list(sets) or ev.grid != (grid or grid_spec()) \
                or ev.quality != quality or ev.official != official:
            raise ValueError(f"{state_path} holds a run of methods {ev.method_names} on sets {ev.set_names} (grid "
                             f"{ev.grid}, official mode {ev.official}), not {names} on {list(sets)} (official mode "
                             f"{official}): use another --out or drop --resume")
        unknown = ev.unregistered_metrics()
        if unknown:
            raise ValueError(f"{state_path} counts {', '.join(unknown)} per image, which no metric registered now "
                             "computes: resume with the module that registers it (segood --plugin MODULE evaluate "
                             "... --resume; in Python, import it first)")
    else:
        if options.resume:
            warnings.warn(f"nothing to resume in {folder.path} (no {state_path.name}): the run starts afresh",
                          stacklevel=3)
        check_given_thresholds(components, names, list(sets))
        ev = Evaluation(names, list(sets), grid, components, quality=quality, examples=examples, official=official)
    model.eval()
    if options.compile:
        model = compiled(model, options.compile)
    make_accumulator(ev.grid).update(np.zeros(1, np.float32), np.zeros(1, np.uint8))  # load the grid's kernel once
    loop = _Loop(model, datasets, ev, _Saver(state_path), device=torch.device(device), batch_size=options.batch_size,
                 save_every=options.save_every, shard=(rank, world_size), skip_bad=options.skip_bad, seed=seed,
                 progress=options.progress, workers=options.workers, amp=options.amp,
                 updates=_Updates(torch.device(device), _overlaps(torch.device(device))))
    try:
        loop.run_pass("evaluate", ev.done, lambda s: methods, ev.update_pixels)
        if chosen_by_run(ev.components):
            thresholds = chosen_thresholds(ev.components, _pooled_results(ev))  # from saved counts: not saved here
            if ev.components["thresholds"] is None:  # (a resumed run chose them already: the same numbers)
                ev.choose_component_thresholds(thresholds)
            loop.run_pass("components", ev.components_done,
                          lambda s: [m for m in methods if (m.name, s) in ev.comp], ev.update_components_pass)
    finally:
        loop.updates.close()  # (nothing of the run goes on after it; an update's error was raised where met)
        loop.saver.wait()
        ev.probabilities = KeptTensor()  # (memory for the run's batches, not a result to keep)
    return ev.all_reduce()


class KeptTensor:
    """A float32 tensor kept from one batch to the next and written again, made anew only for another shape or
    device: a fresh tensor has every page of its memory faulted in when first written (on the CPU of a virtual
    machine about 0.7 ms a MB, more than the softmax of its logits takes). Only for what nothing of a batch keeps
    past its update."""

    def __init__(self):
        self.tensor, self.key = None, None

    def of(self, shape, device):
        key = (tuple(shape), torch.device(device))  # (as asked for: "cuda" is not the tensor's "cuda:0")
        if key != self.key:
            self.tensor, self.key = torch.empty(shape, device=device), key
        return self.tensor


def softmax(logits, kept):
    """``torch.softmax`` over the classes (dimension 1) of ``logits`` in float32: on the CPU the same kernel,
    written into ``kept`` (a :class:`KeptTensor`)."""
    logits = logits.float()
    if logits.device.type != "cpu":
        return torch.softmax(logits, dim=1)
    return torch.ops.aten._softmax.out(logits, 1, False, out=kept.of(logits.shape, logits.device))


class _InThread:
    """One piece of work at a time in a thread of its own; an error it raised is raised by the next :meth:`start`
    or :meth:`wait`."""

    def __init__(self, name):
        self.name, self.thread, self.error = name, None, None

    def start(self, work, *args):
        self.wait()
        self.thread = threading.Thread(target=self._guarded, args=(work, *args), name=self.name, daemon=True)
        self.thread.start()

    def _guarded(self, work, *args):
        try:
            work(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self.error = err

    def wait(self):
        """Wait for the work running; raise its error, if it failed."""
        self.close()
        error, self.error = self.error, None
        if error is not None:
            raise error

    def close(self):
        """Wait for the work running, its error kept for :meth:`wait` (where an earlier error is on its way, it
        is let go with the object)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None


class _Saver(_InThread):
    """Saves the run's state (atomically) in a background thread, one save at a time, so that the next batches
    are scored while the last state is compressed and written; a save that failed is raised by the next
    :meth:`save` or :meth:`wait`."""

    def __init__(self, path):
        super().__init__("segood-save")
        self.path = path
        self.examples = None  # {set: keys of its example frames in its file} (None: none written yet)

    def save(self, ev, *, wait=False):
        self.wait()
        arrays = {key: value if _is_example(key) else np.array(value, copy=True)  # as they are now (example
                  for key, value in ev.arrays().items()}  # frames are never changed once taken: not copied)
        self.start(self._write, arrays)
        if wait:
            self.wait()

    def _write(self, arrays):
        examples = {name: set(frames) for name, frames in _examples_by_set(arrays).items()}  # (their keys)
        write_state(self.path, arrays, examples={name for name, keys in examples.items()
                                                 if self.examples is None or self.examples.get(name) != keys})
        self.examples = examples


def _overlaps(device):
    """Whether a batch's update runs beside the next batch's network: on CUDA, where the host's share of counting
    (its reads from the device, each image's bookkeeping) would leave the device idle; not on the CPU, where the
    network and the counting kernels each use every core (on 2 cores, overlapped: 10.3 -> 11.2 ms a frame)."""
    return device.type == "cuda"


class _Updates(_InThread):
    """The batches' updates, one at a time, in order. With ``overlap`` each runs in a thread of its own while the
    main thread reads the next batch and starts its network; on CUDA on a stream of its own, which first waits for
    the batch's scores and is synchronised before the batch's tensors are let go (their memory may then serve the
    next batch). That stream has the high priority: as the next batch's network kernels free the device's
    multiprocessors, the update's short kernels take them first, so the update (which waits for its counts) does
    not wait for that network. An update that failed is raised by the next :meth:`submit` or :meth:`wait`. Without
    ``overlap`` each update runs in :meth:`submit`."""

    def __init__(self, device, overlap):
        super().__init__("segood-update")
        self.device, self.overlap = device, overlap
        self.stream = torch.cuda.Stream(device, priority=-1) if overlap and device.type == "cuda" else None

    def submit(self, update):
        if not self.overlap:
            update()
            return
        scored = None
        if self.stream is not None:  # (recorded after the batch's scores on the main thread's stream)
            scored = torch.cuda.Event()
            scored.record(torch.cuda.current_stream(self.device))
        self.start(self._run, update, scored)

    def _run(self, update, scored):
        if self.stream is None:
            update()
            return
        with torch.cuda.stream(self.stream):
            try:
                self.stream.wait_event(scored)
                update()
            finally:
                self.stream.synchronize()


@dataclass
class _Loop:
    """A pass over the sets is read -> score -> update per batch, saved every ``save_every`` batches and at the
    end of each set; the pixel pass and the components pass are two uses of it (the same batches, so the same
    Monte-Carlo seeds and scores). Batches are read ahead by ``workers`` processes
    (:func:`~segood.evaluation.reading.batch_reader`), and each batch's update runs beside the next batch's
    network where ``updates`` overlaps them (:class:`_Updates`; every save waits for the update running).
    ``shard`` = (rank, world size): this process scores its block of frames (:func:`shard_bounds`)."""

    model: object
    datasets: dict
    ev: "Evaluation"
    saver: _Saver
    device: torch.device
    batch_size: int
    save_every: int
    shard: tuple
    skip_bad: bool
    seed: int
    progress: bool
    workers: int | None  # None: default_workers of each pass's plan
    amp: str | None
    updates: _Updates
    inputs: KeptTensor = field(default_factory=KeptTensor)  # the normalised frames of a batch

    def plan(self, done, methods_of):
        """[(set name, frame indices)]: the batches of every set's frames not yet ``done`` that has methods."""
        rank, world_size = self.shard
        plan = []
        for set_name, dataset in self.datasets.items():
            if methods_of(set_name):
                frames = list(range(*shard_bounds(len(dataset), rank, world_size)))[done[set_name]:]
                plan += [(set_name, frames[k : k + self.batch_size]) for k in range(0, len(frames), self.batch_size)]
        return plan

    def run_pass(self, label, done, methods_of, update):
        """Every set's frames not yet ``done`` (frames per set, advanced here) scored with ``methods_of(set)`` and
        handed to ``update(set, frame indices, batch, scored, method names)``."""
        plan = self.plan(done, methods_of)
        workers = default_workers(self.datasets, plan) if self.workers is None else self.workers
        reads = batch_reader(self.datasets, plan, workers=workers, pin=self.device.type != "cpu",
                             skip_bad=self.skip_bad)
        # (closed when the pass ends, not when collected: a failed pass's traceback holds this frame, which would
        # keep its readers running; closing stops them)
        frames = sum(len(indices) for _, indices in plan)
        with contextlib.closing(reads), beside_readers(workers), tqdm(total=frames, desc=label, unit="img",
                                                                      disable=not self.progress) as bar:
            for count, (set_name, indices) in enumerate(plan, 1):
                self.step(label, set_name, indices, reads, methods_of(set_name), update)
                done[set_name] += len(indices)
                bar.update(len(indices))
                if count % self.save_every == 0 or count == len(plan) or plan[count][0] != set_name:
                    self.updates.wait()
                    self.saver.save(self.ev)
        if not plan:
            self.saver.save(self.ev)

    def step(self, label, set_name, indices, reads, methods, update):
        """One batch: read (unreadable frames stop the run, saved, or are passed over with ``skip_bad``), then
        score each run of frames of one size and hand it to :meth:`update_batch` (through :attr:`updates`)."""
        ev, pixel_pass, t0 = self.ev, label != "components", time.perf_counter()
        try:
            batches, bad = next(reads)
        except UnreadableFrame as err:
            self.updates.wait()
            self.saver.save(ev, wait=True)
            raise ValueError(f"{set_name}: {err}; what was accumulated is saved in the run folder (--resume "
                             "continues), or pass --skip-bad") from None
        if pixel_pass:  # (the components pass meets the same frames: recorded once)
            ev.skipped += [[set_name, i, reason] for i, reason in bad]
            if batches:
                ev.seconds["data"] += time.perf_counter() - t0
        for batch, part in batches:  # frames of different sizes are scored apart
            scored = self.score(set_name, batch, part, methods)
            self.updates.submit(functools.partial(self.update_batch, set_name, part, batch, scored, methods, update,
                                                  pixel_pass))
        if not pixel_pass:  # all of it: its forward passes are not the run's inference time
            ev.seconds["components"] = ev.seconds.get("components", 0.0) + time.perf_counter() - t0

    def update_batch(self, set_name, part, batch, scored, methods, update, pixel_pass):
        """``update(set name, frame indices, batch, scored, method names)`` of one scored batch, and the time of
        its stages."""
        ev, t1 = self.ev, time.perf_counter()
        ev.note_output(None if scored.output is None else scored.output.logits, resized=scored.resized,
                       align_corners=getattr(self.model, "align_corners", False))
        try:
            update(set_name, part, batch, scored, [m.name for m in methods])
        except ValueError as err:  # e.g. a method's NaN scores. Not saved: this batch is half-counted,
            raise ValueError(f"{set_name}: frames {part}: {_nan_origin(scored, methods)}{err}; a run folder's last "
                             "save is consistent (--resume continues from it)") from None  # while the last save is
        if pixel_pass:
            for stage, seconds in scored.seconds.items():
                ev.seconds[stage] += seconds
            ev.seconds["accumulate"] += time.perf_counter() - t1  # (no wait for the device: what the
            # accumulators read from it they waited for; the per-class sums still queued are not waited for)

    def score(self, set_name, batch, indices, methods):
        """The batch's scores (:func:`score_frames`), each frame's Monte-Carlo dropout seeded by (seed, set, frame)."""
        images = batch["image"].to(self.device, non_blocking=True)
        try:
            scored = score_frames(self.model, images, methods, out=self.inputs.of(images.shape, self.device),
                                  mc_seeds=frame_seeds(self.seed, set_name, indices), amp=self.amp)
        except ValueError as err:  # e.g. a scorer's misshapen or NaN scores (chained: where a scorer raised it)
            raise ValueError(f"{set_name}: frames {indices}: {err}") from err
        return scored


def _nan_origin(scored, methods):
    """'METHOD: ' for the methods whose scores hold NaN, and whether the network's logits do ('' for none)."""
    nan = [m.name for m, scores in zip(methods, scored.scores) if torch.isnan(scores).any()]
    logits = scored.output.logits if scored.output is not None else None
    if logits is not None and torch.isnan(logits).any():
        return (f"{', '.join(nan)}: the network's logits are NaN at {int(torch.isnan(logits).any(dim=1).sum())} "
                "pixels (check its weights and its input normalisation); ")
    return f"{', '.join(nan)}: " if nan else ""


def _pooled_results(ev):
    """{(method, set): the pooled ``compute()`` of the whole set (summed over the ranks of a sharded run, on a
    copy: the run's own counts are all-reduced once, at its end), or None where it saw no image}."""
    import torch.distributed as dist

    sharded = dist.is_available() and dist.is_initialized()
    out = {}
    with warnings.catch_warnings():  # undefined metrics are NaN; the thresholds need only the counts
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for key, acc in ev.acc.items():
            acc = copy.deepcopy(acc).all_reduce() if sharded else acc
            out[key] = acc.compute() if acc.n_images else None
    return out


def run_identity():
    """segood version and git commit of the code that ran (None outside a git checkout)."""
    return {"segood_version": __version__, "git_commit": _git_commit()}


@functools.lru_cache(maxsize=1)  # (asked once a process, not once a run: a git subprocess takes ~4 ms)
def _git_commit():
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
