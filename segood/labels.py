"""Label semantics in one place: the OOD-mask convention and the Cityscapes class table.

Nothing else in segood hard-codes these numbers. The Cityscapes table is the official one from the
``cityscapesscripts`` package (``cityscapesscripts.helpers.labels``).
"""

import numpy as np
from cityscapesscripts.helpers.labels import labels as _CITYSCAPES_LABELS

ID = 0  #: in-distribution pixel, scored, a negative
OOD = 1  #: out-of-distribution pixel, scored, a positive
IGNORE = 255  #: never counted

_TRAIN = sorted((lab for lab in _CITYSCAPES_LABELS if 0 <= lab.trainId < 255), key=lambda lab: lab.trainId)

NUM_CLASSES = len(_TRAIN)  #: 19 Cityscapes train classes
CLASS_NAMES = tuple(lab.name for lab in _TRAIN)  #: indexed by trainId
PALETTE = np.array([lab.color for lab in _TRAIN], dtype=np.uint8)  #: (19, 3) RGB, indexed by trainId

#: Every labelId of the official table (0..33; license plate's -1 never appears in labelIds files).
OFFICIAL_LABEL_IDS = frozenset(lab.id for lab in _CITYSCAPES_LABELS if 0 <= lab.id < 256)
#: (256,) uint8 lookup: Cityscapes labelId -> trainId (255 for every id without a train class).
LABEL_ID_TO_TRAIN_ID = np.full(256, IGNORE, dtype=np.uint8)
for _lab in _CITYSCAPES_LABELS:
    if 0 <= _lab.id < 256 and 0 <= _lab.trainId < 255:
        LABEL_ID_TO_TRAIN_ID[_lab.id] = _lab.trainId


def colorize(train_ids: np.ndarray) -> np.ndarray:
    """Map trainIds of shape (H, W) to Cityscapes colours, (H, W, 3) uint8 RGB; 255 (unknown) is black."""
    lut = np.zeros((256, 3), dtype=np.uint8)
    lut[:NUM_CLASSES] = PALETTE
    return lut[np.asarray(train_ids, dtype=np.uint8)]
