"""evaluator/plan.py (choices -> cases, device, ranks) and run_by_world_size's merge (CPU, no workers: fast)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from kbench import evaluator
from kbench import problems
from kbench.evaluator import plan
from kbench.evaluator.plan import PlanError
from kbench.evaluator.record import CaseResult, RunRecord
from kbench.evaluator.plan import world_size_groups
from kbench.evaluator.runner import run_by_world_size

FP8 = problems.load_spec("fp8-mm")
RS = problems.load_spec("gemm-rs")


# ----------------------------------------------------------------------------------------------------------------
# choosing cases

def test_select_cases_from_strings_lists_and_the_device_default():
    notes: list[str] = []
    got = plan.select_cases(FP8, "test", "cpu", ("m: 64; n: 64; k: 128; seed: 5",), None, False, notes)
    assert got == [{"m": 64, "n": 64, "k": 128, "seed": 5}] and notes == []
    # no choice: the official list on a GPU, the smoke list (and a note saying so) on the CPU
    assert plan.select_cases(FP8, "test", "cuda", notes=notes) == [dict(c) for c in FP8.tests] and notes == []
    assert plan.select_cases(FP8, "benchmark", "cpu", notes=notes) == [dict(c) for c in FP8.smoke]
    assert len(notes) == 1 and "smoke cases" in notes[0]
    notes.clear()
    got = plan.select_cases(FP8, "leaderboard", "cpu", cases_from="official", notes=notes)
    assert got == [dict(c) for c in FP8.benchmarks] and notes[0].startswith("warning: the official benchmarks")
    got[0]["m"] = -1                                    # a copy: the cached spec is untouched
    assert FP8.benchmarks[0]["m"] != -1


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(case_strings=("m: 1; seed: 1",), cases_from="smoke"), "either --case or --cases"),
    (dict(case_strings=("m=64",)), "key: value; key: value"),
    (dict(case_strings=("m: 64; n: 64",)), "lacks k, seed: fp8-mm cases have keys m, n, k, seed"),
])
def test_select_cases_refuses_bad_choices(kwargs, fragment):
    with pytest.raises(PlanError, match=fragment):
        plan.select_cases(FP8, "test", "cpu", **kwargs)


def test_select_cases_without_a_smoke_list():
    spec = SimpleNamespace(name="toy", smoke=())
    with pytest.raises(PlanError, match="toy has no smoke cases"):
        plan.select_cases(spec, "test", "cpu", cases_from="smoke")


def test_case_files(tmp_path):
    path = tmp_path / "cases.txt"
    path.write_text("# header\nm: 64; n: 64; k: 128; has_bias: True; seed: 1\n\n  # indented comment\n")
    assert plan.read_case_file(path) == [{"m": 64, "n": 64, "k": 128, "has_bias": "True", "seed": 1}]
    assert plan.read_case_file(path, intended_bools=True)[0]["has_bias"] is True
    with pytest.raises(PlanError, match="unknown key has_bias: fp8-mm cases have keys m, n, k, seed"):
        plan.select_cases(FP8, "test", "cpu", cases_from=str(path))
    path.write_text("# header\nm: 64; n: 64; k: 128; seed: 1\n")
    assert plan.select_cases(FP8, "test", "cpu", cases_from=str(path))[0]["seed"] == 1
    path.write_text("m: 64; seed: 1\nm 64\n")
    with pytest.raises(PlanError, match=r"cases.txt:2: "):
        plan.read_case_file(path)
    path.write_text("m: 64; n: 64; seed: 1\n")
    with pytest.raises(PlanError, match="lacks k"):
        plan.select_cases(FP8, "test", "cpu", cases_from=str(path))
    path.write_text("# only a comment\n")
    with pytest.raises(PlanError, match="holds no case"):
        plan.read_case_file(path)
    with pytest.raises(PlanError, match="no such file"):
        plan.read_case_file(tmp_path / "none.txt")


# ----------------------------------------------------------------------------------------------------------------
# ranks and devices

def test_apply_world_size_writes_checks_and_returns_the_override(monkeypatch):
    assert plan.apply_world_size(FP8, "cpu", [{"m": 1}], None) is None
    assert plan.apply_world_size(FP8, "cpu", [{"m": 1}], 1) is None
    with pytest.raises(PlanError, match="runs on one GPU: drop --world-size"):
        plan.apply_world_size(FP8, "cpu", [{"m": 1}], 2)
    for bad in (0, -3):
        with pytest.raises(PlanError, match="positive number of ranks"):
            plan.apply_world_size(RS, "cpu", [{"m": 1}], bad)

    cases = [{"world_size": 4, "m": 96}, {"m": 96}]
    assert plan.apply_world_size(RS, "cpu", cases, None) is None
    assert [c["world_size"] for c in cases] == [4, RS.world_size]        # a missing one gets the spec's
    assert plan.apply_world_size(RS, "cpu", cases, 3) == 3
    assert [c["world_size"] for c in cases] == [3, 3]
    with pytest.raises(PlanError, match="m=96 not divisible by world size 5"):     # settled here, once
        plan.apply_world_size(RS, "cpu", cases, 5)
    for bad in ("two", True, 0):
        with pytest.raises(PlanError, match="--world-size N"):
            plan.apply_world_size(RS, "cpu", [{"world_size": bad}], None)

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(PlanError, match="need world_size 4 but 2 GPU.*--world-size 2"):
        plan.apply_world_size(RS, "cuda", [{"world_size": 2}, {"world_size": 4}], None)
    assert plan.apply_world_size(RS, "cuda", [{"world_size": 4}], 2) == 2


def test_resolve_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plan.resolve_device("auto") == "cpu" and plan.resolve_device("cpu") == "cpu"
    with pytest.raises(PlanError, match="no CUDA GPU is visible; use --device cpu"):
        plan.resolve_device("cuda")
    with pytest.raises(PlanError, match="choose one of auto, cuda, cpu"):
        plan.resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert plan.resolve_device("auto") == "cuda" and plan.resolve_device("cpu") == "cpu"


def test_make_plan_gives_official_form_cases_and_notes(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    p = plan.make_plan("gemm-rs", "test")
    assert p.device == "cpu" and p.world_size is None and p.problem == "gemm-rs" and p.spec is RS
    assert p.cases == [problems.official_case(c) for c in RS.smoke]
    assert any(c["has_bias"] == "False" for c in p.cases)              # the leaderboard's strings, not bools
    assert len(p.notes) == 1 and "smoke" in p.notes[0]
    p = plan.make_plan("gemm-rs", "benchmark", device="cpu", world_size=2, intended_bools=True,
                       case_strings=("m: 64; n: 64; k: 128; has_bias: False; seed: 1",))
    assert p.world_size == 2 and p.cases == [{"m": 64, "n": 64, "k": 128, "has_bias": False, "seed": 1,
                                              "world_size": 2}]
    assert p.intended_bools and "differ" in p.notes[-1]
    with pytest.raises(PlanError, match="unknown mode"):
        plan.make_plan("fp8-mm", "fast")
    with pytest.raises(problems.UnknownProblem):
        plan.make_plan("fp9-mm", "test", device="cpu")


# ----------------------------------------------------------------------------------------------------------------
# several world sizes in one run

def _record(cases, ws, interrupted=False, statuses=None):
    statuses = statuses or ["pass"] * len(cases)
    return RunRecord(problem="gemm-rs", mode="test", submission="s.py", submission_sha256="ab", device="cpu",
                     world_size=ws, seed=7, interrupted=interrupted, environment={f"ws{ws}": True},
                     cases=[CaseResult(index=i, case=dict(c), status=s) for i, (c, s) in enumerate(zip(cases, statuses))])


CASES = [{"world_size": 2, "seed": 1}, {"world_size": 4, "seed": 2}, {"world_size": 2, "seed": 3},
         {"world_size": 4, "seed": 4}]


def test_world_size_groups():
    assert world_size_groups(RS, CASES) == {2: [0, 2], 4: [1, 3]}
    assert world_size_groups(RS, CASES, 3) == {3: [0, 1, 2, 3]}
    assert world_size_groups(RS, [{"seed": 1}]) == {RS.world_size: [0]}
    assert world_size_groups(FP8, [{"m": 1}, {"m": 2}]) == {None: [0, 1]}
    with pytest.raises(evaluator.EvaluatorError, match="not a whole number of ranks"):
        world_size_groups(RS, [{"world_size": "two", "seed": 1}])


def test_run_by_world_size_merges_in_case_order_and_maps_progress():
    calls, events = [], []

    def run_group(cases, ws, progress):
        calls.append((ws, [c["seed"] for c in cases]))
        for i, c in enumerate(cases):
            progress("start", i, None)
            progress("done", i, CaseResult(index=i, case=c, status="fail" if c["seed"] == 4 else "pass"))
        progress("warmup", -1, None)                     # not a case: passed through as is
        return _record(cases, ws, statuses=["fail" if c["seed"] == 4 else "pass" for c in cases])

    rec = run_by_world_size(run_group, CASES, world_size_groups(RS, CASES),
                            progress=lambda e, i, r: events.append((e, i, r and r.index)))
    assert calls == [(2, [1, 3]), (4, [2, 4])]
    assert [(c.index, c.case["seed"], c.status) for c in rec.cases] == [(0, 1, "pass"), (1, 2, "pass"),
                                                                         (2, 3, "pass"), (3, 4, "fail")]
    assert [(e, i) for e, i, _ in events if e == "done"] == [("done", 0), ("done", 2), ("done", 1), ("done", 3)]
    assert all(i == r for e, i, r in events if e == "done")
    assert ("warmup", -1, None) in events
    assert rec.world_size == 4 and rec.environment == {"ws2": True, "ws4": True} and not rec.interrupted


def test_run_by_world_size_with_one_group_is_one_plain_call():
    calls = []

    def run_group(cases, ws, progress):
        calls.append((ws, progress))
        return _record(cases, ws)

    show = lambda *a: None      # noqa: E731
    rec = run_by_world_size(run_group, CASES, {3: [0, 1, 2, 3]}, world_size=3, progress=show)
    assert calls == [(3, show)] and [c.index for c in rec.cases] == [0, 1, 2, 3]


def test_an_interrupted_group_ends_the_run_and_keeps_what_was_measured():
    def run_group(cases, ws, progress):
        statuses = ["pass", "interrupted"] if ws == 2 else ["pass", "pass"]
        return _record(cases, ws, interrupted=ws == 2, statuses=statuses)

    rec = run_by_world_size(run_group, CASES, world_size_groups(RS, CASES))
    assert rec.interrupted
    assert [c.status for c in rec.cases] == ["pass", "skipped", "interrupted", "skipped"]
    assert [c.index for c in rec.cases] == [0, 1, 2, 3]


def test_ctrl_c_between_groups_keeps_the_earlier_groups():
    def run_group(cases, ws, progress):
        if ws == 4:
            raise KeyboardInterrupt                     # e.g. while the second group stages its folder
        return _record(cases, ws)

    rec = run_by_world_size(run_group, CASES, world_size_groups(RS, CASES))
    assert rec.interrupted and rec.world_size == 2
    assert [(c.index, c.status) for c in rec.cases] == [(0, "pass"), (1, "interrupted"), (2, "pass"),
                                                        (3, "skipped")]

    def first_fails(cases, ws, progress):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):              # nothing measured yet: as from one run's set-up
        run_by_world_size(first_fails, CASES, world_size_groups(RS, CASES))


def test_the_plan_reads_the_seed_once_and_execute_judges_per_world_size(monkeypatch, tmp_path):
    calls = []

    def fake_judge(plan, progress=None, deadline=None):
        calls.append((plan.problem, plan.world_size, plan.seed, [c["seed"] for c in plan.cases]))
        return _record(plan.cases, plan.world_size)

    monkeypatch.setattr(evaluator, "judge", fake_judge)
    monkeypatch.setenv("POPCORN_SEED", "4242")
    sub = tmp_path / "s.py"
    sub.write_text("def custom_kernel(data):\n    return data\n")
    p = plan.make_plan("gemm-rs", "test", submission=sub, device="cpu", cases=[dict(c) for c in CASES])
    assert "POPCORN_SEED" not in os.environ and p.seed == 4242
    rec = evaluator.execute(p)
    assert calls == [("gemm-rs", 2, 4242, [1, 3]), ("gemm-rs", 4, 4242, [2, 4])]
    assert [c.case["seed"] for c in rec.cases] == [1, 2, 3, 4]
    calls.clear()
    evaluator.execute(plan.make_plan("gemm-rs", "test", submission=sub, device="cpu", cases=CASES, world_size=2,
                                     seed=9))
    assert calls == [("gemm-rs", 2, 9, [1, 2, 3, 4])]
