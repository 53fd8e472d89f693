"""What a segmentation network predicts: classes from logits."""

import torch

# Elements of (N, C, rows, W) logits per band on CPU: 2 MiB of float32, so that a band's temporaries stay in
# cache and are reused, instead of allocating (and page-faulting) full-size ones. Measured best of 2^16..2^21.
_BAND_ELEMENTS = 1 << 19


def bands(logits):
    """Slices of the rows (dimension -2) of (..., H, W) logits to work on one at a time: all at once on a GPU."""
    h = logits.shape[-2]
    rows = max(h, 1) if logits.is_cuda or logits.numel() == 0 else max(1, _BAND_ELEMENTS // (logits.numel() // h))
    return [slice(start, start + rows) for start in range(0, h, rows)]


@torch.no_grad()
def predicted_classes(logits: torch.Tensor, step: int = 1) -> torch.Tensor:
    """argmax over classes of (N, C, H, W) logits (the first of equal maxima, as ``torch.argmax``; a pixel with
    a NaN logit gets class C - 1), int64; with ``step``, of every step-th pixel each way only (as of
    ``logits[..., ::step, ::step]``).

    On CPU (float32, float64) a numba kernel keeps a running maximum per pixel, one pass over the classes, in
    row bands across torch's threads: 2.1-2.4x faster than :func:`classes_by_rank` and 13-16x faster than
    ``argmax``, whose index reductions over a non-innermost dimension do not vectorise. Every step-th pixel is
    read where it is: no subsampled copy of the logits, whose fresh memory costs about as much as the argmax.
    """
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or not logits.numel():
        return classes_by_rank(logits[..., ::step, ::step])
    from segood._threads import run_chunks
    from segood.models._argmax import argmax_every, argmax_rows

    n, c = logits.shape[:2]
    h, w = (-(-size // step) for size in logits.shape[2:])
    classes = torch.empty(n, h, w, dtype=torch.int64)
    # (an image of an expanded batch is contiguous; every step-th pixel is read from any layout where it is)
    images = [(logits[i].detach().contiguous() if step == 1 else logits[i].detach()).numpy() for i in range(n)]
    out = classes.numpy()
    rows = max(1, min(h, _BAND_ELEMENTS // (c * w)))
    chunks = [(image, (start, min(h, start + rows))) for image in range(n) for start in range(0, h, rows)]

    def work(taken):
        for k in taken:
            image, band = chunks[k]
            if step == 1:
                argmax_rows(images[image], band, out[image])
            else:
                argmax_every(images[image], step, band, out[image])

    run_chunks(work, len(chunks), torch.get_num_threads())
    return classes


def classes_by_rank(logits):
    """:func:`predicted_classes` in torch operations (any device and dtype), computed as
    C - max_c [z_c = max z] (C - c), band by band: on CPU about 2x faster than ``max(dim=1)``."""
    n, c, h, w = logits.shape
    classes = torch.empty(n, h, w, dtype=torch.int64, device=logits.device)
    small = torch.uint8 if c < 256 else torch.int32  # the narrowest type that holds C
    rank = torch.arange(c, 0, -1, dtype=small, device=logits.device).view(1, c, 1, 1)  # C - c
    for rows in bands(logits):
        z = logits[:, :, rows]
        first = ((z == z.amax(dim=1, keepdim=True)) * rank).amax(dim=1)
        torch.sub(c, first.clamp_(min=1), out=classes[:, rows])  # clamp: a NaN pixel (no max) gets C - 1
    return classes
