"""Robustness suite: frames corrupted at five severities (corruptions: segood's own family and the standard
ImageNet-C / Cityscapes-C one), the network's calibration under them, the OOD and segmentation metrics per
corruption and severity (suite), and type-approval checks (approval)."""

from segood.robustness.corruptions import (FAMILIES, GEOMETRIC, SEVERITIES, STANDARD_PREFIX, CorruptedSet,
                                           contact_sheet, corrupt, corruption_names, frame_seed, resolve_corruptions,
                                           severity_markdown, severity_table)
from segood.robustness.standard import STANDARD_SIZES, standard_table

__all__ = ["FAMILIES", "GEOMETRIC", "SEVERITIES", "STANDARD_PREFIX", "STANDARD_SIZES", "CorruptedSet", "contact_sheet",
           "corrupt", "corruption_names", "frame_seed", "resolve_corruptions", "severity_markdown", "severity_table",
           "standard_table"]
