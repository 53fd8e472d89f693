"""What the three pixel accumulators (the linear, float-order and exact grids) share: the per-image bookkeeping,
their state's common keys and reductions (:mod:`segood.metrics.state`), the checks of state fields and inputs."""

import functools

import numpy as np

from segood.metrics.bootstrap import ImageCounts
from segood.metrics.functional import METRICS, metrics_from_counts, raise_bad_labels
from segood.metrics.state import Part

# state arrays that older states lack: the names of the per-image metrics, the per-image counts (bootstrap)
OPTIONAL_STATE = ("per_image_metrics", "image_offsets", "image_keys", "image_counts", "image_values")
# how the keys every accumulator's state holds combine (segood.metrics.state)
SHARED_REDUCTIONS = {"n_ignored": "sum", "n_images": "sum", "per_image_sum": "sum", "per_image_defined": "sum",
                     "image_offsets": "offsets", "image_keys": "cat", "image_counts": "cat", "image_values": "cat"}


def settled_fields(*fields):
    """Properties of ``fields``, each stored as ``_<field>``: read after :meth:`Streaming.settle` (where work is
    pending), written as they are."""
    return (property(lambda self, name=f"_{field}": self._settled(name),
                     lambda self, value, name=f"_{field}": setattr(self, name, value)) for field in fields)


