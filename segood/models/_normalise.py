"""The numba kernel of :func:`segood.models.network.preprocess` on CPU (imported on first use: numba is slow to
import)."""

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def normalise_rows(images, mean, std, plane, rows, out):
    """out[plane][rows] = (images[plane][rows] / 255 - mean[c]) / std[c] in float32, c the plane's channel, with
    ``plane`` = (image, channel): the operations and rounding of torch's ``float().div_(255).sub_(mean).div_(std)``,
    in one pass instead of four."""
    image, channel = plane
    source, target = images[image, channel], out[image, channel]
    m, s, scale = mean[channel], std[channel], np.float32(255.0)
    for row in range(rows[0], rows[1]):
        pixels, values = source[row], target[row]
        for j in range(pixels.size):
            values[j] = (np.float32(pixels[j]) / scale - m) / s
