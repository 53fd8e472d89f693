"""Segmentation networks with OOD heads, their losses and checkpoints."""

from segood.models.checkpoint import load_model, read_checkpoint, save_checkpoint
from segood.models.external import ExternalModel, load_smp_weights
from segood.models.losses import confidence_loss
from segood.models.network import (ARCHS, HEADS, ModelConfig, SegmentationNetwork, SegOutput, build_model,
                                   preprocess)

__all__ = ["ARCHS", "HEADS", "ExternalModel", "ModelConfig", "SegOutput", "SegmentationNetwork", "build_model", "confidence_loss",
           "load_model", "load_smp_weights", "preprocess", "read_checkpoint", "save_checkpoint"]
