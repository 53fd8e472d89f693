"""The evaluation run (``segood evaluate``), black-box score maps (``segood score``) and reports."""

from segood.evaluation.api import evaluate, evaluate_score_maps
from segood.evaluation.report import combine_runs, write_report
from segood.evaluation.results import Results
from segood.evaluation.runner import Evaluation

__all__ = ["Evaluation", "Results", "combine_runs", "evaluate", "evaluate_score_maps", "write_report"]
