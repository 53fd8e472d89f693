"""The options objects of segood score, protocol and attack: a bad value is an error naming the option when the
object is made, so the Python functions and the command line refuse it before anything is read, run or written."""

import dataclasses
import re

import pytest

from segood.attack.options import AttackOptions
from segood.attack.run import attack
from segood.attack.search import SearchConfig
from segood.cli import main
from segood.evaluation import evaluate_score_maps
from segood.evaluation.options import GRIDS, EvaluateOptions, ProtocolOptions, ScoreOptions
from segood.evaluation.protocol import cross_source

BAD = {
    "score: empty name": (ScoreOptions, {"name": ""}, ValueError, "name must be a non-empty string"),
    "score: range upside down": (ScoreOptions, {"score_range": (1.0, 0.0)}, ValueError,
                                 r"score_range must be two finite numbers \(low, high\) with low < high"),
    "score: range of one number": (ScoreOptions, {"score_range": (1.0,)}, ValueError, "score_range must be two"),
    "score: infinite range": (ScoreOptions, {"score_range": (0, float("inf"))}, ValueError, "score_range must be"),
    "score: clip off the linear grid": (ScoreOptions, {"clip": True}, ValueError,
                                        r"clip has no meaning on the float grid.*num_thresholds"),
    "score: clip on the exact grid": (ScoreOptions, {"clip": True, "grid": "exact"}, ValueError,
                                      "clip has no meaning on the exact grid"),
    "score: options of two grids": (ScoreOptions, {"num_thresholds": 400, "mantissa_bits": 8}, ValueError,
                                    "choose one grid: mantissa_bits belong to another grid than the linear one"),
    "score: max_pixels on the linear grid": (ScoreOptions, {"grid": "linear", "max_pixels": 1000}, ValueError,
                                             "max_pixels belong to another grid than the linear one"),
    "score: unknown grid": (ScoreOptions, {"grid": "log"}, ValueError, "unknown grid kind 'log'"),
    "score: one threshold": (ScoreOptions, {"num_thresholds": 1}, ValueError, "num_thresholds must be at least 2"),
    "score: verify not a flag": (ScoreOptions, {"verify": "no"}, TypeError, "verify must be True or False"),
    "protocol: unknown rule": (ProtocolOptions, {"rule": "accuracy"}, ValueError,
                               "unknown threshold rule 'accuracy'; choose one of tpr95"),
    "protocol: unknown metric": (ProtocolOptions, {"metric": "f1"}, ValueError, "unknown metric 'f1'; choose one of"),
    "protocol: empty grid": (ProtocolOptions, {"grids": {"odin": {"temperature": []}}}, ValueError,
                             r"grids must be \{method: \{param: \[values\]\}\}"),
    "protocol: commit_on": (ProtocolOptions, {"commit_on": "a"}, ValueError,
                            "commits thresholds on each tuning set in turn: drop commit_on 'a'"),
    "protocol: batch size": (ProtocolOptions, {"batch_size": 0}, ValueError, "batch_size must be a positive integer"),
    "protocol: evaluation not options": (ProtocolOptions, {"evaluation": {"batch_size": 2}}, TypeError,
                                         "evaluation must be an EvaluateOptions"),
    "attack: unknown blend": (AttackOptions, {"blend": "poisson"}, ValueError,
                              "blend .--blend. must be one of none, feather, seamless"),
    "attack: height ratio": (AttackOptions, {"height_ratio": (0.6, 0.1)}, ValueError, "0 < LOW <= HIGH"),
    "attack: no frames": (AttackOptions, {"max_frames": 0}, ValueError,
                          "max_frames must be a positive integer or None"),
    "attack: config not a SearchConfig": (AttackOptions, {"config": {"budget": 5}}, TypeError,
                                          "config must be a segood.attack.search.SearchConfig"),
    "attack: resume not a flag": (AttackOptions, {"resume": 1}, TypeError, "resume must be True or False"),
    "attack: no objects": (AttackOptions, {"objects": None}, TypeError, "objects must be a path or a name"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_value_is_refused_by_name(case):
    cls, keywords, error, message = BAD[case]
    with pytest.raises(error, match=message):
        cls.of(**keywords)


@pytest.mark.parametrize("keywords, message", [
    ({"budget": 0}, "budget .--budget. must be a positive integer"), ({"budget": 2.5}, "budget .--budget."),
    ({"temperature": 0.0}, "temperature .--temperature. must be a positive finite number"),
    ({"temperature": float("nan")}, "temperature"), ({"step": 1.5}, r"step .--step. must be a number with 0 < step"),
    ({"seed": -1}, "seed .--seed. must be a non-negative integer")])
def test_a_bad_search_config_is_refused_by_name(keywords, message):
    with pytest.raises(ValueError, match=message):
        SearchConfig(**keywords)


def test_options_and_keywords_combine_and_replace_checks_alike():
    score = ScoreOptions(num_thresholds=400)  # the linear grid without a range: the score file's
    assert score.grid == {"kind": "linear", "num_thresholds": 400, "score_range": None}
    assert ScoreOptions.of(score, score_range=(0, 2)).grid["score_range"] == [0.0, 2.0]
    assert ScoreOptions(score_range=(0, 2)).grid == {"kind": "float", "mantissa_bits": 10}  # a check, not a grid
    with pytest.raises(ValueError, match="clip has no meaning on the float grid"):
        dataclasses.replace(ScoreOptions(), clip=True)
    protocol = ProtocolOptions.of(rule="f1", batch_size=4)  # an evaluation field goes into its evaluation
    assert (protocol.rule, protocol.evaluation.batch_size, protocol.evaluation.figures) == ("f1", 4, False)
    assert ProtocolOptions.of(protocol, device="cpu").evaluation.batch_size == 4
    assert ProtocolOptions().grids == GRIDS and ProtocolOptions().evaluation.bootstrap is None
    given = ProtocolOptions.of(evaluation=EvaluateOptions(batch_size=3), save_every=5).evaluation
    assert (given.batch_size, given.save_every) == (3, 5)
    assert AttackOptions.of(AttackOptions(max_frames=2), resume=True) == AttackOptions(max_frames=2, resume=True)
    assert AttackOptions(height_ratio=[0.2, 0.5]).height_ratio == (0.2, 0.5)
    with pytest.raises(TypeError, match="options must be an instance of AttackOptions or None, got ScoreOptions"):
        AttackOptions.of(ScoreOptions())


def test_the_functions_refuse_bad_options_before_reading_anything(tmp_path):
    """Every path here is missing: the option is what is reported, and nothing is written."""
    missing = tmp_path / "missing.h5"
    with pytest.raises(ValueError, match="clip has no meaning"):
        evaluate_score_maps(missing, missing, tmp_path / "score", clip=True)
    with pytest.raises(ValueError, match="unknown threshold rule"):
        cross_source(None, {"tune": missing}, {"test": missing}, ["entropy"], tmp_path / "protocol", rule="best")
    with pytest.raises(ValueError, match="max_frames must be a positive integer"):
        attack([f"energy={tmp_path / 'net.pt'}"], missing, tmp_path / "attack", max_frames=0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["score", "--scores", "S.h5", "--data", "D.h5", "--out", "OUT", "--clip"], "clip has no meaning"),
    (["score", "--scores", "S.h5", "--data", "D.h5", "--out", "OUT", "--score-range", "1", "0"],
     "score_range must be two finite numbers"),
    (["protocol", "--checkpoint", "M.pt", "--tune-sets", "A.h5", "--test-sets", "B.h5", "--methods", "entropy",
      "--out", "OUT", "--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
    (["attack", "--target", "energy=M.pt", "--frames", "F.h5", "--out", "OUT", "--height-ratio", "0.5", "0.1"],
     "0 < LOW <= HIGH"),
    (["attack", "--target", "energy=M.pt", "--frames", "F.h5", "--out", "OUT", "--temperature", "0"],
     "argument --temperature: must be a finite number above 0, got 0"),
    (["attack", "--target", "energy=M.pt", "--frames", "F.h5", "--out", "OUT", "--budget", "0"],
     "argument --budget: must be a positive integer, got 0"),
    (["attack", "--target", "energy=M.pt", "--frames", "F.h5", "--out", "OUT", "--max-frames", "-1"],
     "argument --max-frames: must be a positive integer, got -1")])
def test_the_command_line_refuses_bad_options_before_reading_anything(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as stop:  # (argparse's own usage error: the usage, then one line)
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"segood {argv[0]}: error: ")
    assert re.search(message, err)
    assert list(tmp_path.iterdir()) == []
