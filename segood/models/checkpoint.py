"""Checkpoints: a plain dict (format tag, version, model config, state dicts) loaded with weights_only=True."""

import json
import pickle
import zipfile
from dataclasses import fields, replace
from pathlib import Path

import torch

from segood.io import atomic_output
from segood.models.network import ModelConfig, SegmentationNetwork
from segood.version import __version__

FORMAT = "segood.checkpoint/1"


def save_checkpoint(path, model, **extra):
    """Write atomically (temporary file + rename). ``extra``: plain values / state dicts (optimizer, epoch...)."""
    state = {"format": FORMAT, "segood_version": __version__, "config": model.config.to_dict(),
             "model": model.state_dict(), **extra}
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def safe_load(path, what="checkpoint", map_location="cpu"):
    """``torch.load(path, weights_only=True)``: tensors and plain values only, never arbitrary pickled objects
    (a pickle can run code). Every failure is a ValueError that names the file and what is wrong with it."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a {what} file") from None
    except pickle.UnpicklingError as err:
        # a pickle with objects beyond tensors and plain values: in torch.save's zip, or a bare pickle (PROTO opcode)
        with path.open("rb") as f:
            first = f.read(1)
        if "unsupported global" in str(err).lower() or first == b"\x80" or zipfile.is_zipfile(path):
            raise ValueError(f"refusing to load {path}: the {what} holds pickled Python objects, not only tensors "
                             "and plain values, and segood never unpickles those (a pickle can run code); save a "
                             "plain state dict instead") from None
        raise ValueError(f"{path} is not a readable {what}: not a file torch.save wrote (an HDF5 set, an HTML page "
                         "or another format?)") from None
    except (EOFError, RuntimeError, KeyError, IndexError, ValueError, TypeError, AttributeError, OverflowError,
            UnicodeDecodeError, zipfile.BadZipFile, OSError) as err:
        size = path.stat().st_size if path.is_file() else 0
        raise ValueError(f"{path} is not a readable {what}: empty, truncated or corrupt ({size} bytes; "
                         f"{type(err).__name__}); write it again (a training run resumes from the previous epoch's "
                         "checkpoint only if that one is intact)") from None


def mismatch(err, limit=400):
    """What ``load_state_dict``'s RuntimeError says is missing, unexpected or misshapen, in one line of at most
    ``limit`` characters (its lines after the first)."""
    keys = " ".join(line.strip() for line in str(err).splitlines()[1:]) or str(err)
    return keys[:limit] + ("..." if len(keys) > limit else "")


def read_checkpoint(path, map_location="cpu"):
    """The checkpoint dict, read without unpickling arbitrary objects; a clear error for anything else."""
    state = safe_load(path, "checkpoint", map_location)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        plain = isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values())
        raise ValueError(f"{path} is not a segood checkpoint (expected format {FORMAT!r})" + (
            ": it is a plain state dict, which --arch, --encoder and --weights (an smp network's) or --model-type "
            "and --model (another library's) read" if plain else ""))
    for key in ("config", "model"):
        if not isinstance(state.get(key), dict):
            raise ValueError(f"{path}: the checkpoint has no {key!r} dictionary; it is damaged or not segood's")
    check_outlier_exposure(state.get("outlier_exposure"), path)
    return state


def check_outlier_exposure(record, path="the checkpoint"):
    """A checkpoint's ``outlier_exposure`` record (None for a network trained without): a dict of plain JSON values
    whose ``object_sources``, where present, is a list of str. Anything else is a ValueError naming ``path``: the
    record is copied into run.json (a tensor could not be written) and its sources are compared with the test
    sets'."""
    if record is None:
        return
    try:  # (JSON turns int keys into str and tuples into lists: such a record does not come back equal)
        plain = isinstance(record, dict) and json.loads(json.dumps(record)) == record
    except (TypeError, ValueError):  # a tensor or another object; a record that holds itself
        plain = False
    if not plain:
        raise ValueError(f"{path}: the checkpoint's outlier_exposure record is not a dict of plain JSON values (str, "
                         f"int, float, bool, None, lists and str-keyed dicts of them): {record!r:.100}; it is "
                         "damaged or not segood's (segood train writes the record)")
    sources = record.get("object_sources", [])
    if not isinstance(sources, list) or not all(isinstance(source, str) for source in sources):
        raise ValueError(f"{path}: the checkpoint's outlier_exposure['object_sources'] is {sources!r:.80}; expected a "
                         "list of source names (str) such as ['sun2012']; it is damaged or not segood's")


def model_config(config, path="the checkpoint"):
    """A :class:`ModelConfig` from a checkpoint's config dict; unknown or missing keys are a ValueError."""
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(config) - known)
    missing = sorted({"arch", "encoder", "num_classes", "head"} - set(config))
    if unknown or missing:
        raise ValueError(f"{path}: the model config " + (f"has unknown keys {unknown}" if unknown else "")
                         + (" and " if unknown and missing else "") + (f"lacks {missing}" if missing else "")
                         + f" (a ModelConfig has {sorted(known)}); was it written by another segood version?")
    types = {"arch": str, "encoder": str, "num_classes": int, "head": str, "dropout_p": (int, float),
             "reduced_dim": int, "encoder_weights": (str, type(None))}
    wrong = [k for k, v in config.items() if not isinstance(v, types[k]) or isinstance(v, bool)]
    if wrong:
        raise ValueError(f"{path}: the model config has values of the wrong type: "
                         + ", ".join(f"{k}={config[k]!r}" for k in wrong))
    return ModelConfig(**config)


def load_model(path, map_location="cpu"):
    """(model in eval mode, checkpoint dict). The weights come from the file: the encoder is built without
    fetching pretrained weights whatever ``encoder_weights`` the config records (kept in ``model.config``). A
    network fine-tuned with outlier exposure carries the checkpoint's record as ``model.outlier_exposure`` (None
    for others), which an evaluation reads to flag test sets of the same object source."""
    state = read_checkpoint(path, map_location)
    config = model_config(state["config"], path)
    model = SegmentationNetwork(replace(config, encoder_weights=None))
    model.config = config
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise ValueError(f"{path}: the weights do not fit the network its config describes ({config.arch}, "
                         f"{config.encoder}, head {config.head!r}): {str(err).splitlines()[0]}") from None
    model.outlier_exposure = state.get("outlier_exposure")  # (checked by read_checkpoint: a dict of JSON values)
    return model.eval(), state
