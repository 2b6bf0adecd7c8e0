"""The CLI, reports and records on disk (CPU, fast).

Most tests replace ``evaluator.run`` by a fake that returns a hand-built RunRecord, so they check the CLI's own job:
choosing cases, devices and submissions, reporting, writing files, exit codes. One smoke run goes end to end.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench import cli
from kbench import evaluator
from kbench import problems
from kbench.evaluator import ceilings, results_io
from kbench.evaluator.record import CaseResult, RunRecord

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------------
# helpers

def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli.main, list(args), env=env)


def assert_one_line_error(result, *fragments: str) -> None:
    """Bad input: exit 2, one line, no traceback, the fix named."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def make_result(index: int, case: dict, status: str = "pass", mean: float | None = 1000.0, message: str = "",
                runs: int = 10) -> CaseResult:
    timed = status == "pass" and mean is not None
    return CaseResult(index=index, case=dict(case), status=status, message=message,
                      runs=runs if timed else 0, mean_ns=mean if timed else None,
                      std_ns=mean * 0.01 if timed else None, err_ns=mean * 0.003 if timed else None,
                      best_ns=mean * 0.9 if timed else None, worst_ns=mean * 1.2 if timed else None, wall_s=0.5)


def make_record(results: list[CaseResult], mode: str = "benchmark", device: str = "cuda",
                problem: str = "fp8-mm", interrupted: bool = False, world_size: int | None = None) -> RunRecord:
    return RunRecord(problem=problem, mode=mode, submission="/x/submission.py", submission_sha256="ab" * 32,
                     device=device, world_size=world_size, seed=None, cases=results, interrupted=interrupted,
                     environment={"gpu": "NVIDIA H100 80GB HBM3"}, command="kbench perf fp8-mm")


CASES = [{"m": 64, "n": 128, "k": 256, "seed": 1}, {"m": 128, "n": 256, "k": 384, "seed": 2},
         {"m": 256, "n": 256, "k": 512, "seed": 3}]


class FakeRun:
    """Stands in for evaluator.judge (one world size of a plan): records the plan, reports progress, returns a
    chosen record."""

    def __init__(self, statuses=None, means=None, interrupted_after=None):
        self.calls = []
        self.statuses = statuses or {}
        self.means = means or {}
        self.interrupted_after = interrupted_after

    def __call__(self, plan, progress=None, deadline=None):
        problem, submission, mode, cases, device = plan.problem, plan.submission, plan.mode, plan.cases, plan.device
        world_size = plan.world_size
        self.calls.append(dict(problem=problem, submission=submission, mode=mode, cases=[dict(c) for c in cases],
                               device=device, seed=plan.seed, world_size=world_size,
                               intended_bools=plan.intended_bools, submission_text=Path(submission).read_text(),
                               protocol=dict(plan.protocol)))
        results = []
        for i, case in enumerate(cases):
            if self.interrupted_after is not None and i >= self.interrupted_after:
                results.append(make_result(i, case, status="interrupted"))
                continue
            progress and progress("start", i, None)
            status = self.statuses.get(i, "pass")
            mean = None if mode == "test" else self.means.get(i, 1000.0 * (i + 1))
            r = make_result(i, case, status=status, mean=mean,
                            message="" if status == "pass" else "rank 0 - mismatch at (0, 1)\nrank 1 - crashed")
            results.append(r)
            progress and progress("done", i, r)
        return make_record(results, mode=mode, device=device, problem=problem, world_size=world_size,
                           interrupted=self.interrupted_after is not None)


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    monkeypatch.setenv("KBENCH_CACHE", str(tmp_path / "cache"))
    fake = FakeRun()
    monkeypatch.setattr(evaluator, "judge", fake, raising=False)
    return fake


@pytest.fixture
def submission(tmp_path):
    path = tmp_path / "submission.py"
    path.write_text("def custom_kernel(data):\n    return data\n")
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# help and list

def test_bare_command_prints_help():
    result = invoke()
    assert result.exit_code == 0
    assert "Usage" in result.output
    for command in ("list", "gen", "test", "perf", "profile", "device"):
        assert command in result.output


