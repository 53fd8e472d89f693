"""Segmentation networks (smp PSPNet / DeepLabV3+) with the heads some OOD methods need (the paper's Table 1).

The network is smp's encoder and decoder with segood's own head. Every head ends in a 1×1 classifier and a
bilinear upsample to the input size, the last operation before the softmax (the paper's §5), so each output
pixel maps to one location of the penultimate layer.
"""

import contextlib
import functools
import itertools
import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

ARCHS = ("pspnet", "deeplabv3plus")
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the normalisation every input gets, as the smp encoders expect
IMAGENET_STD = (0.229, 0.224, 0.225)
HEADS = ("plain", "dimreduce", "dropout", "confidence")


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild a network; stored in checkpoints as a plain dict."""

    arch: str = "pspnet"
    encoder: str = "resnet50"
    num_classes: int = 19
    head: str = "plain"
    dropout_p: float = 0.5
    reduced_dim: int = 32
    encoder_weights: str | None = None

    def to_dict(self):
        return asdict(self)


class QueryOutput:
    """The per-query outputs of a mask-classification network (Mask2Former, EoMT), which mask-level methods score.

    class_logits: (N, Q, K + 1), the last entry the "no object" class; mask_logits: (N, Q, h, w) before the
    sigmoid, covering the whole input at the network's own resolution; class_indices: the K' network classes that
    make the semantic classes, in their order (a class mapping), or None for all K. A plain class, not a dataclass,
    so that cropping a padded frame's outputs leaves these low-resolution tensors as they are.
    """

    __slots__ = ("class_logits", "mask_logits", "class_indices")

    def __init__(self, class_logits, mask_logits, class_indices=None):
        self.class_logits, self.mask_logits = class_logits, mask_logits
        self.class_indices = None if class_indices is None else tuple(int(i) for i in class_indices)

    def class_probabilities(self):
        """(N, Q, K') softmax over the K + 1 classes, the "no object" class and unmapped classes dropped after it."""
        probs = self.class_logits.softmax(dim=-1)[..., :-1]
        return probs if self.class_indices is None else probs[..., list(self.class_indices)]

    def mask_probabilities(self, size, *, queries=None):
        """(N, Q, H, W) sigmoid of the mask logits resized bilinearly to ``size`` (``queries``: a subset)."""
        logits = self.mask_logits if queries is None else self.mask_logits[:, queries]
        return F.interpolate(logits, size=tuple(size), mode="bilinear", align_corners=False).sigmoid()


@dataclass
class SegOutput:
    """logits (N, C, H, W); features: the penultimate layer (N, D, h, w); confidence (N, 1, H, W) in (0, 1) or
    None; queries: a mask-classification network's :class:`QueryOutput`, or None."""

    logits: torch.Tensor
    features: torch.Tensor
    confidence: torch.Tensor | None = None
    queries: QueryOutput | None = None


class SegmentationNetwork(nn.Module):
    """smp encoder + decoder + a segood head. Build with :func:`build_model`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.arch not in ARCHS:
            raise ValueError(f"unknown arch {config.arch!r}; choose one of {ARCHS}")
        if config.head not in HEADS:
            raise ValueError(f"unknown head {config.head!r}; choose one of {HEADS}")
        if not 0.0 <= config.dropout_p < 1.0:
            raise ValueError(f"dropout_p must be in [0, 1), got {config.dropout_p}")
        self.config = config
        base = create_smp(config.arch, config.encoder, config.num_classes, config.encoder_weights)
        self.encoder, self.decoder = base.encoder, base.decoder
        depth = base.segmentation_head[0].in_channels  # the decoder's output depth
        if config.head == "dimreduce":
            self.reduce = nn.Sequential(nn.Conv2d(depth, config.reduced_dim, 1, bias=False),
                                        nn.BatchNorm2d(config.reduced_dim), nn.ReLU(inplace=True))
            depth = config.reduced_dim
        self.classifier = nn.Conv2d(depth, config.num_classes, 1)
        self.confidence_branch = nn.Conv2d(depth, 1, 1) if config.head == "confidence" else None

    def penultimate(self, x):
        """The features the classifier sees: (N, D, h, w) (D = 32 for ``dimreduce``)."""
        features = self.decoder(self.encoder(x))
        if isinstance(features, (list, tuple)):
            features = features[-1]
        return self.reduce(features) if self.config.head == "dimreduce" else features

    def head(self, features, size, *, stochastic=False):
        """Classifier (and confidence branch) on penultimate features, upsampled to ``size`` = (H, W).

        Dropout (``dropout`` head) is active in training mode or when ``stochastic`` (Monte-Carlo sampling).
        """
        features = self._dropout(features, stochastic)
        logits = _upsample(self.classifier(features), size)
        confidence = None
        if self.confidence_branch is not None:
            confidence = torch.sigmoid(_upsample(self.confidence_branch(features), size))
        return logits, confidence

    def _dropout(self, features, stochastic, generators=None):
        """The ``dropout`` head's dropout: ``F.dropout`` in training; for Monte-Carlo sampling in eval mode the
        same Bernoulli(1 - p) mask scaled by 1 / (1 - p), drawn from uniform noise (3x faster on CPU than the
        ``bernoulli_`` behind ``F.dropout``; training keeps the stream the shipped checkpoints were made with):
        frame n's from ``generators[n]``, or all from torch's global generator."""
        if self.config.head != "dropout" or not (self.training or stochastic):
            return features
        if self.training:
            return F.dropout(features, self.config.dropout_p, training=True)
        keep = 1.0 - self.config.dropout_p
        if generators is None:
            noise = torch.rand_like(features)
        else:  # (contiguous whatever the features' layout: a seed's draws fill a frame in one order)
            noise = torch.empty(features.shape, dtype=features.dtype, device=features.device)
            for frame, generator in zip(noise, generators, strict=True):
                frame.uniform_(generator=generator)
        return features * ((noise < keep) * (1.0 / keep))

    @property
    def input_multiple(self):
        """The input's sides must be multiples of this (the encoder's output stride); scoring pads to it."""
        return getattr(self.encoder, "output_stride", 32)

    def forward(self, x):
        stride = self.input_multiple
        if x.ndim != 4 or x.shape[-2] % stride or x.shape[-1] % stride:
            h, w = x.shape[-2:]
            raise ValueError(f"input of shape {tuple(x.shape)}: expected (N, 3, H, W) with H and W divisible by "
                             f"{stride}; pad to ({-(-h // stride) * stride}, {-(-w // stride) * stride})")
        features = self.penultimate(x)
        logits, confidence = self.head(features, x.shape[-2:])
        return SegOutput(logits, features, confidence)

    def mc_logits(self, x, samples=8, features=None, seeds=None):
        """(T, N, C, H, W) logits of T Monte-Carlo dropout samples; encoder and decoder run once, only the
        stochastic head T times (Kendall et al. 2015; Mukhoti & Gal 2018), upsampled in one call (no stacking
        copy). ``features``: ``penultimate(x)`` when already computed (by an evaluation's forward pass, in eval
        mode). ``seeds``: one per frame, whose dropout masks then come from a generator of its own seeded with it,
        so that a frame's samples are the same in any batch; None: all from torch's global generator (equal to T
        calls of ``head(features, size, stochastic=True)`` in the same random stream)."""
        if self.config.head != "dropout":
            raise ValueError(f"mc_logits needs the 'dropout' head; this network has {self.config.head!r}")
        if seeds is not None and len(seeds) != len(x):
            raise ValueError(f"mc_logits: one seed per frame, {len(x)}, got {len(seeds)}")
        features = self.penultimate(x) if features is None else features
        generators = None if seeds is None else [torch.Generator(features.device).manual_seed(int(seed))
                                                 for seed in seeds]
        low = torch.cat([self.classifier(self._dropout(features, True, generators)) for _ in range(samples)])
        return _upsample(low, x.shape[-2:]).view(samples, x.shape[0], low.shape[1], *x.shape[-2:])


def create_smp(arch, encoder, num_classes, encoder_weights=None):
    """``smp.create_model`` with a ValueError naming the unknown architecture or encoder."""
    import segmentation_models_pytorch as smp

    try:
        return smp.create_model(arch, encoder_name=encoder, encoder_weights=encoder_weights, classes=num_classes)
    except KeyError as err:
        raise ValueError(f"segmentation_models_pytorch has no architecture {arch!r} with encoder {encoder!r} "
                         f"({str(err).strip(chr(39))[:200]})") from None


def _upsample(logits, size):
    """Bilinear upsampling to the input size: the last operation before the softmax."""
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)


def resize_output(output, size, *, align_corners=False):
    """``output`` (:class:`SegOutput`) with its logits and confidence resized bilinearly to ``size`` = (H, W) where
    they come out at another resolution (mmseg and detectron2 heads before their final resize, at 1/4 or 1/8 of the
    input); unchanged where they already have it. The features and query outputs keep their own resolution
    (Mahalanobis and the mask-level methods resize what they derive). ``align_corners`` as the model's own library
    resizes: False for torch and smp (``F.interpolate(..., mode="bilinear", align_corners=False)``), True for some
    mmseg configs."""
    size = tuple(size)
    if tuple(output.logits.shape[-2:]) == size:
        return output
    check_resolution(output.logits.shape, size)

    def resize(t):
        return None if t is None else F.interpolate(t, size=size, mode="bilinear", align_corners=align_corners)

    return SegOutput(resize(output.logits), output.features, resize(output.confidence), output.queries)


def check_resolution(shape, size):
    """Refuse logits of ``shape`` (N, C, h, w) that are no lower-resolution map of an input of ``size`` (H, W): larger
    than it, or of a shape no one stride s gives, each side within max(1, 3%) of the frame's side / s (the slack of
    decoders that upsample a rounded coarse grid): the dimensions of channels-last or transposed logits, which
    resizing would stretch over the frame."""
    (h, w), (height, width) = shape[-2:], size
    if h > height or w > width:
        raise ValueError(f"the network's logits are {tuple(shape)}, larger than the {height}x{width} input: crop them "
                         "to it (a network that pads its input crops its logits back), or, channels last, return "
                         "logits.permute(0, 3, 1, 2)")

    def strides(side, n):  # the strides s for which n lies within the slack of side / s
        slack = max(1.0, 0.03 * n)
        return side / (n + slack), side / (n - slack) if n > slack else math.inf

    (low_h, high_h), (low_w, high_w) = strides(height, h), strides(width, w)
    if max(low_h, low_w) > min(high_h, high_w):
        raise ValueError(f"the network's logits are {tuple(shape)}, which is no (N, C, h, w) map of the {height}x"
                         f"{width} input (its sides divided by {height / h:.3g} and {width / w:.3g}): logits channels "
                         "last? return logits.permute(0, 3, 1, 2)")


def frame_output(model, x):
    """The forward pass of ``model`` on ``x`` (N, 3, H, W) with its logits at the frame's size (H, W), as scoring
    gives them: ``x`` padded to the model's ``input_multiple``, :func:`resize_output` with its ``align_corners``
    (False where it declares none), the logits cropped back to the frame."""
    height, width = x.shape[-2:]
    padded = pad_to_multiple(x, getattr(model, "input_multiple", 1))
    output = resize_output(model(padded), padded.shape[-2:], align_corners=getattr(model, "align_corners", False))
    if padded is x:
        return output

    def crop(t):
        return None if t is None else t[..., :height, :width]
    return replace(output, logits=crop(output.logits), confidence=crop(output.confidence))


@contextlib.contextmanager
def evaluation_mode(model):
    """``model`` (an ``nn.Module``; anything else as it is) in eval mode meanwhile, as it is scored (batch norm's
    running statistics, dropout off), and each of its modules back in its own mode after: a model evaluated from
    within a training loop trains on as it did."""
    modes = [(m, m.training) for m in model.modules()] if isinstance(model, nn.Module) else []
    try:
        yield model.eval() if modes else model
    finally:
        for module, training in modes:
            module.training = training


def keeps_modes(function):
    """``function(model, ...)`` (which sets the model's modes as it needs) with each module of ``model`` back in its
    own mode after."""
    @functools.wraps(function)
    def wrapped(model, *args, **keywords):
        with evaluation_mode(model):
            return function(model, *args, **keywords)
    return wrapped


def check_device(device):
    """``device`` (a torch device or its name), refused with a ValueError naming the option where torch knows no such
    device, or it is not present on this machine."""
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device (--device) {device}: torch knows no such device; use cpu, cuda, cuda:1 or "
                         "mps") from None
    if checked.type == "meta":
        raise ValueError(f"device (--device) {device}: the meta device holds no data to score; use cpu or cuda")
    backend = torch.backends.mps if checked.type == "mps" else getattr(torch, checked.type, None)
    if backend is not None and hasattr(backend, "is_available") and not backend.is_available():
        raise ValueError(f"device (--device) {device}: this machine has no {checked.type} device torch can use; "
                         "use cpu, or run where there is one")
    if checked.type == "cuda" and checked.index is not None and checked.index >= torch.cuda.device_count():
        raise ValueError(f"device (--device) {device}: this machine has {torch.cuda.device_count()} CUDA devices, "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def device_of(module):
    """The device of ``module``'s first parameter or buffer: the CPU for a module that has neither."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return torch.device("cpu") if first is None else first.device


def pad_to_multiple(x, multiple):
    """``x`` (N, C, H, W) padded with zeros at the bottom and right to sides divisible by ``multiple``."""
    height, width = x.shape[-2:]
    pad_h, pad_w = -height % multiple, -width % multiple
    return F.pad(x, (0, pad_w, 0, pad_h)) if pad_h or pad_w else x


def preprocess(images, out=None):
    """(N, 3, H, W) uint8 RGB tensor -> float32, ImageNet-normalised, on the same device: into ``out`` where given
    (a float32 tensor of that shape there, which a loop over batches keeps, so that no fresh tensor has its pages
    faulted in: about 3 ms a 512×1024 frame on the CPU of a virtual machine), else into a new tensor.

    On CPU a numba kernel computes the same float32 operations in one pass, in row bands across torch's threads
    (bit for bit the same values: every one of the 768 is tested), instead of four passes over the frames."""
    if out is not None and (out.shape != images.shape or out.dtype != torch.float32 or out.device != images.device):
        raise ValueError(f"out must be float32 of shape {tuple(images.shape)} on {images.device}, got {out.dtype} of "
                         f"shape {tuple(out.shape)} on {out.device}")
    if images.device.type == "cpu" and images.dtype == torch.uint8 and images.numel():
        return _normalised_on_cpu(images, torch.empty(images.shape) if out is None else out)
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
    x = images.float() if out is None else out.copy_(images)
    return x.div_(255.0).sub_(mean).div_(std)  # in place: one copy of the frames, not four


_BAND_PIXELS = 1 << 16  # pixels of one plane per chunk of the CPU kernel (a thread that starts late takes fewer)


def _normalised_on_cpu(images, out):
    from segood._threads import run_chunks
    from segood.models._normalise import normalise_rows

    if images.shape[1] != 3:
        raise ValueError(f"expected RGB frames (N, 3, H, W), got shape {tuple(images.shape)}")
    n, _, h, w = images.shape
    source, target = images.numpy(), out.numpy()
    mean, std = (torch.tensor(v).numpy() for v in (IMAGENET_MEAN, IMAGENET_STD))  # (float32, as torch's operations)
    rows = max(1, min(h, _BAND_PIXELS // max(w, 1)))
    chunks = [((i, c), (start, min(h, start + rows))) for i in range(n) for c in range(3)
              for start in range(0, h, rows)]

    def work(taken):
        for k in taken:
            normalise_rows(source, mean, std, *chunks[k], target)

    run_chunks(work, len(chunks), torch.get_num_threads())
    return out


def build_model(arch="pspnet", encoder="resnet50", num_classes=19, head="plain", *, dropout_p=0.5, reduced_dim=32,
                encoder_weights=None):
    """A :class:`SegmentationNetwork`.

    Args:
        arch: ``pspnet`` (ResNet encoders in the paper) or ``deeplabv3plus`` (Xception: ``tu-xception41``, or
            any smp encoder).
        head: ``plain``, ``dimreduce`` (1×1 conv to ``reduced_dim`` before the classifier: the features
            Mahalanobis models), ``dropout`` (p = ``dropout_p``, kept stochastic for MC sampling) or
            ``confidence`` (a second branch with one sigmoid confidence per pixel, DeVries & Taylor 2018).
        encoder_weights: None (default: no download here) or e.g. ``"imagenet"`` when cached locally.
    """
    return SegmentationNetwork(ModelConfig(arch, encoder, num_classes, head, dropout_p, reduced_dim, encoder_weights))
