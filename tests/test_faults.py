"""Unlucky and hostile input to the commands around the board: sets sharing a name, a full disk, two writers
at once, a tuning set that cannot rank, self-reported states whose counts do not add up."""

import numpy as np
import pytest

from segood.cli import main
from segood.labels import OOD


@pytest.mark.parametrize("command", [
    ["benchmark", "--track", "t", "--sets", "{a}", "{b}", "--out", "{out}/bench.json"],
    ["protocol", "--tune-sets", "{a}", "{b}", "--test-sets", "{c}", "--methods", "entropy", "--out", "{out}"],
    ["protocol", "--tune-sets", "{c}", "--test-sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
    ["export", "--sets", "{a}", "{b}", "--methods", "entropy", "--out", "{out}"],
], ids=["benchmark", "protocol tune", "protocol test", "export"])
def test_sets_sharing_a_file_name_are_refused_not_dropped(tmp_path, capsys, command):
    paths = {"a": tmp_path / "a" / "t.h5", "b": tmp_path / "b" / "t.h5", "c": tmp_path / "c.h5",
             "out": tmp_path / "out"}
    argv = [part.format(**paths) for part in command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{paths['a']} and {paths['b']} share the name 't'" in err
    assert not (tmp_path / "out").exists()


def tiny_set(path, ood=True, frames=2, side=8, seed=0):
    """A converted set of ``frames`` side x side frames; ``ood``: a 2 x 2 OOD square in each."""
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    rng = np.random.default_rng(seed)
    writer = SetWriter(path, None, {"source": "tiny", "split": "test"}, overwrite=True)
    for k in range(frames):
        mask = np.zeros((side, side), np.uint8)
        if ood:
            mask[2:4, 2:4] = OOD
        writer.append(Sample(rng.integers(0, 255, (side, side, 3), dtype=np.uint8), mask, mask, f"f/{k}"))
    writer.commit()
    return path


def test_a_tuning_set_without_ood_pixels_is_refused_by_name(tmp_path):
    from segood.evaluation.protocol import cross_source

    id_only, test = tiny_set(tmp_path / "id_only.h5", ood=False), tiny_set(tmp_path / "test.h5")
    with pytest.raises(ValueError, match=r"tuning set 'id_only' .* has 128 ID and 0 OOD pixels"):
        cross_source(None, {"id_only": id_only}, {"test": test}, ["max_softmax"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
