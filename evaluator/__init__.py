"""The judge: runs any submission.py against a problem the way the leaderboard does (see runner.run).

    record = evaluator.run("fp8-mm", "submission.py", mode="test", cases=cases, device="cuda")

plan.py turns a user's choices (case source, device, world size) into the cases and device run() takes.
"""
from .plan import PlanError, RunPlan, make_plan, run_plan
from .record import CaseResult, RunRecord
from .runner import MODES, EvaluatorError, check_world_size, popcorn_seed, run, run_by_world_size, world_size_groups
from .stage import log_tail

__all__ = ["run", "RunRecord", "CaseResult", "EvaluatorError", "MODES", "check_world_size", "log_tail",
           "popcorn_seed", "run_by_world_size", "world_size_groups", "make_plan", "run_plan", "RunPlan", "PlanError"]
