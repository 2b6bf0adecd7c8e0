"""The judge: runs any submission.py against a problem the way the leaderboard does (see runner.run).

    record = evaluator.run("fp8-mm", "submission.py", mode="test", cases=cases, device="cuda")
"""
from .record import CaseResult, RunRecord
from .runner import MODES, EvaluatorError, check_world_size, popcorn_seed, run
from .stage import log_tail

__all__ = ["run", "RunRecord", "CaseResult", "EvaluatorError", "MODES", "check_world_size", "log_tail",
           "popcorn_seed"]
