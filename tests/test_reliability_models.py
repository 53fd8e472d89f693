"""Checkpoints and training runs: unreadable checkpoints and states name the file, a resume refuses changed
settings, and a checkpoint never makes segood reach the network."""

import io
import json
import os
import pickle
import socket

import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data import Sample
from segood.data.h5 import SetWriter
from segood.evaluation import evaluate
from segood.metrics import PixelOODAccumulator
from segood.models import build_model, load_model, load_smp_weights, read_checkpoint, save_checkpoint
from segood.models.network import create_smp
from segood.models.train import TrainConfig, train


# 8. Unreadable checkpoints and states: one clear line naming the file, never a traceback.
def test_unreadable_checkpoints_and_states_name_the_file(small_set, tmp_path, capsys):
    model = build_model("pspnet", "resnet18")
    save_checkpoint(tmp_path / "good.pt", model)
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "half.pt").write_bytes(data[: len(data) // 2])
    for name in ("empty.pt", "half.pt"):
        with pytest.raises(ValueError, match=f"{name} is not a readable checkpoint: empty, truncated or corrupt"):
            read_checkpoint(tmp_path / name)
    (tmp_path / "set.pt").write_bytes(small_set.read_bytes())  # an HDF5 file: not "pickled objects"
    with pytest.raises(ValueError, match="set.pt is not a readable checkpoint: not a file torch.save wrote"):
        read_checkpoint(tmp_path / "set.pt")
    (tmp_path / "folder.pt").mkdir()
    with pytest.raises(ValueError, match="folder.pt is a directory, not a checkpoint file"):
        read_checkpoint(tmp_path / "folder.pt")
    torch.save({"weight": socket.AddressFamily.AF_INET}, tmp_path / "object.pt")  # torch.save's zip, an object in it
    with pytest.raises(ValueError, match="object.pt: the checkpoint holds pickled Python objects"):
        read_checkpoint(tmp_path / "object.pt")

    class Payload:
        def __reduce__(self):
            return (print, ("this would run",))

    class Blocked:
        def __reduce__(self):
            return (os.getcwd, ())

    torch.save({"weight": Blocked()}, tmp_path / "blocked.pt")  # torch.save's zip; "unsupported GLOBAL posix.getcwd
    with pytest.raises(ValueError, match="blocked.pt: the checkpoint holds pickled Python objects"):  # whose module
        read_checkpoint(tmp_path / "blocked.pt")  # posix is blocked"

    (tmp_path / "raw.pt").write_bytes(pickle.dumps({"weight": Payload()}))
    with pytest.raises(ValueError, match="raw.pt: the state dict holds pickled Python objects"):
        load_smp_weights("pspnet", "resnet18", tmp_path / "raw.pt")
    assert main(["evaluate", "--arch", "pspnet", "--encoder", "resnet18", "--weights", str(tmp_path / "raw.pt"),
                 "--sets", str(small_set), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "never unpickles" in err and "weights_only" not in err and "Traceback" not in err
    with pytest.raises(ValueError, match="good.pt is a segood checkpoint .*: pass it as --checkpoint"):
        load_smp_weights("pspnet", "resnet18", tmp_path / "good.pt")
    weights = create_smp("pspnet", "resnet18", 19).state_dict()
    weights.pop("encoder.conv1.weight")
    torch.save({**weights, "extra.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other.pt does not fit smp pspnet with resnet18 and 19 classes: Missing "
                                         r"key\(s\) in state_dict: \"encoder.conv1.weight\". Unexpected key\(s\) in "
                                         r"state_dict: \"extra.weight\"."):
        load_smp_weights("pspnet", "resnet18", tmp_path / "other.pt")

    state = read_checkpoint(tmp_path / "good.pt")
    state["config"]["colour"] = "blue"
    torch.save(state, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"odd.pt: the model config has unknown keys \['colour'\]"):
        load_model(tmp_path / "odd.pt")

    run = tmp_path / "run"
    evaluate(model.eval(), [small_set], ["max_softmax"], run, progress=False, figures=False)
    good_state = (run / "state.npz").read_bytes()
    (run / "state.npz").write_bytes(good_state[: len(good_state) // 2])
    assert main(["report", str(run)]) == 2
    assert "state.npz is not a readable evaluation state: empty, truncated" in capsys.readouterr().err
    with np.load(io.BytesIO(good_state)) as arrays:
        without_meta = {k: arrays[k] for k in arrays.files if k != "meta"}
    np.savez(run / "state.npz", **without_meta)
    assert main(["report", str(run)]) == 2
    assert "is not a complete evaluation state: it lacks 'meta'" in capsys.readouterr().err
    huge = PixelOODAccumulator().state_dict()
    huge["num_thresholds"] = np.array(1 << 40)
    np.savez(tmp_path / "huge.npz", **huge)
    assert main(["metrics", str(tmp_path / "huge.npz")]) == 2
    assert "'hist' must be integers of shape (2, 1099511627776)" in capsys.readouterr().err


# 11. --resume refuses another configuration, naming the keys.
def test_resume_refuses_changed_settings(tmp_path):
    from segood.data.synthetic import scene_batch

    images, semantic, ood = scene_batch(0, 8, 64, 128)
    writer = SetWriter(tmp_path / "train.h5", (64, 128), {"source": "synthetic", "split": "train"})
    for k in range(len(images)):
        writer.append(Sample(images[k], ood[k], semantic[k], f"scene/{k}"))
    writer.commit()

    def config(**kw):
        return TrainConfig(train_set=str(tmp_path / "train.h5"), out_dir=str(tmp_path / "run"), arch="pspnet",
                           encoder="resnet18", epochs=2, batch_size=4, crop=[64, 128], **kw)

    train(config(lr=0.01), progress=False, stop_after=1)
    with pytest.raises(ValueError, match=r"other settings than .*last.pt.*lr: 0.01 -> 0.02, seed: 0 -> 1"):
        train(config(lr=0.02, seed=1), resume=True, progress=False)
    with pytest.raises(ValueError, match=r"batch_size: 4 -> 2"):
        train(replace_batch(config(lr=0.01), 2), resume=True, progress=False)
    log = train(config(lr=0.01, workers=0), resume=True, progress=False)  # the same settings resume
    assert [row["epoch"] for row in log] == [1, 2]
    (tmp_path / "run" / "last.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="last.pt is not a readable checkpoint"):
        train(config(lr=0.01), resume=True, progress=False)


def replace_batch(config, batch_size):
    from dataclasses import replace

    return replace(config, batch_size=batch_size)


# 12. A checkpoint's encoder_weights never makes segood fetch what the file holds.
def test_checkpoints_never_fetch_encoder_weights(tmp_path, monkeypatch):
    model = build_model("pspnet", "resnet18")
    save_checkpoint(tmp_path / "m.pt", model)
    state = read_checkpoint(tmp_path / "m.pt")
    state["config"]["encoder_weights"] = "imagenet"
    torch.save(state, tmp_path / "m.pt")

    def no_network(*args, **kwargs):
        raise AssertionError("segood tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    loaded, _ = load_model(tmp_path / "m.pt")
    assert loaded.config.encoder_weights == "imagenet"
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


# A checkpoint's outlier-exposure record is plain JSON, checked when the checkpoint is read: it is copied into
# run.json and its object_sources are compared with the test sets'.
def test_outlier_exposure_records_hold_plain_json_values_only(small_set, tmp_path, capsys):
    model = build_model("pspnet", "resnet18")
    looped = ["sun2012"]
    looped.append(looped)
    records = {  # file: (record, what the error says after "<file>: the checkpoint's ")
        "int_sources.pt": ({"object_sources": 5}, r"outlier_exposure\['object_sources'\] is 5; expected a list"),
        "int_source.pt": ({"object_sources": ["sun2012", 3]}, r"outlier_exposure\['object_sources'\] is "),
        "tensor.pt": ({"object_sources": ["sun2012"], "w": torch.tensor(0.5)}, "outlier_exposure record is not a"),
        "deep_tensor.pt": ({"margins": [1.0, {"m": torch.ones(2)}]}, "outlier_exposure record is not a"),
        "int_key.pt": ({"parent": {1: "a"}}, "outlier_exposure record is not a"),
        "looped.pt": ({"objects": looped}, "outlier_exposure record is not a"),
        "list.pt": (["sun2012"], "outlier_exposure record is not a dict of plain JSON values")}
    for name, (record, message) in records.items():
        save_checkpoint(tmp_path / name, model, outlier_exposure=record)
        with pytest.raises(ValueError, match=f"{name}: the checkpoint's {message}"):
            read_checkpoint(tmp_path / name)
        with pytest.raises(ValueError, match=f"{name}: the checkpoint's {message}"):
            load_model(tmp_path / name)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "tensor.pt"), "--sets", str(small_set),
                 "--methods", "max_softmax", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "tensor.pt: the checkpoint's outlier_exposure record is not a dict" in err and "Traceback" not in err

    shared = ["sun2012"]  # one list twice is still plain JSON
    record = {"object_sources": shared, "objects": shared, "weight": 0.5, "margins": None, "parent": {"n": [1, True]}}
    save_checkpoint(tmp_path / "plain.pt", model, outlier_exposure=record)
    loaded, _ = load_model(tmp_path / "plain.pt")
    assert loaded.outlier_exposure == record
    save_checkpoint(tmp_path / "none.pt", model)
    assert load_model(tmp_path / "none.pt")[0].outlier_exposure is None
    assert main(["evaluate", "--checkpoint", str(tmp_path / "plain.pt"), "--sets", str(small_set),
                 "--methods", "max_softmax", "--out", str(tmp_path / "good"), "--quiet"]) == 0
    run = json.loads((tmp_path / "good" / "run.json").read_text())
    assert run["model"]["outlier_exposure"] == {**record, "same_source_sets": []}
