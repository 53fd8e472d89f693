"""How a network meets a frame larger than it was trained on: whole, resize-and-back, or a sliding window.

Each mode is a pure function of a ``run(x) -> SegOutput`` callable and the frame, so every adapter
(:mod:`segood.models.adapters`) shares one implementation:

- ``whole``: the frame as it is (padded to the network's multiple by the scorer).
- ``resize``: the frame resized bilinearly to the network's size, its logits resized back to the frame
  (the image processors' resize; detectron2's ``sem_seg_postprocess``).
- ``slide``: windows of ``crop`` = (h, w) every ``stride`` = (sh, sw), the last row and column of windows
  aligned to the frame's border; each pixel's logits are the mean over the windows that cover it (mmseg's
  ``slide_inference``). Per-query outputs do not survive averaging (each window has its own queries), so a
  sliding network serves none.
"""

import torch.nn.functional as F

from segood.models.network import SegOutput

INFERENCE_MODES = ("whole", "resize", "slide")


def check_inference(mode, *, size=None, crop=None, stride=None):
    """Refuse an unknown mode or options that do not fit it (ValueError that says what to give)."""
    if mode not in INFERENCE_MODES:
        raise ValueError(f"unknown inference mode {mode!r}; choose one of {INFERENCE_MODES}")
    if mode == "slide":
        if crop is None:
            raise ValueError("sliding-window inference needs crop=(h, w) (--window H W), e.g. the training crop")
        stride = crop if stride is None else stride
        for name, pair in (("crop", crop), ("stride", stride)):
            if not _two_sides(pair):
                raise ValueError(f"{name} must be two positive sides (h, w), got {pair!r}")
        if any(int(s) > int(c) for s, c in zip(stride, crop)):
            raise ValueError(f"a stride {tuple(stride)} larger than the crop {tuple(crop)} leaves pixels no window "
                             "covers: choose stride <= crop")
    elif crop is not None or stride is not None:
        raise ValueError(f"crop and stride (--window, --stride) set the sliding window; inference mode {mode!r} "
                         "takes none: drop them, or choose mode='slide' (--inference slide)")
    if size is not None and mode != "resize":
        raise ValueError(f"size=(H, W) (--infer-size H W) is the resize mode's network size; inference mode {mode!r} "
                         "takes none: drop it, or choose mode='resize' (--inference resize)")
    if size is not None and not _two_sides(size):
        raise ValueError(f"size=(H, W) (--infer-size H W) is the resize mode's network size, two positive sides; "
                         f"got {size!r}")


def _two_sides(pair):
    """Whether ``pair`` is (h, w), two positive integers."""
    try:
        return len(pair) == 2 and min(int(v) for v in pair) >= 1
    except (TypeError, ValueError):
        return False


def sliding_windows(height, width, crop, stride):
    """[(top, bottom, left, right)] of the windows over a (height, width) frame: starts every stride, the last
    window of each row and column moved back to end at the border, a window no larger than the frame."""
    def starts(length, size, step):
        count = max(length - size + step - 1, 0) // step + 1
        return [max(min(k * step + size, length) - size, 0) for k in range(count)]

    ch, cw = crop
    return [(top, min(top + ch, height), left, min(left + cw, width))
            for top in starts(height, ch, stride[0]) for left in starts(width, cw, stride[1])]


def slide(run, x, *, crop, stride=None, align_corners=False):
    """(N, C, H, W) logits of ``x`` (N, 3, H, W): the mean over sliding windows of ``run(window).logits``, each
    resized to its window's size first (bilinear, ``align_corners``)."""
    stride = tuple(crop) if stride is None else tuple(stride)
    height, width = x.shape[-2:]
    total = count = None
    for top, bottom, left, right in sliding_windows(height, width, tuple(crop), stride):
        logits = run(x[..., top:bottom, left:right]).logits
        if tuple(logits.shape[-2:]) != (bottom - top, right - left):
            logits = F.interpolate(logits, size=(bottom - top, right - left), mode="bilinear",
                                   align_corners=align_corners)
        if total is None:
            total = logits.new_zeros(*logits.shape[:2], height, width)
            count = logits.new_zeros(1, 1, height, width)
        total[..., top:bottom, left:right] += logits
        count[..., top:bottom, left:right] += 1
    return total / count


