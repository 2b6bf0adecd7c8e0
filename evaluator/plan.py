"""Planning a run: everything settled once, before any worker starts.

    plan = make_plan("gemm-rs", "test", submission="submission.py", device="auto", cases_from="smoke")
    record = evaluator.execute(plan)

The choices are the ones ``kbench test/perf/profile`` offers: the problem (a registered name or a problem folder),
where the cases come from (explicit dicts, ``--case`` strings, the spec's official list for the mode, its smoke list,
or a FILE with one ``k: v; k: v`` case a line), a device (auto | cuda | cpu), a world-size override,
``intended_bools``, the secret seed (``--seed``, else POPCORN_SEED, read once here), the time limit, protocol
overrides and where to keep the run folder. Anything wrong is a PlanError: one line that names the fix. Nothing here
prints: notices for the user come back in ``plan.notes``. The plan is a plain value (``to_json``), saved with the
record; ``plan.line(i)`` is the exact case line the worker reads.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import problems

# the spec list each mode runs when the cases come from "official"
MODE_CASES = {"test": "tests", "benchmark": "benchmarks", "leaderboard": "benchmarks", "profile": "benchmarks"}
MODES = tuple(MODE_CASES)
DEVICES = ("auto", "cuda", "cpu")


class EvaluatorError(ValueError):
    """A run that cannot start as asked (bad mode, device, world size, seed, submission path): one line."""


class PlanError(EvaluatorError):
    """A choice that cannot make a run: the message is one line naming the fix."""


@dataclass(frozen=True)
class RunPlan:
    """Everything a run needs, checked. ``cases`` are in official form (what generate_input receives, world size
    applied); the secret seed is combined into them only in ``line()``, so a record keeps each case as given."""
    problem: str                    # as the user named it (a registered name or a problem folder)
    spec: Any                       # problems.Spec
    mode: str
    device: str                     # "cuda" | "cpu"
    cases: list[dict]
    world_size: int | None          # the --world-size override (None: each case's own world_size)
    intended_bools: bool = False
    notes: list[str] = field(default_factory=list)   # one-line notices for the user (CPU fallback, warnings)
    submission: str = ""            # absolute path of the file judged
    seed: int | None = None         # the secret seed
    timeout_s: float = 0.0          # the whole run's time limit (the mode's official one unless --timeout)
    protocol: Mapping[str, Any] = field(default_factory=dict)   # the spec's Protocol fields, overrides applied
    worker_per_case: bool = False   # a fresh worker (group) per case, as the official runner does
    run_dir: str | None = None      # stage here and keep it; None: a temporary folder removed afterwards

    @property
    def problem_dir(self) -> Path:
        return Path(self.spec.path).parent

    @property
    def distributed(self) -> bool:
        return self.spec.distributed

    def line(self, index: int) -> str:
        """The case line the worker reads: the case with the secret seed combined when the protocol says so."""
        case = self.cases[index]
        if self.seed is not None and self.protocol.get("combine_seed"):
            case = dict(case, seed=problems.combine_seed(int(case["seed"]), self.seed))
        return problems.format_case(case)

    def runs_case(self, index: int) -> bool:
        """False for the cases the mode does not run (mla-decode's leaderboard mode times only the last case)."""
        return not (self.mode == "leaderboard" and self.protocol.get("leaderboard_cases") == "last"
                    and index != len(self.cases) - 1)

    def groups(self) -> dict[int | None, list[int]]:
        """Case positions by the world size they run with (see world_size_groups)."""
        return world_size_groups(self.spec, self.cases, self.world_size)

    def to_json(self) -> dict:
        data = {k: v for k, v in asdict(self).items() if k != "spec"}
        data["spec"] = str(self.spec.path)
        data["lines"] = [self.line(i) for i in range(len(self.cases))]
        return data


# ----------------------------------------------------------------------------------------------------------------
# the steps

def resolve_problem(problem: str | Path):
    """The Spec of a registered name, or of a problem folder holding spec.yml, task.py and reference.py."""
    if isinstance(problem, Path) or os.sep in str(problem):
        return problems.load_spec_file(Path(problem) / "spec.yml")
    return problems.load_spec(problem)


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
    """A hand-written case names every key of the official cases (world_size may be left out: the spec's or
    --world-size fills it in) and no other (smoke-only keys excepted); sizes are whole numbers >= 0."""
    keys = list(spec.tests[0])
    allowed = set(keys) | {k for c in spec.smoke for k in c}
    for case in cases:
        text = problems.format_case(case)
        unknown = [k for k in case if k not in allowed]
        if unknown:
            raise PlanError(f"case '{text}': unknown key{'s' * (len(unknown) > 1)} {', '.join(unknown)}: "
                            f"{spec.name} cases have keys {', '.join(keys)}")
        missing = [k for k in keys if k != "world_size" and k not in case]
        if missing:
            raise PlanError(f"case '{text}' lacks {', '.join(missing)}: {spec.name} cases have keys {', '.join(keys)}")
        for key, value in case.items():
            official = spec.tests[0].get(key)
            if (isinstance(official, int) and not isinstance(official, bool) and key != "world_size"
                    and (isinstance(value, bool) or not isinstance(value, int) or value < 0)):
                raise PlanError(f"case '{text}': {key} must be a whole number >= 0, got {value!r}")


def select_cases(spec, mode: str, device: str, case_strings: Sequence[str] = (), cases_from: str | None = None,
                 intended_bools: bool = False, notes: list[str] | None = None) -> list[dict]:
    """The cases to run, as plain dicts (before the official text round trip, see official_cases).

    case_strings (``--case``, each ``k: v; k: v``) and cases_from (``--cases``: "official" = the spec's list for the
    mode, "smoke" = its tiny list, anything else = a case file) exclude each other. With neither: the official list on
    a GPU, the smoke list on the CPU. Notices for the user are appended to ``notes``; bad input is a PlanError.
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


def _ranks(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"case world_size {value!r} is not a positive integer; fix the case or pass --world-size N")
    return value


def check_world_size(cases: Sequence[Mapping], n: int, divisible_by: Sequence[str], gpus: int | None) -> None:
    """Refuse a world size the cases cannot be split over (the spec's protocol.divisible_by_world_size keys, e.g.
    gemm-rs m and k), or (on GPUs) more ranks than GPUs, before any process starts."""
    for case in cases:
        bad = [f"{k}={case[k]}" for k in divisible_by if k in case and int(case[k]) % n]
        if bad:
            raise PlanError(f"case '{problems.format_case(case)}': {', '.join(bad)} not divisible by world size "
                            f"{n}; pass a --world-size that divides them")
    if gpus is not None and gpus < n:
        raise PlanError(f"world size {n} needs {n} GPUs (one per rank) but this machine has {gpus}: "
                        f"pass --world-size {max(gpus, 1)} or --device cpu")


def apply_world_size(spec, device: str, cases: list[dict], world_size: int | None = None) -> int | None:
    """Settle each case's number of ranks (written into ``cases`` in place); returns the override.

    Single-GPU problem: no world size but 1 (returns None). Distributed problem: ``world_size`` replaces every case's
    world_size; without it a case keeps its own (the spec's world size when it has none). Each must be a positive
    integer that divides the sizes the problem splits, and on "cuda" no case may need more ranks than there are
    visible GPUs. Bad input is a PlanError.
    """
    if world_size is not None and world_size < 1:
        raise PlanError(f"--world-size {world_size}: a world size is a positive number of ranks")
    if spec.world_size is None:
        if world_size not in (None, 1):
            raise PlanError(f"{spec.name} runs on one GPU: drop --world-size")
        return None
    for case in cases:
        case["world_size"] = world_size if world_size is not None else _ranks(case.get("world_size", spec.world_size))
    need = max(c["world_size"] for c in cases)
    if device == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if need > visible:
            raise PlanError(f"the cases need world_size {need} but {visible} GPU(s) are visible; "
                            f"pass --world-size {visible} (or fewer)")
    for n in sorted({c["world_size"] for c in cases}):
        check_world_size([c for c in cases if c["world_size"] == n], n, spec.protocol.divisible_by_world_size, None)
    return world_size


def world_size_groups(spec, cases: Sequence[Mapping], world_size: int | None = None) -> dict[int | None, list[int]]:
    """Positions of ``cases`` by the world size they run with, groups in order of first appearance.

    A single-GPU problem, or a ``world_size`` override, gives one group (key None, resp. the override) holding every
    case; otherwise each case runs with its own ``world_size`` key (the spec's world size where it has none).
    """
    if spec.world_size is None or world_size:
        return {world_size if spec.world_size is not None else None: list(range(len(cases)))}
    groups: dict[int | None, list[int]] = {}
    for i, case in enumerate(cases):
        try:
            n = _ranks(case.get("world_size", spec.world_size))
        except PlanError:
            raise PlanError(f"case '{problems.format_case(case)}': world_size {case.get('world_size')!r} is not a "
                            "whole number of ranks; fix the case or pass --world-size N") from None
        groups.setdefault(n, []).append(i)
    return groups


def official_cases(spec, cases: list[dict], intended_bools: bool = False) -> list[dict]:
    """The cases as the official harness hands them to generate_input (the ``k: v`` text round trip, when the
    problem's protocol says case_values: text)."""
    if spec.protocol.case_values != "text":
        return cases
    return [problems.official_case(c, intended_bools=intended_bools) for c in cases]


def popcorn_seed(seed: int | None = None) -> int | None:
    """--seed, else POPCORN_SEED; the variable is removed either way (the official harness hides it from the code)."""
    env = os.environ.pop("POPCORN_SEED", None)
    if seed is not None:
        return int(seed)
    if env is None or env.strip() == "":
        return None
    try:
        return int(env)
    except ValueError:
        raise PlanError(f"POPCORN_SEED={env!r} is not an integer: unset it or set a whole number") from None


def protocol_fields(spec, overrides: Mapping[str, Any] | None) -> dict:
    """The spec's protocol as a dict with ``overrides`` applied (e.g. {"max_runs": 10} for a quick look; such
    numbers are not the official protocol's); an unknown field is a PlanError."""
    fields = asdict(spec.protocol)
    unknown = set(overrides or {}) - set(fields)
    if unknown:
        raise PlanError(f"unknown protocol field(s) {', '.join(sorted(unknown))}: choose from {', '.join(fields)}")
    return asdict(replace(spec.protocol, **(overrides or {})))


def check_submission(submission: str | Path | None) -> str:
    if submission is None or not Path(submission).is_file():
        raise PlanError(f"submission {str(submission)!r} not found: pass the path of a submission.py "
                        f"(kbench gen writes one)")
    return str(Path(submission).resolve())


def make_plan(problem: str | Path, mode: str, *, submission: str | Path | None = None, device: str = "auto",
              cases: Sequence[Mapping] | None = None, case_strings: Sequence[str] = (), cases_from: str | None = None,
              world_size: int | None = None, intended_bools: bool = False, seed: int | None = None,
              timeout_s: float | None = None, protocol: Mapping[str, Any] | None = None,
              worker_per_case: bool = False, run_dir: str | Path | None = None) -> RunPlan:
    """Settle every choice of a run (see the module docstring); PlanError on bad input, before anything runs.

    ``cases``: explicit case dicts already in official form (the library API); otherwise they come from
    case_strings / cases_from as ``kbench`` takes them. ``submission`` may be None while only planning (the CLI
    generates a backend after the plan is known). An unknown problem raises problems.UnknownProblem and a broken
    spec problems.SpecError, as problems.load_spec does.
    """
    if mode not in MODE_CASES:
        raise PlanError(f"unknown mode {mode!r}: choose one of {', '.join(MODE_CASES)}")
    spec = resolve_problem(problem)
    notes: list[str] = []
    device = resolve_device(device)
    if cases is not None:
        if not cases:
            raise PlanError("no cases to run: pass at least one case")
        chosen = [dict(c) for c in cases]
    else:
        chosen = official_cases(spec, select_cases(spec, mode, device, case_strings, cases_from, intended_bools,
                                                   notes), intended_bools)
    override = apply_world_size(spec, device, chosen, world_size)
    if intended_bools:
        notes.append("--intended-bools: True/False are real booleans here; the leaderboard passed the strings "
                     "'True'/'False' (both truthy), so results can differ from it")
    if timeout_s is not None and not timeout_s > 0:
        raise PlanError(f"--timeout {timeout_s}: a time limit is a positive number of seconds")
    return RunPlan(problem=str(problem), spec=spec, mode=mode, device=device, cases=chosen, world_size=override,
                   intended_bools=intended_bools, notes=notes,
                   submission=check_submission(submission) if submission is not None else "",
                   seed=popcorn_seed(seed), timeout_s=float(timeout_s or spec.timeouts.for_mode(mode)),
                   protocol=protocol_fields(spec, protocol), worker_per_case=worker_per_case,
                   run_dir=str(Path(run_dir).resolve()) if run_dir is not None else None)
