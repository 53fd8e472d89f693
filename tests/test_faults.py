"""Unlucky and hostile input to the commands around the board: sets sharing a name, a full disk, two writers
at once, a tuning set that cannot rank, self-reported states whose counts do not add up."""

import pytest

from segood.cli import main


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
