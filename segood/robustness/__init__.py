"""Robustness suite: frames corrupted at five severities (corruptions), the network's calibration under them,
the OOD and segmentation metrics per corruption and severity (suite), and type-approval checks (approval)."""

from segood.robustness.corruptions import (GEOMETRIC, SEVERITIES, CorruptedSet, contact_sheet, corrupt,
                                           corruption_names, frame_seed, severity_markdown, severity_table)

__all__ = ["GEOMETRIC", "SEVERITIES", "CorruptedSet", "contact_sheet", "corrupt", "corruption_names", "frame_seed",
           "severity_markdown", "severity_table"]