@pytest.mark.parametrize("command", ["list", "gen", "test", "perf", "profile", "device"])
def test_every_option_has_help(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    sub = cli.main.commands[command]
    for param in sub.params:
        if param.param_type_name == "option":
            assert param.help, f"{command} {param.opts} has no help text"


def test_perf_help_lists_its_options():
    out = invoke("perf", "--help").output
    for option in ("--submission", "--backend", "--case", "--cases", "--device", "--seed", "--world-size",
                   "--intended-bools", "--mode", "--json", "--compare", "--popcorn-log"):
        assert option in out


def test_list_shows_problems_counts_and_backends():
    result = invoke("list", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in problems.list_problems():
        spec = problems.load_spec(name)
        row = next(ln for ln in result.output.splitlines() if f" {name} " in ln)
        assert spec.leaderboard in row
        assert f" {len(spec.tests)} " in row and f" {len(spec.benchmarks)} " in row
        assert f"{spec.default_backend}*" in row or not (REPO / "kernels" / name / spec.default_backend).is_dir()


# ----------------------------------------------------------------------------------------------------------------
# bad input: one line, exit 2

def test_unknown_problem_lists_known(fake_run):
    result = invoke("test", "no-such-problem", "--device", "cpu")
    assert_one_line_error(result, "unknown problem", "fp8-mm")
    assert not fake_run.calls


def test_unknown_problem_in_gen():
    assert_one_line_error(invoke("gen", "nope"), "unknown problem", "fp8-mm")


@pytest.mark.parametrize("bad", ["m=64, n=64", "m: 64; n", "m: ; k: 1"])
def test_bad_case_string_shows_the_form(fake_run, bad):
    result = invoke("test", "fp8-mm", "--device", "cpu", "--case", bad)
    assert_one_line_error(result, "key: value; key: value")
    assert not fake_run.calls


def test_bad_case_file_names_the_line(fake_run, tmp_path):
    path = tmp_path / "cases.txt"
    path.write_text("m: 64; n: 64; k: 128; seed: 1\n\nm 64\n")
    assert_one_line_error(invoke("test", "fp8-mm", "--device", "cpu", "--cases", str(path)), "cases.txt:3")


def test_missing_case_file(fake_run, tmp_path):
    assert_one_line_error(invoke("test", "fp8-mm", "--device", "cpu", "--cases", str(tmp_path / "none.txt")),
                          "no such file")


@pytest.mark.parametrize("args,fragment", [
    (("fp8-mm", "--world-size", "2"), "drop --world-size"),
    (("gemm-rs", "--world-size", "0"), "positive"),
    (("gemm-rs", "--world-size", "-3"), "positive"),
    (("gemm-rs", "--case", "world_size: two; m: 64; n: 64; k: 128; has_bias: True; seed: 1"), "--world-size N"),
])
def test_bad_world_size(fake_run, args, fragment):
    result = invoke("test", *args, "--device", "cpu")
    assert_one_line_error(result, fragment)
    assert not fake_run.calls


@pytest.mark.parametrize("args,fragment", [
    (("test", "gemm-rs", "--world-size", "two"), "'two' is not a valid integer"),
    (("test", "fp8-mm", "--device", "tpu"), "'tpu' is not one of"),
    (("test", "fp8-mm", "--no-such-option"), "--no-such-option"),
    (("gen", "fp8-mm", "--target", "a100"), "'a100' is not one of"),
    (("frobnicate",), "frobnicate"),
])
def test_usage_errors_are_one_line(fake_run, args, fragment):
    assert_one_line_error(invoke(*args), fragment, "--help")
    assert not fake_run.calls


def test_world_size_above_visible_gpus(fake_run, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(cli, "_load_ceilings", lambda: None)
    result = invoke("test", "gemm-rs", "--cases", "official")
    assert_one_line_error(result, "world_size 8", "--world-size 4")
    assert not fake_run.calls


def test_missing_submission_file(fake_run, tmp_path):
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", str(tmp_path / "nope.py"))
    assert_one_line_error(result, "submission file not found", "--backend")


def test_submission_and_backend_exclusive(fake_run, submission):
    assert_one_line_error(invoke("test", "fp8-mm", "--submission", submission, "--backend", "torch"), "not both")


def test_cuda_requested_without_gpu(fake_run, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_one_line_error(invoke("test", "fp8-mm", "--device", "cuda"), "--device cpu")


def test_profile_warmup_reaches_the_plan_and_defaults_to_the_official_single_call(fake_run, submission):
    assert invoke("profile", "fp8-mm", "--device", "cpu", "--submission", submission, "--warmup", "3").exit_code == 0
    assert invoke("profile", "fp8-mm", "--device", "cpu", "--submission", submission).exit_code == 0
    assert [c["protocol"]["profile_warmup"] for c in fake_run.calls] == [3, 0]
    assert_one_line_error(invoke("profile", "fp8-mm", "--device", "cpu", "--submission", submission, "--warmup", "-1"),
                          "--warmup")


def test_compare_file_missing_or_wrong(fake_run, submission, tmp_path):
    args = ("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--compare")
    assert_one_line_error(invoke(*args, str(tmp_path / "old.json")), "not found")
    other = tmp_path / "other.json"
    results_io.write_json(make_record([make_result(0, CASES[0])], problem="moe", device="cpu"), other)
    assert_one_line_error(invoke(*args, str(other)), "'moe'")
    gpu = tmp_path / "gpu.json"
    results_io.write_json(make_record([make_result(0, CASES[0])], device="cuda"), gpu)
    assert_one_line_error(invoke(*args, str(gpu)), "never compared")
    assert not fake_run.calls


# ----------------------------------------------------------------------------------------------------------------
# runs through the CLI with a fake evaluator

def test_cpu_auto_runs_smoke_cases_and_says_so(fake_run, submission, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("test", "gemm-rs", "--submission", submission)
    assert result.exit_code == 0, result.output
    assert all(call["device"] == "cpu" and call["mode"] == "test" for call in fake_run.calls)
    spec = problems.load_spec("gemm-rs")
    # the official text round trip: has_bias arrives as the string, as on the leaderboard
    sent = [c for call in fake_run.calls for c in call["cases"]]
    assert sorted(sent, key=str) == sorted((problems.official_case(c) for c in spec.smoke), key=str)
    assert any(c["has_bias"] == "False" for c in sent)
    notes = [ln for ln in result.output.splitlines() if "smoke" in ln and "CPU" in ln]
    assert len(notes) == 1


def test_mixed_world_sizes_run_once_per_size_and_merge_in_order(fake_run, submission):
    cases = ["world_size: 4; m: 64; n: 64; k: 128; has_bias: True; seed: 1",
             "world_size: 2; m: 64; n: 64; k: 128; has_bias: True; seed: 2",
             "world_size: 4; m: 64; n: 64; k: 128; has_bias: False; seed: 3"]
    out = Path(submission).with_name("run.json")
    fake_run.statuses = {1: "fail"}          # the second case of the world-size-4 run
    args = [a for c in cases for a in ("--case", c)]
    result = invoke("test", "gemm-rs", "--device", "cpu", "--submission", submission, "--json", str(out), *args)
    assert result.exit_code == 1, result.output
    assert [(c["world_size"], [x["seed"] for x in c["cases"]]) for c in fake_run.calls] == [(4, [1, 3]), (2, [2])]
    data = json.loads(out.read_text())
    assert [(c["index"], c["case"]["seed"], c["status"]) for c in data["cases"]] == [
        (0, 1, "pass"), (1, 2, "pass"), (2, 3, "fail")]
    assert data["world_size"] == 4


def test_evaluator_refusal_is_one_line(monkeypatch, submission):
    def refuse(*a, **k):
        raise evaluator.EvaluatorError("m=64 not divisible by world size 3; pass a --world-size that divides them")

    monkeypatch.setattr(evaluator, "judge", refuse)
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", submission, "--cases", "smoke")
    assert result.exit_code == 2
    assert result.output.count("Error:") == 1 and "divides them" in result.output and "Traceback" not in result.output


def test_intended_bools_and_world_size_override(fake_run, submission):
    # the plan refuses a world size that does not divide the cases' m and k before anything runs (3 here) ...
    assert_one_line_error(invoke("test", "gemm-rs", "--device", "cpu", "--submission", submission,
                                 "--world-size", "3"), "not divisible by world size 3")
    result = invoke("test", "gemm-rs", "--device", "cpu", "--submission", submission, "--intended-bools",
                    "--world-size", "2")
    assert result.exit_code == 0, result.output
    call = fake_run.calls[0]
    assert call["intended_bools"] is True and call["world_size"] == 2
    assert all(isinstance(c["has_bias"], bool) and c["world_size"] == 2 for c in call["cases"])
    assert "differ" in result.output


def test_official_cases_on_cpu_warn(fake_run, submission):
    result = invoke("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--cases", "official")
    assert result.exit_code == 0, result.output
    assert len(fake_run.calls[0]["cases"]) == len(problems.load_spec("fp8-mm").benchmarks)
    assert "warning" in result.output


def test_case_option_and_case_file(fake_run, submission, tmp_path):
    result = invoke("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--seed", "7",
                    "--case", "m: 64; n: 64; k: 128; seed: 5", "--case", "m: 128; n: 64; k: 128; seed: 6")
    assert result.exit_code == 0, result.output
    assert fake_run.calls[0]["cases"] == [{"m": 64, "n": 64, "k": 128, "seed": 5}, {"m": 128, "n": 64, "k": 128, "seed": 6}]
    assert fake_run.calls[0]["seed"] == 7
    path = tmp_path / "cases.txt"
    path.write_text("# two cases\nm: 64; n: 64; k: 128; seed: 5\n\nm: 128; n: 64; k: 128; seed: 9\n")
    result = invoke("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--cases", str(path))
    assert result.exit_code == 0, result.output
    assert [c["seed"] for c in fake_run.calls[1]["cases"]] == [5, 9]


def test_backend_is_generated_into_a_temp_file(fake_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("submission.py").write_text("# the user's own file\n")
    result = invoke("test", "fp8-mm", "--device", "cpu", "--backend", "torch")
    assert result.exit_code == 0, result.output
    call = fake_run.calls[0]
    assert Path(call["submission"]).resolve() != (tmp_path / "submission.py").resolve()
    assert "def custom_kernel" in call["submission_text"]
    assert Path("submission.py").read_text() == "# the user's own file\n"
    assert not Path(call["submission"]).exists(), "the temporary submission outlives the run"
    out = tmp_path / "run.json"
    # bare: ./submission.py when it exists (the first line says so), else the default backend
    result = invoke("test", "fp8-mm", "--device", "cpu", "--json", str(out))
    assert result.output.splitlines()[0] == "kbench: judging submission.py"
    assert fake_run.calls[-1]["submission_text"] == "# the user's own file\n"
    Path("submission.py").unlink()
    result = invoke("test", "fp8-mm", "--device", "cpu", "--json", str(out))
    assert result.exit_code == 0 and "judging backend 'torch'" in result.output.splitlines()[0], result.output
    env = json.loads(out.read_text())["environment"]
    assert env["backend"] == problems.load_spec("fp8-mm").default_backend and env["target"] == "h100"


def test_gen_writes_and_refuses_to_clobber(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("gen", "fp8-mm", "--backend", "torch", "-o", "out.py")
    assert result.exit_code == 0, result.output
    text = Path("out.py").read_text()
    assert "def custom_kernel" in text
    assert invoke("gen", "fp8-mm", "--backend", "torch", "-o", "out.py").exit_code == 0   # its own output: replaced
    Path("mine.py").write_text("# hand written\n")
    assert_one_line_error(invoke("gen", "fp8-mm", "--backend", "torch", "-o", "mine.py"), "--force")
    assert Path("mine.py").read_text() == "# hand written\n"
    assert invoke("gen", "fp8-mm", "--backend", "torch", "-o", "mine.py", "--force").exit_code == 0
    assert Path("mine.py").read_text() == text


def test_unknown_backend_is_one_line(fake_run):
    assert_one_line_error(invoke("test", "fp8-mm", "--device", "cpu", "--backend", "no-such-backend"),
                          "no-such-backend")


def test_perf_json_popcorn_compare_and_exit_codes(fake_run, submission, tmp_path):
    base = ("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--cases", "smoke")
    old, new, log = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "popcorn.txt"
    result = invoke(*base, "--json", str(old))
    assert result.exit_code == 0, result.output
    assert "CPU" in result.output and "score" in result.output
    first = json.loads(old.read_text())
    assert first["passed"] is True and first["command"].startswith("kbench perf")
    assert first["environment"]["python"] and first["environment"]["torch"]

    fake_run.means = {0: 500.0, 1: 2000.0}          # case 0 twice as fast (was 1000 ns), case 1 as before
    result = invoke(*base, "--json", str(new), "--compare", str(old), "--popcorn-log", str(log))
    assert result.exit_code == 0, result.output
    assert "2.00x" in result.output and "1.00x" in result.output
    assert f"{math.sqrt(2):.3f}x" in result.output
    assert "benchmark-count: 2" in log.read_text() and "check: pass" in log.read_text()

    fake_run.statuses = {1: "fail"}
    result = invoke(*base, "--json", str(new))
    assert result.exit_code == 1
    assert "rank 0 - mismatch at (0, 1)" in result.output and "rank 1 - crashed" in result.output
    assert result.output.index("rank 0 - mismatch") < result.output.rindex("rank 1 - crashed")
    assert json.loads(new.read_text())["passed"] is False


def test_interrupted_run_is_reported_written_and_exits_130(monkeypatch, submission, tmp_path):
    fake = FakeRun(interrupted_after=1)
    monkeypatch.setattr(evaluator, "judge", fake, raising=False)
    out = tmp_path / "run.json"
    result = invoke("perf", "fp8-mm", "--device", "cpu", "--submission", submission, "--json", str(out))
    assert result.exit_code == 130, result.output
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and [c["status"] for c in data["cases"]] == ["pass", "interrupted"]
    assert "interrupted" in result.output


def test_interrupt_in_a_world_size_group_skips_the_rest(monkeypatch, submission, tmp_path):
    fake = FakeRun(interrupted_after=1)
    monkeypatch.setattr(evaluator, "judge", fake, raising=False)
    out = tmp_path / "run.json"
    cases = ["world_size: 4; m: 64; n: 64; k: 128; has_bias: True; seed: 1",
             "world_size: 2; m: 64; n: 64; k: 128; has_bias: True; seed: 2",
             "world_size: 4; m: 64; n: 64; k: 128; has_bias: True; seed: 3"]
    result = invoke("test", "gemm-rs", "--device", "cpu", "--submission", submission, "--json", str(out),
                    *[a for c in cases for a in ("--case", c)])
    assert result.exit_code == 130, result.output
    assert len(fake.calls) == 1
    data = json.loads(out.read_text())
    assert data["interrupted"] is True
    assert [c["status"] for c in data["cases"]] == ["pass", "skipped", "interrupted"]


def test_keyboard_interrupt_escaping_run_exits_130(monkeypatch, submission):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluator, "judge", boom, raising=False)
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", submission)
    assert result.exit_code == 130


# ----------------------------------------------------------------------------------------------------------------
# records on disk

def test_json_write_is_atomic_and_round_trips(tmp_path, monkeypatch):
    record = make_record([make_result(i, c, mean=1000.0 * (i + 1)) for i, c in enumerate(CASES)])
    path = tmp_path / "rec.json"
    results_io.write_json(record, path, sol={0: 12.5})
    data = json.loads(path.read_text())
    assert RunRecord.from_json(data) == record
    assert data["score_s"] == pytest.approx(record.score_s())
    assert data["sol_percent"] == {"0": 12.5}

    # a write that dies half way leaves the previous file whole and no temp file behind
    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        results_io.write_json(make_record([make_result(0, CASES[0], mean=5.0)]), path)
    assert json.loads(path.read_text()) == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.json"]


def test_compare_matches_cases_by_value():
    old = make_record([make_result(i, c, mean=m) for i, (c, m) in enumerate(zip(CASES, (1000.0, 4000.0, 900.0)))])
    # the new run lists the cases in another order, fails one and adds one the old run never timed
    new_cases = [CASES[2], CASES[0], CASES[1], {"m": 512, "n": 512, "k": 512, "seed": 4}]
    new = make_record([make_result(0, new_cases[0], mean=300.0), make_result(1, new_cases[1], mean=2000.0),
                       make_result(2, new_cases[2], status="fail"), make_result(3, new_cases[3], mean=10.0)])
    cmp = results_io.compare(results_io.record_json(old), new, "old.json")
    assert cmp.speedups == {0: pytest.approx(3.0), 1: pytest.approx(0.5)}
    assert cmp.matched == 2
    assert cmp.geomean_ratio == pytest.approx(math.sqrt(1.5))


def test_compare_geomean_is_score_ratio_for_same_cases():
    means_old, means_new = (1000.0, 4000.0, 900.0), (800.0, 5000.0, 300.0)
    old = make_record([make_result(i, c, mean=m) for i, (c, m) in enumerate(zip(CASES, means_old))])
    new = make_record([make_result(i, c, mean=m) for i, (c, m) in enumerate(zip(CASES, means_new))])
    cmp = results_io.compare(results_io.record_json(old), new)
    assert cmp.geomean_ratio == pytest.approx(old.score_s() / new.score_s())


def test_load_record_rejects_non_records(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(results_io.RecordFileError, match="cannot read"):
        results_io.load_record_json(bad)
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(results_io.RecordFileError, match="not a kbench record"):
        results_io.load_record_json(bad)


def _parse_log(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        assert sep and key not in out, line
        out[key] = value
    return out


def test_popcorn_log_benchmark():
    results = [make_result(0, CASES[0], mean=1234.5), make_result(1, CASES[1], status="skipped"),
               make_result(2, CASES[2], status="crash", message="rank 0 - boom\nrank 3 - gone")]
    log = _parse_log(results_io.popcorn_log(make_record(results)))
    assert log["benchmark-count"] == "2"
    assert log["benchmark.0.spec"] == "m: 64; n: 128; k: 256; seed: 1"
    assert log["benchmark.0.runs"] == "10"
    assert float(log["benchmark.0.mean"]) == 1234.5
    for key in ("std", "err", "best", "worst"):
        assert float(log[f"benchmark.0.{key}"]) == pytest.approx(getattr(results[0], f"{key}_ns"))
    assert log["benchmark.1.spec"] == "m: 256; n: 256; k: 512; seed: 3"
    assert log["benchmark.1.status"] == "fail"
    assert log["benchmark.1.error"] == "rank 0 - boom\\nrank 3 - gone"
    assert log["check"] == "fail"


def test_popcorn_log_test_mode(tmp_path):
    results = [make_result(i, c, mean=None) for i, c in enumerate(CASES)]
    path = results_io.write_popcorn_log(make_record(results, mode="test"), tmp_path / "log.txt")
    log = _parse_log(path.read_text())
    assert log["test-count"] == "3" and log["check"] == "pass"
    assert [log[f"test.{i}.status"] for i in range(3)] == ["pass"] * 3
    assert log["test.2.spec"] == "m: 256; n: 256; k: 512; seed: 3"
    assert not any(k.startswith("benchmark") for k in log)


# ----------------------------------------------------------------------------------------------------------------
# speed of light and the ceilings cache

H100 = ceilings.Ceilings(gpu="NVIDIA H100 80GB HBM3", bf16_flops=795e12, fp8_flops=1444e12, copy_bw=2.99e12,
                         allreduce_bw=None, gpus=1)


def test_sol_floor_matches_the_baseline_table():
    # BASELINES.md: fp8-mm 1024 x 1536 x 7168 has a 15.6 us floor on H100 (compute bound), 4096 x 512 at M=1024 3.7 us
    roofline = problems.load_spec("fp8-mm").roofline
    assert ceilings.floor_s(roofline, {"m": 1024, "n": 1536, "k": 7168, "seed": 0}, H100) == pytest.approx(15.6e-6, rel=0.01)
    assert ceilings.floor_s(roofline, {"m": 1024, "n": 4096, "k": 512, "seed": 0}, H100) == pytest.approx(3.7e-6, rel=0.02)
    assert ceilings.sol_percent(15.6e-6, 31.2e3) == pytest.approx(50.0)
    assert ceilings.sol_percent(None, 31.2e3) is None and ceilings.sol_percent(1e-6, None) is None


class _Roofline:
    math = "bf16"

    def flops(self, case):
        return case["f"]

    def bytes(self, case):
        return case["b"]

    def comm_bytes(self, case):
        return case["c"]


def test_sol_floor_takes_the_largest_term():
    c = ceilings.Ceilings(gpu="g", bf16_flops=1e12, fp8_flops=None, copy_bw=1e9, allreduce_bw=1e8, gpus=4)
    r = _Roofline()
    assert ceilings.floor_s(r, {"f": 3e12, "b": 1e9, "c": 0}, c) == pytest.approx(3.0)      # compute
    assert ceilings.floor_s(r, {"f": 1e12, "b": 5e9, "c": 1e8}, c) == pytest.approx(5.0)    # memory
    assert ceilings.floor_s(r, {"f": 1e12, "b": 1e9, "c": 7e8}, c) == pytest.approx(7.0)    # communication
    c.allreduce_bw = None                                                                    # one GPU: no comm term
    assert ceilings.floor_s(r, {"f": 1e12, "b": 1e9, "c": 7e8}, c) == pytest.approx(1.0)
    r.math = "fp8"                                                                           # no fp8 rate measured
    assert ceilings.floor_s(r, {"f": 1e12, "b": 1e9, "c": 0}, c) is None


def test_sol_percents_per_case_and_none_on_cpu():
    roofline = problems.load_spec("fp8-mm").roofline
    case = {"m": 1024, "n": 1536, "k": 7168, "seed": 0}
    record = make_record([make_result(0, case, mean=31.2e3), make_result(1, case, status="fail")])
    assert ceilings.sol_percents(record, roofline, H100) == {0: pytest.approx(50.0, rel=0.01)}
    assert ceilings.sol_percents(record, roofline, None) == {}
    record.device = "cpu"
    assert ceilings.sol_percents(record, roofline, H100) == {}


def test_ceilings_cache_measures_once_per_model(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("KBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    measured = []

    def fake_measure():
        measured.append(1)
        return ceilings.Ceilings(gpu="NVIDIA H100 80GB HBM3", bf16_flops=7e14 + len(measured), fp8_flops=1.4e15,
                                 copy_bw=3e12, allreduce_bw=None, gpus=1)

    monkeypatch.setattr(ceilings, "measure_isolated", fake_measure)
    first = ceilings.load_or_measure()
    assert ceilings.cache_path(first.gpu) == tmp_path / "ceilings" / "NVIDIA-H100-80GB-HBM3.json"
    assert ceilings.cache_path(first.gpu).is_file()
    assert ceilings.load_or_measure() == first and len(measured) == 1
    refreshed = ceilings.load_or_measure(refresh=True)
    assert len(measured) == 2 and refreshed.bf16_flops != first.bf16_flops
    assert ceilings.load_cached(first.gpu) == refreshed

    # more GPUs visible than when measured: only the all-reduce figure is measured again
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(ceilings, "measure_allreduce", lambda world: 3e11 + world)
    wider = ceilings.load_or_measure()
    assert len(measured) == 2 and wider.allreduce_bw == 3e11 + 4 and wider.gpus == 4
    assert wider.bf16_flops == refreshed.bf16_flops and ceilings.load_cached(first.gpu) == wider


def _render(record, width=200, **kw) -> str:
    from rich.console import Console

    from kbench.evaluator import report

    console = Console(record=True, width=width, color_system=None)
    report.print_report(record, console, **kw)
    return console.export_text()


def test_report_table_sol_score_and_failures():
    results = [make_result(0, CASES[0], mean=31.2e3), make_result(1, CASES[1], mean=2e6),
               make_result(2, CASES[2], status="timeout", message="rank 1 - hung past 640 s\nrank 0 - waited")]
    text = _render(make_record(results), sol={0: 50.0, 1: 12.5})
    assert "NVIDIA H100 80GB HBM3" in text and "CPU" not in text
    assert "% SOL" in text and "50.0%" in text and "12.5%" in text
    assert "31.2 µs ± 93.6 ns" in text and "2 ms" in text
    assert "geomean % of speed of light: 25.0%" in text
    assert "2/3 cases passed" in text and "score (geomean of means): none" not in text
    assert text.index("rank 0 - waited") < text.index("rank 1 - hung")

    ok = make_record([make_result(0, CASES[0], mean=1e3), make_result(1, CASES[1], mean=4e3)], device="cpu")
    text = _render(ok)
    assert "CPU" in text.splitlines()[0] and "% SOL" not in text
    assert "score (geomean of means) (CPU): 2 µs" in text


def test_report_names_the_slow_runs_that_lift_a_mean():
    """The score uses means: a few windows of the machine's (several medians long) move it, and the report says so."""
    lifted = make_result(0, CASES[0], mean=1.2e6, runs=100)
    lifted.durations_ns = [1e6] * 95 + [5e6] * 5                # mean 1.2 ms, median 1 ms
    lifted.median_ns, lifted.worst_ns = 1e6, 5e6
    steady = make_result(1, CASES[1], mean=2e6, runs=100)
    steady.durations_ns = [2e6] * 99 + [4.5e6]                  # one slow run: the mean only 1.25% above the median
    steady.median_ns = 2e6
    text = _render(make_record([lifted, steady]))
    assert "median" in text and "1 ms" in text
    assert "#0: 5 of 100 runs took over 2x the median 1 ms (worst 5 ms); the mean is 20% above the median" in text
    assert "#1:" not in text
    assert "slow runs lifted" not in _render(make_record([steady]))


def test_report_reads_at_80_columns():
    """A pipe is 80 columns: no line is longer, and no figure is broken across lines (the case text folds)."""
    results = [make_result(i, c, mean=31.2e3 * (i + 1)) for i, c in enumerate(CASES)]
    text = _render(make_record(results), width=80, sol={0: 50.0, 1: 12.5, 2: 3.0})
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert "31.2 µs ± 93.6 ns" in text and "62.4 µs" in text and "50.0%" in text
    assert "best" not in text.split("\n", 3)[2]  # best and worst stay in --json when narrow


def test_perf_rounds_alternate_with_another_file(fake_run, submission, tmp_path, monkeypatch):
    """--against B --rounds 2 judges A B, B A in fresh runs, reports each file's scores, medians and their ratio."""
    other = tmp_path / "other.py"
    other.write_text("def custom_kernel(data):\n    return data\n")

    def judged(plan, progress=None, deadline=None):  # the other file takes twice as long on every case
        fake_run.means = {i: 2000.0 * (i + 1) for i in range(9)} if plan.submission.endswith("other.py") else {}
        return fake_run(plan, progress, deadline)

    monkeypatch.setattr(evaluator, "judge", judged, raising=False)
    out = tmp_path / "run.json"
    result = invoke("perf", "fp8-mm", "--submission", submission, "--against", str(other), "--rounds", "2",
                    "--device", "cpu", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [Path(c["submission"]).name for c in fake_run.calls] == ["submission.py", "other.py", "other.py",
                                                                      "submission.py"]
    assert "submission over 2 rounds:" in result.output and "against over 2 rounds:" in result.output
    assert "the submission is 2.000x faster than --against" in result.output
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["file"] for r in rounds] == ["submission", "against", "against", "submission"]
    assert all(r["passed"] for r in rounds)
    assert_one_line_error(invoke("perf", "fp8-mm", "--submission", submission, "--against", "missing.py"),
                          "--against missing.py: no such file")


def test_report_comparison_warns_across_gpu_models():
    old = make_record([make_result(0, CASES[0], mean=2e3)])
    old.environment["gpu"] = "NVIDIA H200"
    new = make_record([make_result(0, CASES[0], mean=1e3)])
    text = _render(new, comparison=results_io.compare(results_io.record_json(old), new, "old.json"))
    assert "2.00x" in text and "geomean speedup 2.000x (faster)" in text
    assert "timed on NVIDIA H200, this run on NVIDIA H100 80GB HBM3" in text
    assert "multi-GPU windows" not in text
    two = make_record([make_result(0, CASES[0], mean=1e3)], world_size=2)
    warnings = results_io.compare(results_io.record_json(old), two, "old.json").warnings
    assert any("multi-GPU windows move as a whole" in w for w in warnings)


def test_device_command_without_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_one_line_error(invoke("device"), "no CUDA GPU")


# ----------------------------------------------------------------------------------------------------------------
# the one end-to-end run (spawns the real worker)

def test_smoke_run_end_to_end(tmp_path):
    if not hasattr(evaluator, "run"):
        pytest.skip("evaluator.run is not written yet")
    out = tmp_path / "run.json"
    result = invoke("perf", "fp8-mm", "--device", "cpu", "--backend", "torch", "--json", str(out), "--cases", "smoke")
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    spec = problems.load_spec("fp8-mm")
    assert data["device"] == "cpu" and len(data["cases"]) == len(spec.smoke)
    assert all(c["status"] == "pass" and c["mean_ns"] > 0 and c["runs"] >= 3 for c in data["cases"])
    assert len(data["submission_sha256"]) == 64


# ----------------------------------------------------------------------------------------------------------------
# GPU tier (skipped without a GPU)

@pytest.mark.gpu
def test_device_measures_once_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_CACHE", str(tmp_path))
    result = invoke("device")
    assert result.exit_code == 0, result.output
    [path] = (tmp_path / "ceilings").glob("*.json")
    c = ceilings.Ceilings.from_json(json.loads(path.read_text()))
    assert c.bf16_flops > 1e13 and c.copy_bw > 1e11       # any datacenter GPU clears these by far
    assert c.fp8_flops is None or c.fp8_flops > c.bf16_flops * 0.5
    stamp = path.stat().st_mtime_ns
    assert invoke("device").exit_code == 0 and path.stat().st_mtime_ns == stamp     # cached: not measured again
    assert invoke("device", "--refresh").exit_code == 0 and path.stat().st_mtime_ns != stamp


@pytest.mark.gpu
def test_perf_on_gpu_reports_percent_of_speed_of_light(tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_CACHE", str(tmp_path))
    out = tmp_path / "run.json"
    result = invoke("perf", "fp8-mm", "--backend", "torch", "--json", str(out),
                    "--case", "m: 1024; n: 1536; k: 7168; seed: 8135")
    assert result.exit_code == 0, result.output
    assert "% SOL" in result.output
    data = json.loads(out.read_text())
    assert data["device"] == "cuda" and data["environment"]["gpu"]
    assert 0 < data["sol_percent"]["0"] <= 110
