"""Running a plan: one process group per world size, merged into one record in case order.

    record = execute(plan, progress)      # plan.make_plan(...) settled everything
    record = run("fp8-mm", "submission.py", mode="test", cases=cases, device="cpu")   # the library shortcut

``execute`` splits the plan's cases by world size (the smoke lists mix 2 and 4 ranks) and calls ``judge`` once per
world size with the plan restricted to those cases; ``judge`` stages the run folder and supervises the workers
(supervisor.py). The run's time limit counts from the start of ``execute`` over every group.
progress(event, case_index, result): "start" when a case begins, "done" with its CaseResult; indices are positions
in ``plan.cases``. Ctrl-C returns what was measured so far with ``interrupted=True``.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import results_io
from .plan import make_plan
from .record import CaseResult, RunRecord
from .stage import stage
from .supervisor import GroupRun, Progress, run_group


def judge(plan, progress: Progress | None = None, deadline: float | None = None) -> RunRecord:
    """Judge a plan whose cases share one world size: stage, supervise, record. ``deadline``: time.monotonic() at
    which the run's time limit ends (default: plan.timeout_s from now)."""
    deadline = deadline if deadline is not None else time.monotonic() + plan.timeout_s
    ws = plan.cases[0]["world_size"] if plan.distributed else None
    record = RunRecord(problem=plan.spec.name, mode=plan.mode, submission=plan.submission,
                       submission_sha256=hashlib.sha256(Path(plan.submission).read_bytes()).hexdigest(),
                       device=plan.device, world_size=ws, seed=plan.seed, cases=[],
                       environment={"intended_bools": plan.intended_bools}, plan=plan.to_json())
    results = {i: CaseResult(index=i, case=c, status="skipped",
                             message=f"the leaderboard mode of {plan.spec.name} times only the last case")
               for i, c in enumerate(plan.cases) if not plan.runs_case(i)}
    keep = plan.run_dir is not None
    rdir = Path(plan.run_dir) if keep else Path(tempfile.mkdtemp(prefix="kbench-run-"))
    run = GroupRun(run_dir=rdir, keep=keep, deadline=deadline, limit_s=plan.timeout_s, progress=progress,
                   environment=record.environment, results=results)
    try:
        stage(plan, range(len(plan.cases)), rdir)
        run_group(plan, list(range(len(plan.cases))), ws, run)
    except KeyboardInterrupt:
        record.interrupted = True
    finally:
        if not keep:
            shutil.rmtree(rdir, ignore_errors=True)
    record.cases = _complete(plan, results, record.interrupted, time.monotonic() >= deadline)
    return record


def _complete(plan, results: Mapping[int, CaseResult], interrupted: bool, out_of_time: bool) -> list[CaseResult]:
    """Every case's result in order; cases never reached say why (Ctrl-C, or the run's time limit)."""
    cases, first_missing = [], True
    for i, case in enumerate(plan.cases):
        if i in results:
            cases.append(results[i])
        elif interrupted:
            cases.append(CaseResult(index=i, case=case, status="interrupted" if first_missing else "skipped",
                                    message="stopped by Ctrl-C" if first_missing else "not run: interrupted"))
            first_missing = False
        else:
            why = f"the run's time limit of {plan.timeout_s:g} s was reached" if out_of_time else "an earlier failure"
            cases.append(CaseResult(index=i, case=case, status="skipped", message=f"not run: {why}"))
    return cases


RunGroup = Callable[[list, "int | None", "Progress | None"], RunRecord]


