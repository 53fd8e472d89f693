"""Checkpoints: a plain dict (format tag, version, model config, state dicts) loaded with weights_only=True."""

import pickle

import torch

import segood
from segood.io import atomic_output
from segood.models.network import ModelConfig, SegmentationNetwork

FORMAT = "segood.checkpoint/1"


def save_checkpoint(path, model, **extra):
    """Write atomically (temporary file + rename). ``extra``: plain values / state dicts (optimizer, epoch...)."""
    state = {"format": FORMAT, "segood_version": segood.__version__, "config": model.config.to_dict(),
             "model": model.state_dict(), **extra}
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def read_checkpoint(path, map_location="cpu"):
    """The checkpoint dict, read without unpickling arbitrary objects; a clear error for anything else."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as err:
        raise ValueError(f"refusing to load {path}: it needs unpickling arbitrary objects or is corrupt "
                         f"({type(err).__name__}); segood checkpoints hold only tensors and plain values") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a segood checkpoint (expected format {FORMAT!r})")
    return state


def load_model(path, map_location="cpu"):
    """(model in eval mode, checkpoint dict)."""
    state = read_checkpoint(path, map_location)
    model = SegmentationNetwork(ModelConfig(**state["config"]))
    model.load_state_dict(state["model"])
    return model.eval(), state
