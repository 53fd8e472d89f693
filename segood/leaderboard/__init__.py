"""Leaderboard submissions: package a run (``submit``), judge strangers' files safely (``leaderboard``)."""

from segood.leaderboard.board import judge, leaderboard, make_benchmark
from segood.leaderboard.safe import Limits, Rejected
from segood.leaderboard.submission import submit, validate

__all__ = ["Limits", "Rejected", "judge", "leaderboard", "make_benchmark", "submit", "validate"]
