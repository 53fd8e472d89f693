"""Data: adapters that turn datasets into images, OOD masks and Cityscapes trainIds, and converted sets."""

from segood.data.cityscapes import Cityscapes
from segood.data.common import DatasetLayoutError, LeftOut, Sample, SkipFrame, resize_sample
from segood.data.convert import ConversionError, convert, mix
from segood.data.h5 import H5SegmentationDataset, read_manifest
from segood.data.idd import IDD
from segood.data.noise import Noise
from segood.data.sun import Sun

__all__ = ["IDD", "Cityscapes", "ConversionError", "DatasetLayoutError", "H5SegmentationDataset", "LeftOut", "Noise",
           "Sample", "SkipFrame", "Sun", "convert", "mix", "read_manifest", "resize_sample"]
