"""Segmentation networks with OOD heads, their losses and checkpoints; adapters of other libraries' networks."""

from segood.models.adapters import (MODEL_TYPES, LibraryModel, class_indices, list_model_types, load_library_model,
                                    register_model_type)
from segood.models.checkpoint import load_model, read_checkpoint, save_checkpoint
from segood.models.external import ExternalModel, load_smp_weights
from segood.models.hf import hf_model, load_hf
from segood.models.inference import INFERENCE_MODES, sliding_windows
from segood.models.losses import confidence_loss
from segood.models.network import (ARCHS, HEADS, ModelConfig, QueryOutput, SegmentationNetwork, SegOutput, build_model,
                                   preprocess)
from segood.models.torch_models import TORCHVISION_ARCHS, load_smp, load_torchvision, torchvision_model

__all__ = ["ARCHS", "HEADS", "INFERENCE_MODES", "MODEL_TYPES", "TORCHVISION_ARCHS", "ExternalModel", "LibraryModel",
           "ModelConfig", "QueryOutput", "SegOutput", "SegmentationNetwork", "build_model", "class_indices",
           "confidence_loss", "hf_model", "list_model_types", "load_hf", "load_library_model", "load_model",
           "load_smp", "load_smp_weights", "load_torchvision", "preprocess", "read_checkpoint", "register_model_type",
           "save_checkpoint", "sliding_windows", "torchvision_model"]