class Streaming(Part):
    """What the accumulators share: adding, copying, saving, merging and all-reducing (by their ``reductions``,
    :mod:`segood.metrics.state`), per-image splitting and per-image bookkeeping."""

    STATE_NAME = "accumulator state"

    def __add__(self, other):
        return self.copy().merge(other)

    def begin_update(self, scores, labels, *, clip=False):
        """:meth:`update` in two steps: whatever the device can do alone is started, and the function returned (no
        arguments) completes the update, waiting for the device where it must, and returns self. The state is
        unchanged until then (and when that raises); the inputs must stay unchanged until then too, since the
        completion may read them. Several accumulators' updates begun before any is completed wait for the device
        once: the float-order grid's, where the state holds the batch's binades (the others do all their work on
        completion)."""
        return functools.partial(self.update, scores, labels, clip=clip)

    # The per-image bookkeeping, read through properties: an image's bookkeeping (its curve, metrics and coarse
    # counts: host work) may wait in a queue (:meth:`_queue_image`) until :meth:`settle` or any read of these.
    n_images, per_image_sum, per_image_defined, images = settled_fields(
        "n_images", "per_image_sum", "per_image_defined", "images")

    def settle(self):
        """Do the work still pending (the evaluation calls it while the device runs the next batch's network):
        here the per-image bookkeeping queued; every read of the state does it first. Returns self."""
        queued, self._queued = self._queued, []
        for curve, args in queued:
            self._add_image(*curve(*args))
        return self

    def _pending(self):
        """Whether :meth:`settle` has work to do."""
        return bool(self._queued)

    def _settled(self, name):
        if self._pending():
            self.settle()
        return vars(self)[name]

    def _queue_image(self, curve, *args):
        """Queue an image's bookkeeping: :meth:`_add_image` of ``curve(*args)`` when :meth:`settle` runs."""
        self._queued.append((curve, args))

    @staticmethod
    def _check_keys_and_format(state, empty, state_format):
        """The first checks of ``from_state_dict``: every key of an ``empty`` accumulator's state present (but the
        optional ones), and the format ``state_format``."""
        missing = [k for k in empty.state_dict() if k not in state and k not in OPTIONAL_STATE]
        if missing:
            raise ValueError(f"accumulator state lacks {missing}; was it written by state_dict()?")
        if str(np.asarray(state["format"])) != state_format:
            raise ValueError(f"unknown accumulator state format {state['format']!r}; expected {state_format!r}")

    def _setup(self, *, per_image, score_range):
        """The settings every grid's accumulator takes beside its own, checked; then an empty state."""
        self.per_image = bool(per_image)
        self.score_range = self._declared_range(score_range)
        self.metric_names = tuple(METRICS)  # the per-image sums follow the metric table of the accumulator's making
        self.reset()

    def _reset_shared(self):
        """Forget what every accumulator keeps beside its counts: ignored pixels and the per-image bookkeeping."""
        self.n_ignored = 0
        self._queued = []  # [(curve, its arguments)] of images whose bookkeeping waits (:meth:`settle`)
        self.n_images = 0
        self.per_image_sum = np.zeros(len(self.metric_names))
        self.per_image_defined = 0  # images where the per-image metrics are defined
        self.images = ImageCounts(self.metric_names)  # per image: coarse counts and metrics (bootstrap)

    @staticmethod
    def _declared_range(score_range):
        """A declared score range as (lo, hi) floats with lo < hi, or None."""
        if score_range is None:
            return None
        lo, hi = (float(v) for v in score_range)
        if not lo < hi:
            raise ValueError(f"score_range must have lo < hi, got {score_range!r}")
        return lo, hi

    def _shared_state(self):
        """The state entries both accumulators have: ignored pixels and the per-image bookkeeping."""
        return {
            "n_ignored": np.array(self.n_ignored, dtype=np.int64),
            "n_images": np.array(self.n_images, dtype=np.int64),
            "per_image_sum": self.per_image_sum.copy(),
            "per_image_defined": np.array(self.per_image_defined, dtype=np.int64),
            "per_image_metrics": np.array(self.metric_names, dtype=str),
            **self.images.arrays(),
        }

    def _per_image_mean(self):
        """{metric: mean over the images where it is defined, ``n_images``: those images, ``n_images_total``}."""
        defined = self.per_image_defined
        means = self.per_image_sum / defined if defined else np.full(len(self.metric_names), np.nan)
        return {**{name: float(v) for name, v in zip(self.metric_names, means)}, "n_images": int(defined),
                "n_images_total": int(self.n_images)}

    def _add_image(self, thresholds, hist, fp=None, tp=None):
        """Per-image bookkeeping for one image's counts (``fp``, ``tp``: their reverse cumulative sums, where the
        caller has them): its metrics, where it has ID and OOD pixels."""
        self._n_images += 1
        if fp is None:
            fp, tp = reverse_cumsum(hist)
        values = np.full(len(self.metric_names), np.nan)
        if hist.size and fp[0] and tp[0]:
            metrics = metrics_from_counts(thresholds, tp, fp, int(tp[0]), int(fp[0]), warn=False)
            values = np.array([metrics[name] for name in self.metric_names])
            self._per_image_sum += values
            self._per_image_defined += 1
        self._images.add(thresholds, hist, values)

    def _split_images(self, scores, labels):
        """[(scores, labels)] per image with ``per_image``, else the whole input as one piece."""
        scores, labels = matching_inputs(scores, labels)
        if self.per_image and len(scores.shape) >= 3:
            return list(zip(scores, labels))
        return [(scores, labels)]

    def _image_count(self, scores):
        """How many images an input of this shape holds: its first axis with ``per_image`` and 3+ dimensions."""
        return scores.shape[0] if self.per_image and len(scores.shape) >= 3 else 1


def reverse_cumsum(hist):
    """Per-threshold counts (pixels with score >= t_k) from per-bin counts, for each row."""
    return np.cumsum(hist[..., ::-1], axis=-1)[..., ::-1]


