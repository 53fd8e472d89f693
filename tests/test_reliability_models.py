"""Checkpoints and training runs: unreadable checkpoints and states name the file, a resume refuses changed
settings, and a checkpoint never makes segood reach the network."""

import io
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

    class Payload:
        def __reduce__(self):
            return (print, ("this would run",))

    (tmp_path / "raw.pt").write_bytes(pickle.dumps({"weight": Payload()}))
    with pytest.raises(ValueError, match="raw.pt: the state dict holds pickled Python objects"):
        load_smp_weights("pspnet", "resnet18", tmp_path / "raw.pt")
    assert main(["evaluate", "--arch", "pspnet", "--encoder", "resnet18", "--weights", str(tmp_path / "raw.pt"),
                 "--sets", str(small_set), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "never unpickles" in err and "weights_only" not in err and "Traceback" not in err

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
