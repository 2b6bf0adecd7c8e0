"""What a run produced: one CaseResult per case and the RunRecord around them (the CLI and reports consume these).

Times are nanoseconds (floats). A multi-rank case is judged as one: it passes only if every rank passes, its timings
are rank 0's host clock, and its message holds one line per failing rank, prefixed ``rank R - ``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

# Verdicts a case can end with.
STATUSES = ("pass", "fail", "timeout", "crash", "skipped", "interrupted")


@dataclass
class CaseResult:
    index: int
    case: dict
    status: str                     # one of STATUSES
    message: str = ""               # failure text; in profile mode the top-kernels table
    runs: int = 0
    mean_ns: float | None = None
    std_ns: float | None = None
    err_ns: float | None = None
    best_ns: float | None = None
    worst_ns: float | None = None
    median_ns: float | None = None
    durations_ns: list[float] = field(default_factory=list)  # rank 0's timed runs in order (the score uses their mean)
    wall_s: float = 0.0             # generation + check + timing of this case
    output: str = ""                # the last lines the submission printed during this case (every rank's)

    @classmethod
    def from_json(cls, d: dict) -> "CaseResult":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RunRecord:
    problem: str
    mode: str
    submission: str
    submission_sha256: str
    device: str                     # "cuda" | "cpu"
    world_size: int | None
    seed: int | None
    cases: list[CaseResult]
    interrupted: bool = False
    environment: dict = field(default_factory=dict)
    command: str = ""
    plan: dict = field(default_factory=dict)      # the plan that ran (evaluator/plan.py RunPlan.to_json())
    rounds: list = field(default_factory=list)    # kbench perf --rounds: every run's {"file", "score_s", "passed"}

    def score_s(self) -> float | None:
        """Geometric mean of the per-case mean times in seconds; None if a case did not pass or nothing was timed."""
        if any(c.status not in ("pass", "skipped") for c in self.cases):
            return None
        means = [c.mean_ns / 1e9 for c in self.cases if c.status == "pass" and c.mean_ns]
        if not means:
            return None
        return math.exp(sum(math.log(m) for m in means) / len(means))

    def passed(self) -> bool:
        """Every case passed (a case a mode does not run counts as skipped) and the run was not interrupted."""
        return (not self.interrupted and any(c.status == "pass" for c in self.cases)
                and all(c.status in ("pass", "skipped") for c in self.cases))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RunRecord":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["cases"] = [CaseResult.from_json(c) for c in d.get("cases", [])]
        return cls(**kw)