def run_by_world_size(run_group: RunGroup, cases: Sequence[Mapping], groups: Mapping[int | None, list[int]],
                      world_size: int | None = None, progress: Progress | None = None) -> RunRecord:
    """One run per world size (one process group each), merged into one record in the order of ``cases``.

    run_group(group_cases, world_size, progress) runs one group and returns its RunRecord (indices local to the
    group). ``groups`` is plan.world_size_groups(...). One group: a single call with ``world_size`` as given. Several:
    one call per group with the group's world size; the merged record's case indices and the progress callback's
    indices are positions in ``cases``; its world_size is the largest and its environment the union. A run that
    comes back interrupted, or Ctrl-C between two runs, ends the merge there (``interrupted=True``): what earlier
    runs measured is kept, cases never run are "skipped" (or "interrupted" for the one Ctrl-C stopped). Ctrl-C before
    the first run returns anything propagates as KeyboardInterrupt, as from one run's set-up.
    """
    if len(groups) <= 1:
        return run_group(list(cases), world_size, progress)
    done: list[tuple[list[int], RunRecord]] = []
    stopped: list[int] = []             # the positions of the run Ctrl-C stopped before it returned
    try:
        for ws, indices in groups.items():
            stopped = indices

            def local(event, i, result, indices=indices):
                inside = 0 <= i < len(indices)
                progress(event, indices[i] if inside else i,
                         replace(result, index=indices[i]) if result is not None and inside else result)

            record = run_group([cases[i] for i in indices], ws, local if progress else None)
            done.append((indices, record))
            stopped = []
            if record.interrupted:
                break
    except KeyboardInterrupt:
        if not done:
            raise
    return _merge(done, stopped, cases)


def _merge(done: list[tuple[list[int], RunRecord]], stopped: list[int], cases: Sequence[Mapping]) -> RunRecord:
    merged = done[0][1]
    results: dict[int, CaseResult] = {}
    for indices, record in done:
        for r in record.cases:
            r.index = indices[r.index]
            results[r.index] = r
        if record is not merged:
            merged.environment.update(record.environment)
            merged.world_size = max(merged.world_size or 0, record.world_size or 0) or None
        merged.interrupted = merged.interrupted or record.interrupted
    if stopped or len(results) < len(cases):
        merged.interrupted = True
    out = []
    for i, case in enumerate(cases):
        if i in results:
            out.append(results[i])
        elif stopped and i == stopped[0]:
            out.append(CaseResult(index=i, case=dict(case), status="interrupted", message="stopped by Ctrl-C"))
        else:
            out.append(CaseResult(index=i, case=dict(case), status="skipped", message="not run: interrupted"))
    merged.cases = out
    return merged


def execute(plan, progress: Progress | None = None) -> RunRecord:
    """Judge ``plan.submission`` as the plan says: ``judge`` once per world size among its cases, merged in order.

    With several world sizes each group gets the plan restricted to its cases, and (with plan.run_dir) stages into
    run_dir/world_size_N. The plan's time limit bounds the whole run.
    """
    from .. import evaluator  # judge() is looked up on the package at call time (tests put a stand-in there)

    groups = plan.groups()
    deadline = time.monotonic() + plan.timeout_s

    def one(cases: list, ws: int | None, group_progress: Progress | None) -> RunRecord:
        sub = plan
        if len(groups) > 1:
            where = str(Path(plan.run_dir) / f"world_size_{ws}") if plan.run_dir else None
            sub = replace(plan, cases=[dict(c) for c in cases], world_size=ws, run_dir=where)
        return evaluator.judge(sub, group_progress, deadline)

    record = run_by_world_size(one, plan.cases, groups, world_size=plan.world_size, progress=progress)
    record.plan = plan.to_json()
    results_io.fill_environment(record)
    return record


def run(problem: str | Path, submission: str | Path, *, mode: str, cases: Sequence[Mapping[str, Any]], device: str,
        seed: int | None = None, world_size: int | None = None, intended_bools: bool = False,
        progress: Progress | None = None, timeout_s: float | None = None, worker_per_case: bool = False,
        run_dir: str | Path | None = None, protocol: Mapping[str, Any] | None = None) -> RunRecord:
    """Judge ``submission`` on ``problem`` with explicit cases (already in official form): make_plan + execute.

    timeout_s: the whole run's limit (default: the problem's limit for the mode). run_dir: stage there and keep it.
    protocol: overrides of the spec's protocol fields (e.g. {"max_runs": 10}; not the official numbers then).
    Refusals raise PlanError (an EvaluatorError), one line; an unknown problem raises problems.UnknownProblem.
    """
    if device not in ("cuda", "cpu"):
        from .plan import PlanError
        raise PlanError(f"unknown device {device!r}: choose cuda or cpu")
    plan = make_plan(problem, mode, submission=submission, device=device, cases=cases, world_size=world_size,
                     intended_bools=intended_bools, seed=seed, timeout_s=timeout_s, protocol=protocol,
                     worker_per_case=worker_per_case, run_dir=run_dir)
    return execute(plan, progress)
