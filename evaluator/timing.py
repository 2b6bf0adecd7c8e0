"""The official benchmark statistics and stopping rules (EVAL_PROTOCOL.md, "Benchmark loop").

Pure Python, no torch: the worker uses it to decide when to stop, and the parent recomputes the statistics from the
raw durations the worker sent (so a submission that patches the worker's copy cannot change the reported numbers).
Staged into the run directory as ``timing.py`` beside ``harness.py``.
"""
from __future__ import annotations

import math


def summarize(durations_ns: list[float]) -> dict:
    """runs, mean, std (n-1), err = std/sqrt(n), best, worst of a list of durations (ns); {} when empty."""
    n = len(durations_ns)
    if n == 0:
        return {}
    mean = sum(durations_ns) / n
    std = math.sqrt(sum((d - mean) ** 2 for d in durations_ns) / (n - 1)) if n > 1 else 0.0
    return {"runs": n, "mean": mean, "std": std, "err": std / math.sqrt(n),
            "best": min(durations_ns), "worst": max(durations_ns)}


def should_stop(durations_ns: list[float], elapsed_ns: float, *, rel_err_stop: float, budget_s: float,
                max_wall_s: float, min_runs: int, max_runs: int) -> bool:
    """The official rule after each timed run: stop at max_runs, or once min_runs are in and the mean is precise
    enough (err/mean < rel_err_stop), the timed total passed the budget (mean*runs > budget), or the wall clock of
    the loop passed max_wall_s."""
    n = len(durations_ns)
    if n >= max_runs:
        return True
    if n < min_runs:
        return False
    s = summarize(durations_ns)
    if s["mean"] <= 0:
        return True
    return (s["err"] / s["mean"] < rel_err_stop
            or s["mean"] * n > budget_s * 1e9
            or elapsed_ns > max_wall_s * 1e9)
