"""The judge: runs any submission.py against a problem the way the leaderboard does.

    plan = evaluator.make_plan("fp8-mm", "test", submission="submission.py")   # everything settled, checked
    record = evaluator.execute(plan, progress)                                   # workers, verdicts, timings

docs/walkthrough.md follows one `kbench perf` from the command line to the record, a step a line.
"""
from .plan import (EvaluatorError, PlanError, RunPlan, check_world_size, make_plan, popcorn_seed,
                   world_size_groups)
from .plan import MODES
from .record import CaseResult, RunRecord
from .runner import execute, judge, run, run_by_world_size
from .stage import log_tail

__all__ = ["make_plan", "execute", "judge", "run", "RunPlan", "RunRecord", "CaseResult", "EvaluatorError",
           "PlanError", "MODES", "check_world_size", "log_tail", "popcorn_seed", "run_by_world_size",
           "world_size_groups"]
