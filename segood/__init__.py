"""segood: pixel-level out-of-distribution detection benchmark for semantic segmentation."""

__version__ = "0.1.0"
