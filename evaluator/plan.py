"""Planning a run: the user's choices -> the cases (official form), the device and the number of ranks.

    plan = make_plan("gemm-rs", "test", device="auto", cases_from="smoke")
    record = run_plan(plan, "submission.py", seed=None, progress=None)

The choices are the ones ``kbench test/perf/profile`` offers: a problem, where the cases come from (the spec's official
list for the mode, its smoke list, a FILE with one ``k: v; k: v`` case a line, or ``--case`` strings), a device
(auto | cuda | cpu), a world-size override and ``intended_bools``. Anything wrong is a PlanError: one line that names
the fix, raised before any worker starts. Nothing here prints: the notes a user should see come back in the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import problems

from .record import RunRecord
from .runner import EvaluatorError, Progress, popcorn_seed, resolve_problem, run_by_world_size, world_size_groups

# the spec list each mode runs when the cases come from "official"
MODE_CASES = {"test": "tests", "benchmark": "benchmarks", "leaderboard": "benchmarks", "profile": "benchmarks"}
DEVICES = ("auto", "cuda", "cpu")


class PlanError(EvaluatorError):
    """A choice that cannot make a run: the message is one line naming the fix."""


@dataclass
class RunPlan:
    """Everything a run needs, checked before any worker starts."""
    problem: str                    # as the user named it (a registered name or a problem folder)
    spec: Any                       # problems.Spec
    mode: str
    device: str                     # "cuda" | "cpu"
    cases: list[dict]               # official form: what generate_input receives (the text round trip applied)
    world_size: int | None          # the override passed to evaluator.run (None: each case's own world_size)
    intended_bools: bool = False
    notes: list[str] = field(default_factory=list)   # one-line notices for the user (CPU fallback, warnings)


def resolve_device(requested: str) -> str:
    """"auto" -> "cuda" when a CUDA GPU is visible, else "cpu"; "cuda" without a GPU is a PlanError."""
    if requested not in DEVICES:
        raise PlanError(f"unknown device {requested!r}: choose one of {', '.join(DEVICES)}")
    import torch

    has_gpu = torch.cuda.is_available()
    if requested == "cuda" and not has_gpu:
        raise PlanError("--device cuda but no CUDA GPU is visible; use --device cpu (or auto)")
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    return requested


def read_case_file(path: str | Path, intended_bools: bool = False) -> list[dict]:
    """The cases of a file with one official ``key: value; key: value`` line each (blank and # lines skipped).

    A missing or empty file, or a bad line (named as FILE:LINE), is a PlanError.
    """
    file = Path(path)
    if not file.is_file():
        raise PlanError(f"--cases {path}: no such file; use official, smoke, or a file with one "
                        "'key: value; key: value' case a line")
    cases = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cases.append(problems.parse_case(line, intended_bools=intended_bools))
        except problems.BadCase as exc:
            raise PlanError(f"{path}:{number}: {exc}") from None
    if not cases:
        raise PlanError(f"{path} holds no case; write one 'key: value; key: value' case a line")
    return cases


def check_case_keys(spec, cases: Sequence[dict]) -> None:
    """Every hand-written case must name each key of the official cases (world_size may be left out: the spec's or
    --world-size fills it in); a PlanError names the missing keys and the full set."""
    keys = [k for k in spec.tests[0] if k != "world_size"]
    for case in cases:
        missing = [k for k in keys if k not in case]
        if missing:
            raise PlanError(f"case '{problems.format_case(case)}' lacks {', '.join(missing)}: "
                            f"{spec.name} cases have keys {', '.join(spec.tests[0])}")


def select_cases(spec, mode: str, device: str, case_strings: Sequence[str] = (), cases_from: str | None = None,
                 intended_bools: bool = False, notes: list[str] | None = None) -> list[dict]:
    """The cases to run, as plain dicts (before the official text round trip, see official_cases).

    case_strings (``--case``, each ``k: v; k: v``) and cases_from (``--cases``: "official" = the spec's list for the
    mode, "smoke" = its tiny list, anything else = a case file) exclude each other. With neither: the official list on
    a GPU, the smoke list on the CPU. Notices for the user (the CPU fallback, the official list on the CPU) are
    appended to ``notes``; bad input is a PlanError.
    """
    notes = notes if notes is not None else []
    if case_strings and cases_from:
        raise PlanError("give either --case or --cases, not both")
    if case_strings:
        try:
            cases = [problems.parse_case(s, intended_bools=intended_bools) for s in case_strings]
        except problems.BadCase as exc:
            raise PlanError(str(exc)) from None
        check_case_keys(spec, cases)
        return cases
    official = MODE_CASES[mode]
    if cases_from is None:
        cases_from = "official" if device == "cuda" else "smoke"
        if device == "cpu":
            notes.append(f"running on the CPU with the {len(spec.smoke)} smoke cases (CPU timings; "
                         "--cases official to run the official list)")
    if cases_from == "official":
        if device == "cpu":
            notes.append(f"warning: the official {official} on the CPU can take very long and need much memory")
        return [dict(c) for c in spec.cases(official)]
    if cases_from == "smoke":
        if not spec.smoke:
            raise PlanError(f"{spec.name} has no smoke cases; pass --case \"key: value; ...\" or --cases official")
        return [dict(c) for c in spec.smoke]
    cases = read_case_file(cases_from, intended_bools)
    check_case_keys(spec, cases)
    return cases


def apply_world_size(spec, device: str, cases: list[dict], world_size: int | None = None) -> int | None:
    """Check the number of ranks and write it into ``cases`` (in place); returns the override for evaluator.run.

    Single-GPU problem: no world size but 1 (returns None). Distributed problem: ``world_size`` replaces every case's
    world_size; without it a case keeps its own (the spec's world size when it has none). Each must be a positive
    integer, and on "cuda" no case may need more ranks than there are visible GPUs. Bad input is a PlanError.
    """
    if world_size is not None and world_size < 1:
        raise PlanError(f"--world-size {world_size}: a world size is a positive number of ranks")
    if spec.world_size is None:
        if world_size not in (None, 1):
            raise PlanError(f"{spec.name} runs on one GPU; drop --world-size")
        return None
    for case in cases:
        if world_size is not None:
            case["world_size"] = world_size
        else:       # a hand-written --case may leave it out: the spec's official world size then
            case.setdefault("world_size", spec.world_size)
        if isinstance(case["world_size"], bool) or not isinstance(case["world_size"], int) or case["world_size"] < 1:
            raise PlanError(f"case world_size {case['world_size']!r} is not a positive integer; fix the case "
                            "or pass --world-size N")
    if device == "cuda":
        import torch

        visible = torch.cuda.device_count()
        need = max(int(c["world_size"]) for c in cases)
        if need > visible:
            raise PlanError(f"the cases need world_size {need} but {visible} GPU(s) are visible; "
                            f"pass --world-size {visible} (or fewer)")
    return world_size


def official_cases(spec, cases: list[dict], intended_bools: bool = False) -> list[dict]:
    """The cases as the official harness hands them to generate_input (the ``k: v`` text round trip, when the
    problem's protocol says case_values: text)."""
    if spec.protocol.case_values != "text":
        return cases
    return [problems.official_case(c, intended_bools=intended_bools) for c in cases]


def make_plan(problem: str | Path, mode: str, *, device: str = "auto", case_strings: Sequence[str] = (),
              cases_from: str | None = None, world_size: int | None = None, intended_bools: bool = False) -> RunPlan:
    """Resolve every choice of a run (see the module docstring); PlanError on bad input, before anything runs.

    An unknown problem raises problems.UnknownProblem and a broken spec problems.SpecError, as problems.load_spec does.
    """
    if mode not in MODE_CASES:
        raise PlanError(f"unknown mode {mode!r}: choose one of {', '.join(MODE_CASES)}")
    spec, _ = resolve_problem(problem)
    notes: list[str] = []
    device = resolve_device(device)
    cases = select_cases(spec, mode, device, case_strings, cases_from, intended_bools, notes)
    override = apply_world_size(spec, device, cases, world_size)
    if intended_bools:
        notes.append("--intended-bools: True/False are real booleans here; the leaderboard passed the strings "
                     "'True'/'False' (both truthy), so results can differ from it")
    return RunPlan(problem=str(problem), spec=spec, mode=mode, device=device,
                   cases=official_cases(spec, cases, intended_bools), world_size=override,
                   intended_bools=intended_bools, notes=notes)


def run_plan(plan: RunPlan, submission: str | Path, *, seed: int | None = None,
             progress: Progress | None = None) -> RunRecord:
    """Judge ``submission`` on a plan: evaluator.run once per world size among the plan's cases, merged in order.

    The seed (``seed``, else POPCORN_SEED) is read once here, so every world size runs with the same one. Splitting
    here (with run_by_world_size, as run() does for itself) keeps each evaluator.run call to one process group.
    """
    from .. import evaluator        # run() is looked up on the package at call time (tests put a stand-in there)

    seed = popcorn_seed(seed)
    groups = world_size_groups(plan.spec, plan.cases, plan.world_size)

    def one(cases: list, world_size: int | None, group_progress: Progress | None) -> RunRecord:
        return evaluator.run(plan.problem, submission, mode=plan.mode, cases=cases, device=plan.device, seed=seed,
                             world_size=world_size, intended_bools=plan.intended_bools, progress=group_progress)

    return run_by_world_size(one, plan.cases, groups, world_size=plan.world_size, progress=progress)