def resize_and_back(run, x, size, *, align_corners=False):
    """``run`` on ``x`` resized bilinearly to ``size`` = (h, w); its logits resized back to x's size. Query
    outputs keep the network's resolution: their masks cover the whole frame either way."""
    frame = tuple(x.shape[-2:])
    size = tuple(int(v) for v in size)
    inner = x if size == frame else F.interpolate(x, size=size, mode="bilinear", align_corners=False,
                                                  antialias=size[0] < frame[0] or size[1] < frame[1])
    out = run(inner)
    logits = out.logits
    if tuple(logits.shape[-2:]) != frame:
        logits = F.interpolate(logits, size=frame, mode="bilinear", align_corners=align_corners)
    return SegOutput(logits, out.features, out.confidence, out.queries)


def processor_size(height, width, size, *, multiple=1):
    """The (h, w) an image processor resizes a (height, width) frame to: ``size`` a dict (or an object with
    these attributes) of ``height``/``width`` (fixed), or ``shortest_edge`` (with an optional ``longest_edge``
    cap: the short side scaled to it, aspect kept, the long side no longer than the cap; sides truncated as
    transformers truncates them), or ``longest_edge`` alone; rounded up to ``multiple``."""
    get = size_settings(size).get
    if get("height") and get("width"):
        h, w = int(get("height")), int(get("width"))
    elif get("shortest_edge") or get("longest_edge"):  # as transformers' get_resize_output_image_size: truncated
        short, long_ = min(height, width), max(height, width)
        cap = get("longest_edge")
        if get("shortest_edge"):
            new_short, new_long = int(get("shortest_edge")), int(get("shortest_edge") * long_ / short)
        else:
            new_short, new_long = int(cap * short / long_), int(cap)
        if cap and new_long > cap:
            new_short, new_long = int(cap * new_short / new_long), int(cap)
        h, w = (new_short, new_long) if height <= width else (new_long, new_short)
    else:
        raise ValueError(f"the image processor's size {size!r} names no height/width, shortest_edge or "
                         "longest_edge: give the network's size yourself (size=(H, W), --infer-size H W)")
    return max(multiple, -(-h // multiple) * multiple), max(multiple, -(-w // multiple) * multiple)


def size_settings(size):
    """The settings of an image processor's ``size`` (a dict, or an object with these attributes) that
    :func:`processor_size` reads: height, width, shortest_edge, longest_edge, those given."""
    get = size.get if isinstance(size, dict) else (lambda key: getattr(size, key, None))
    return {k: get(k) for k in ("height", "width", "shortest_edge", "longest_edge") if get(k) is not None}


def pad_to(x, multiple):
    """``x`` (N, C, H, W) zero-padded at the bottom and right to sides divisible by ``multiple``."""
    pad_h, pad_w = -x.shape[-2] % multiple, -x.shape[-1] % multiple
    return F.pad(x, (0, pad_w, 0, pad_h)) if pad_h or pad_w else x


def run_padded(run, x, multiple, *, align_corners=False):
    """``run`` on ``x`` zero-padded to ``multiple``, its logits resized to the padded size and cropped back to
    x's (the sliding window's border windows); query outputs dropped (they would cover the padding)."""
    padded = pad_to(x, multiple)
    out = run(padded)
    logits = out.logits
    if tuple(logits.shape[-2:]) != tuple(padded.shape[-2:]):
        logits = F.interpolate(logits, size=padded.shape[-2:], mode="bilinear", align_corners=align_corners)
    return SegOutput(logits[..., : x.shape[-2], : x.shape[-1]], out.features, out.confidence)