def load_per_image(acc, state):
    """Validate and set the per-image fields of a state (either accumulator): counts, and sums that the
    metrics' ranges allow; a state names the metrics of its sums (states before that: the built-in four)."""
    from segood.metrics.functional import METRIC_NAMES

    acc.n_images = read_count(state, "n_images")
    acc.per_image_defined = read_count(state, "per_image_defined")
    if acc.per_image_defined > acc.n_images:
        raise ValueError(f"accumulator state: per_image_defined ({acc.per_image_defined}) exceeds n_images "
                         f"({acc.n_images})")
    names = state.get("per_image_metrics")
    names = tuple(str(n) for n in np.asarray(names).ravel()) if names is not None else METRIC_NAMES
    sums = np.asarray(state["per_image_sum"])
    if sums.shape != (len(names),) or not np.issubdtype(sums.dtype, np.floating) or not np.isfinite(sums).all():
        raise ValueError(f"accumulator state 'per_image_sum' must be {len(names)} finite floats (one per metric: "
                         f"{', '.join(names)}), got {sums.dtype} of shape {sums.shape}")
    n = acc.per_image_defined
    for name, value in zip(names, sums):
        lo, hi = (METRICS[name].range or (-np.inf, np.inf)) if name in METRICS else (-np.inf, np.inf)
        if not (value == 0 if n == 0 else lo * n - 1e-9 <= value <= hi * n + 1e-9):
            raise ValueError(f"accumulator state 'per_image_sum' of {name} is {value}: impossible for "
                             f"{acc.per_image_defined} images with values in [{lo}, {hi}]")
    acc.metric_names, acc.per_image_sum = names, sums.astype(np.float64)
    acc.images = ImageCounts(names)
    if "image_offsets" in state:  # states before per-image counts have none: they cannot be bootstrapped
        acc.images = ImageCounts.from_arrays(state, names)
        if len(acc.images) not in (0, acc.n_images):
            raise ValueError(f"accumulator state holds counts of {len(acc.images)} images but n_images is {acc.n_images}")
        pooled = tuple(int(v) for v in acc.curve_counts()[1].sum(axis=1))
        if len(acc.images) and acc.images.totals() != pooled:
            raise ValueError(f"accumulator state: the per-image counts sum to {acc.images.totals()} (ID, OOD) "
                             f"pixels, the pooled counts to {pooled}")


def read_flag(state, key):
    value = np.asarray(state[key])
    if value.shape != () or value.dtype != bool:
        raise ValueError(f"accumulator state {key!r} must be a boolean, got {value.dtype} of shape {value.shape}")
    return bool(value)


def read_count(state, key):
    """A non-negative integer scalar of the state (an int64 value; never a float such as 400.7)."""
    value = np.asarray(state[key])
    if value.shape != () or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(f"accumulator state {key!r} must be an integer, got {value.dtype} of shape {value.shape}")
    if not 0 <= int(value) <= _INT64_MAX:
        raise ValueError(f"accumulator state {key!r} must be a non-negative int64, got {int(value)}")
    return int(value)


_INT64_MAX = int(np.iinfo(np.int64).max)


def is_cuda(x):
    return type(x).__module__.startswith("torch") and x.is_cuda


def matching_inputs(scores, labels):
    """scores and labels as arrays or tensors, checked to have the same shape."""
    scores, labels = (x if hasattr(x, "shape") else np.asarray(x) for x in (scores, labels))
    if tuple(scores.shape) != tuple(labels.shape):
        raise ValueError(
            f"scores have shape {tuple(scores.shape)} but labels have shape {tuple(labels.shape)}; "
            "they must match pixel for pixel"
        )
    return scores, labels


def flat_cuda(scores, labels):
    scores, labels = device_tensors(scores, labels)
    return scores.reshape(-1), labels.reshape(-1)


def device_tensors(scores, labels):
    """Torch scores and uint8 labels on one device, checked (shapes kept)."""
    import torch

    if not all(type(x).__module__.startswith("torch") for x in (scores, labels)) or scores.device != labels.device:
        raise ValueError(f"scores and labels must be on the same device, got {getattr(scores, 'device', 'numpy')} "
                         f"and {getattr(labels, 'device', 'numpy')}")
    if scores.dtype.is_complex:
        raise TypeError(f"scores must be real numbers (float or integer), got dtype {scores.dtype}: take the real "
                        "part or the magnitude first")
    if labels.dtype == torch.bool:
        labels = labels.to(torch.uint8)
    if labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer OOD mask (0 ID, 1 OOD, 255 ignore), got {labels.dtype}")
    if labels.dtype != torch.uint8:
        if labels.numel() and (labels.min() < 0 or labels.max() > 255):
            raise_bad_labels(labels.cpu().numpy())
        labels = labels.to(torch.uint8)
    return scores.detach(), labels


def host(x):
    """numpy copy of a possibly-CUDA tensor; only used to word an error message."""
    return x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else np.asarray(x)

