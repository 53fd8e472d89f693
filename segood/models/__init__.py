"""Segmentation networks with OOD heads, their losses and checkpoints."""

from segood.models.checkpoint import load_model, read_checkpoint, save_checkpoint
from segood.models.losses import confidence_loss
from segood.models.network import (ARCHS, HEADS, ModelConfig, SegmentationNetwork, SegOutput, build_model,
                                   preprocess)

__all__ = ["ARCHS", "HEADS", "ModelConfig", "SegOutput", "SegmentationNetwork", "build_model", "confidence_loss",
           "load_model", "preprocess", "read_checkpoint", "save_checkpoint"]
