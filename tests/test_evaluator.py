"""The evaluator core: staging, modes, statistics, and containment of known-bad submissions.

Worker starts cost seconds on a CPU (each imports torch), so the tests that spawn group their assertions: one run per
fixture, several cases per run. Fixtures are real submission files under tests/fixtures/submissions/.
"""
import math
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from kbench import evaluator
from kbench import problems
from kbench.evaluator import timing
from kbench.evaluator.record import CaseResult, RunRecord
from kbench.evaluator.plan import EvaluatorError, popcorn_seed
from kbench.evaluator.stage import stage
from kbench.evaluator.supervisor import GroupRun, Supervisor

FIX = Path(__file__).parent / "fixtures" / "submissions"
QUICK = {"max_runs": 5, "rel_err_stop": 0.0}  # timed modes: exactly 5 runs, so the CPU suite stays fast


def fp8_smoke():
    return [problems.official_case(c) for c in problems.load_spec("fp8-mm").smoke]


def fp8_case(m=64, n=128, k=256, seed=1):
    return problems.official_case({"m": m, "n": n, "k": k, "seed": seed})


def rs_smoke():
    return [problems.official_case(c) for c in problems.load_spec("gemm-rs").smoke]


def judge(fixture, problem="fp8-mm", mode="test", cases=None, **kw):
    return evaluator.run(problem, FIX / fixture, mode=mode, cases=cases if cases is not None else fp8_smoke(),
                         device="cpu", **kw)


def assert_no_workers_left():
    """Every worker ended and was reaped: none alive, none a zombie child of this process (multiprocessing's own
    resource tracker, one per parent process, stays by design)."""
    assert mp.active_children() == []
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == me and b"resource_tracker" not in cmdline:
            raise AssertionError(f"process {stat.parent.name} is still a child of the test: {cmdline!r}")


# ----------------------------------------------------------------------------------------------------------------
# pure parts (no workers)

def test_device_gaps_measure_the_idle_time_inside_a_call():
    """kbench profile's last line: the device's span over a call's kernels, the union of their busy intervals."""
    assert timing.device_gaps([]) == (0.0, 0.0)
    # kernels at [0, 10), [5, 12) (overlapping, e.g. two streams), then [20, 30) after an 8 us wait for the host
    span, busy = timing.device_gaps([(20.0, 10.0), (0.0, 10.0), (5.0, 7.0)])
    assert (span, busy) == (30.0, 22.0)
    assert timing.device_gaps([(3.0, 4.0)]) == (4.0, 4.0)


def test_call_timelines_split_the_device_work_by_call_and_measure_each_gap():
    """benchmarks/calls.py --timeline: kernels grouped by the call whose host start precedes them, offsets from that
    start, and the device's idle time before each (overlapping kernels leave none)."""
    work = [("b", 130.0, 20.0), ("a", 110.0, 15.0), ("early", 5.0, 1.0), ("c", 140.0, 5.0),
            ("clone", 170.0, 10.0), ("d", 212.0, 8.0), ("e", 225.0, 5.0)]
    calls = timing.call_timelines(work, [(100.0, 160.0), (200.0, 240.0)])
    assert calls == [[("a", 10.0, 15.0, 10.0), ("b", 30.0, 20.0, 5.0), ("c", 40.0, 5.0, 0.0)],
                     [("d", 12.0, 8.0, 12.0), ("e", 25.0, 5.0, 5.0)]]
    assert timing.call_timelines([], [(1.0, 2.0)]) == [[]]


def test_profile_reads_the_idle_time_from_the_trace():
    import json

    from kbench.evaluator import harness

    class Trace:  # what torch.profiler's profile writes: kernels and copies, host ops (ignored)
        def export_chrome_trace(self, path):
            with open(path, "w") as f:
                json.dump({"traceEvents": [{"cat": "kernel", "ts": 100, "dur": 10}, {"cat": "cpu_op", "ts": 90, "dur": 99},
                                           {"cat": "gpu_memcpy", "ts": 120, "dur": 5}, {"cat": "kernel", "ts": 105}]}, f)

    assert harness._device_idle_line(Trace()) == ("\ndevice: 25.0 us from the first kernel's start to the last one's "
                                                 "end, 15.0 us busy, 10.0 us idle between them")


def test_statistics_use_n_minus_1_and_stop_by_the_official_rules():
    s = timing.summarize([10.0, 12.0, 14.0])
    assert s["runs"] == 3 and s["mean"] == 12.0 and s["best"] == 10.0 and s["worst"] == 14.0
    assert s["std"] == pytest.approx(2.0)                      # sqrt(((-2)^2 + 0 + 2^2) / (3 - 1))
    assert s["err"] == pytest.approx(2.0 / math.sqrt(3))
    assert s["median"] == 12.0 and timing.summarize([1.0, 2.0, 3.0, 100.0])["median"] == 2.5
    assert timing.summarize([]) == {}
    rule = dict(rel_err_stop=0.001, budget_s=10.0, max_wall_s=120.0, min_runs=3, max_runs=100)
    steady = [1e6] * 2
    assert not timing.should_stop(steady, 0, **rule)           # fewer than min_runs, however steady
    assert timing.should_stop(steady + [1e6], 0, **rule)       # err/mean = 0 < 0.001
    noisy = [1e6, 3e6, 2e6, 5e6]
    assert not timing.should_stop(noisy, 0, **rule)
    assert timing.should_stop(noisy, 121e9, **rule)             # wall clock past max_wall_s
    assert timing.should_stop([4e9, 1e9, 7e9], 0, **rule)       # mean * runs = 12 s > 10 s budget
    assert timing.should_stop(noisy * 25, 0, **rule)            # max_runs


def test_record_score_is_the_geomean_of_passing_means_and_round_trips_json():
    cases = [CaseResult(0, {"m": 1, "seed": 1}, "pass", runs=3, mean_ns=1e6),
             CaseResult(1, {"m": 2, "seed": 2}, "pass", runs=3, mean_ns=4e6)]
    rec = RunRecord("fp8-mm", "benchmark", "s.py", "ab", "cpu", None, 5, cases)
    assert rec.score_s() == pytest.approx(2e-3)                 # sqrt(1 ms * 4 ms)
    assert rec.passed()
    back = RunRecord.from_json(rec.to_json())
    assert back == rec and isinstance(back.cases[0], CaseResult)
    rec.cases.append(CaseResult(2, {"m": 3, "seed": 3}, "timeout", message="timed out"))
    assert rec.score_s() is None and not rec.passed()
    untimed = RunRecord("fp8-mm", "test", "s.py", "ab", "cpu", None, None, [CaseResult(0, {}, "pass")])
    assert untimed.score_s() is None and untimed.passed()


def test_stage_holds_what_the_leaderboard_holds(tmp_path):
    cases = fp8_smoke()
    plan = evaluator.make_plan("fp8-mm", "test", submission=FIX / "fp8_good.py", device="cpu", cases=cases)
    run_dir = stage(plan, range(len(cases)), tmp_path / "run")
    for name in ("submission.py", "task.py", "reference.py", "utils.py", "harness.py", "timing.py", "guards.py", "cases.txt",
                 "plan.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "submission.py").read_bytes() == (FIX / "fp8_good.py").read_bytes()
    assert (run_dir / "utils.py").read_bytes() == problems.UTILS_PATH.read_bytes()
    lines = (run_dir / "cases.txt").read_text().splitlines()
    assert [problems.parse_case(line) for line in lines] == cases


def test_the_case_file_holds_the_lines_that_run(tmp_path):
    """World size and secret seed applied, as the official harness's case file; the record keeps the cases given."""
    cases = [dict(c, world_size=4) for c in rs_smoke()[:2]]
    plan = evaluator.make_plan("gemm-rs", "benchmark", submission=FIX / "rs_good.py", device="cpu", cases=cases,
                               world_size=2, seed=5)
    lines = (stage(plan, [0, 1], tmp_path / "run") / "cases.txt").read_text().splitlines()
    for line, case in zip(lines, cases):
        ran = problems.parse_case(line)
        assert ran["world_size"] == 2 and ran["seed"] == problems.combine_seed(case["seed"], 5)
        assert {k: v for k, v in ran.items() if k not in ("seed", "world_size")} == \
            {k: v for k, v in case.items() if k not in ("seed", "world_size")}
    assert plan.cases[0]["seed"] == cases[0]["seed"]


def test_bad_requests_get_one_line_errors_naming_the_fix(tmp_path, monkeypatch):
    sub = FIX / "fp8_good.py"
    with pytest.raises(EvaluatorError, match="choose one of test"):
        evaluator.run("fp8-mm", sub, mode="fast", cases=fp8_smoke(), device="cpu")
    with pytest.raises(EvaluatorError, match="choose cuda or cpu"):
        evaluator.run("fp8-mm", sub, mode="test", cases=fp8_smoke(), device="tpu")
    with pytest.raises(EvaluatorError, match="kbench gen"):
        evaluator.run("fp8-mm", tmp_path / "missing.py", mode="test", cases=fp8_smoke(), device="cpu")
    with pytest.raises(EvaluatorError, match="runs on one GPU: drop --world-size"):
        evaluator.run("fp8-mm", sub, mode="test", cases=fp8_smoke(), device="cpu", world_size=2)
    with pytest.raises(EvaluatorError, match="unknown protocol field"):
        evaluator.run("fp8-mm", sub, mode="test", cases=fp8_smoke(), device="cpu", protocol={"max_rounds": 1})
    with pytest.raises(problems.UnknownProblem, match="known problems"):
        evaluator.run("fp9-mm", sub, mode="test", cases=fp8_smoke(), device="cpu")
    # world size: sizes the reference splits over ranks must divide, and each rank needs its own GPU
    case = {"world_size": 8, "m": 64, "n": 64, "k": 96, "has_bias": "True", "seed": 1}
    evaluator.check_world_size([case], 2, ("m", "k"), gpus=None)
    with pytest.raises(EvaluatorError, match=r"k=96 not divisible by world size 5; pass a --world-size"):
        evaluator.check_world_size([case], 5, ("m", "k"), gpus=None)
    with pytest.raises(EvaluatorError, match="needs 4 GPUs .* this machine has 2: pass --world-size 2"):
        evaluator.check_world_size([case], 4, ("m", "k"), gpus=2)
    # cases of several world sizes: every group is checked before the first one starts
    mixed = [dict(case, world_size=2), dict(case, world_size=5)]
    with pytest.raises(EvaluatorError, match=r"not divisible by world size 5"):
        evaluator.run("gemm-rs", FIX / "rs_good.py", mode="test", cases=mixed, device="cpu", run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    monkeypatch.setenv("POPCORN_SEED", "abc")
    with pytest.raises(EvaluatorError, match="POPCORN_SEED='abc' is not an integer"):
        popcorn_seed(None)


def test_popcorn_seed_is_read_and_removed_from_the_environment(monkeypatch):
    monkeypatch.setenv("POPCORN_SEED", "4242")
    assert popcorn_seed(None) == 4242
    assert "POPCORN_SEED" not in os.environ
    monkeypatch.setenv("POPCORN_SEED", "1")
    assert popcorn_seed(7) == 7 and "POPCORN_SEED" not in os.environ   # --seed wins, the variable still goes
    assert popcorn_seed(None) is None


def test_results_of_ranks_running_ahead_are_kept():
    """Rank 0 can report case 1 before rank 1 reports case 0; nothing may be dropped (that once hung a run)."""
    group = type("FakeGroup", (), {"world_size": 2, "procs": [], "conns": []})()
    events = []
    run = GroupRun(run_dir=Path("."), keep=False, deadline=float("inf"), limit_s=60.0,
                   progress=lambda *e: events.append(e[:2]), environment={})
    results = run.results
    batch = Supervisor(group, [(0, {"seed": 1}), (1, {"seed": 2})], run)
    ok = {"status": "pass", "message": "", "durations": [], "wall_s": 0.1}
    for rank, index in ((0, 0), (0, 1), (1, 0), (1, 1)):
        batch.handle(("result", rank, index, ok))
    assert [results[i].status for i in (0, 1)] == ["pass", "pass"] and batch.pos == 2
    assert events == [("done", 0), ("done", 1)]


# ----------------------------------------------------------------------------------------------------------------
# single process: fp8-mm smoke cases on the CPU

def test_good_submission_passes_and_megabytes_of_output_go_to_the_log(tmp_path):
    events = []
    rec = judge("chatty.py", run_dir=tmp_path / "run", worker_per_case=True,
                progress=lambda event, index, result: events.append((event, index, result and result.status)))
    assert [c.status for c in rec.cases] == ["pass", "pass"], [c.message for c in rec.cases]
    assert rec.passed() and rec.device == "cpu" and rec.world_size is None
    assert rec.environment["torch"] and rec.environment["python"] and rec.environment["intended_bools"] is False
    assert events == [("start", 0, None), ("done", 0, "pass"), ("start", 1, None), ("done", 1, "pass")]
    log = tmp_path / "run" / "logs" / "rank0.log"
    assert log.stat().st_size >= 2 * 5 * 2**20                  # both workers' 5 MiB each, nothing lost to a pipe
    assert evaluator.log_tail(tmp_path / "run", 0, max_bytes=100).endswith("x" * 50 + "\n")
    assert_no_workers_left()


def test_wrong_outputs_fail_with_clear_messages_and_the_worker_goes_on():
    cases = [fp8_case(seed=s) for s in range(11, 18)]   # one call each: raise, shape, dtype, device, nan, view, good
    rec = judge("wrong_outputs.py", cases=cases)
    got = [(c.status, c.message) for c in rec.cases]
    assert [s for s, _ in got] == ["fail"] * 6 + ["pass"], got
    raised, shape, dtype, device, nan, view, _ = (m for _, m in got)
    assert "custom_kernel raised ValueError: fixture fails on purpose (submission.py line" in raised
    assert "SIZE MISMATCH" in shape and "(64, 127)" in shape
    assert "dtype torch.float32, expected torch.bfloat16" in dtype
    assert "on device meta, expected cpu" in device
    assert "mismatched elements: 1 " in nan and "nan" in nan
    assert "returned a view of its input (data[0])" in view
    assert not rec.passed() and rec.score_s() is None


def test_a_submission_that_does_not_import_fails_every_case(tmp_path):
    broken = tmp_path / "submission.py"
    broken.write_text("import torch\n\ndef custom_kernel(data)\n    return data[4]\n")
    rec = evaluator.run("fp8-mm", broken, mode="test", cases=fp8_smoke(), device="cpu")
    assert [c.status for c in rec.cases] == ["fail", "fail"]
    assert all(c.message.startswith("importing submission.py raised SyntaxError") for c in rec.cases), rec.cases
    assert_no_workers_left()


def test_crash_and_hang_become_verdicts_and_the_run_limit_bounds_everything(tmp_path):
    # abort, right, hang, right: the crash costs only its case; the hang runs into the run's time limit, which
    # bounds the whole run (as the official runner's does), so the case after it is reported as not run
    cases = [fp8_case(m=64), fp8_case(m=192), fp8_case(m=128), fp8_case(m=192, seed=2)]
    rec = judge("abort_or_hang.py", cases=cases, timeout_s=20, run_dir=tmp_path / "run")
    crash, good, hang, after = rec.cases
    assert crash.status == "crash" and "signal SIGABRT" in crash.message, crash
    assert good.status == "pass", good
    assert hang.status == "timeout" and "time limit of 20 s" in hang.message, hang
    assert after.status == "skipped" and "time limit of 20 s was reached" in after.message, after
    log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert "Fatal Python error: Aborted" in log                 # the crash's stack
    assert log.count("in custom_kernel") >= 2                   # ... and the hang's, dumped before the kill
    assert str(tmp_path / "run" / "logs" / "rank0.log") in crash.message   # a kept folder's log is named
    assert_no_workers_left()


def _processes_in(folder: Path) -> list[int]:
    """Pids of processes whose working directory is ``folder`` (workers run in their run directory)."""
    pids = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if Path(os.readlink(cwd)) == folder:
                pids.append(int(cwd.parent.name))
        except OSError:
            continue
    return pids


def test_workers_end_when_the_parent_is_killed(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run_dir = (tmp_path / "run").resolve()
    script = ("from kbench import evaluator, problems\n"
              "if __name__ == '__main__':\n"
              f"    evaluator.run('fp8-mm', {str(FIX / 'abort_or_hang.py')!r}, mode='test', device='cpu',\n"
              f"                  cases=[problems.official_case({fp8_case(m=128)!r})], run_dir={str(run_dir)!r})\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        log, deadline = run_dir / "logs" / "rank0.log", time.monotonic() + 60
        while not (log.is_file() and "hanging now" in log.read_text()):   # the worker sits in the hang
            assert parent.poll() is None and time.monotonic() < deadline, "the worker never reached the hang"
            time.sleep(0.2)
        assert _processes_in(run_dir)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while _processes_in(run_dir):
            assert time.monotonic() < deadline, f"orphaned workers: {_processes_in(run_dir)}"
            time.sleep(0.2)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_benchmark_times_a_good_submission_with_official_statistics():
    rec = judge("fp8_good.py", mode="benchmark", cases=[fp8_case()], protocol=QUICK, seed=7)
    (case,) = rec.cases
    assert case.status == "pass", case.message
    assert case.runs == 5                                       # rel_err_stop 0: only max_runs stops it
    assert 0 < case.best_ns <= case.mean_ns <= case.worst_ns
    assert case.best_ns <= case.median_ns <= case.worst_ns
    assert len(case.durations_ns) == case.runs                  # every run's time kept, in order, for --json
    assert sum(case.durations_ns) / case.runs == pytest.approx(case.mean_ns)
    assert case.err_ns == pytest.approx(case.std_ns / math.sqrt(case.runs))
    assert rec.score_s() == pytest.approx(case.mean_ns / 1e9)
    assert rec.seed == 7 and case.case == fp8_case()            # the record keeps the case as given


def test_leaderboard_reseeding_catches_a_cached_output():
    rec = judge("caches_output.py", mode="leaderboard", cases=[fp8_case()], protocol=QUICK)
    (case,) = rec.cases
    assert case.status == "fail" and case.message.startswith("run 1 (seed 14):"), case.message
    assert "mismatched elements" in case.message


def test_patched_timers_do_not_fool_the_clock():
    rec = judge("patches_timer.py", mode="benchmark", cases=[fp8_case()], protocol={"max_runs": 3})
    (case,) = rec.cases
    assert case.status == "pass", case.message
    assert case.best_ns >= 5e6                                  # the fixture sleeps 5 ms per call


def test_forged_result_lines_never_make_a_pass(tmp_path, monkeypatch):
    read_end, write_end = os.pipe()                             # a POPCORN_FD the parent might have been given
    os.set_blocking(read_end, False)
    monkeypatch.setenv("POPCORN_FD", str(write_end))
    try:
        rec = judge("writes_popcorn_fd.py", cases=[fp8_case()], run_dir=tmp_path / "run")
        with pytest.raises(BlockingIOError):
            os.read(read_end, 100)                              # nothing reached the parent's descriptor
    finally:
        os.close(read_end)
        os.close(write_end)
    assert rec.cases[0].status == "fail", rec.cases[0]
    assert "fixture saw POPCORN_FD=None" in (tmp_path / "run" / "logs" / "rank0.log").read_text()


def test_ctrl_c_returns_what_was_measured():
    def interrupt(event, index, result):
        if event == "done" and index == 0:
            raise KeyboardInterrupt

    rec = judge("fp8_good.py", progress=interrupt)
    assert rec.interrupted and not rec.passed()
    assert [c.status for c in rec.cases] == ["pass", "interrupted"]
    assert_no_workers_left()


def test_profile_mode_returns_the_top_kernels_table():
    rec = judge("fp8_good.py", mode="profile", cases=[fp8_case()])
    (case,) = rec.cases
    assert case.status == "pass"
    assert "Name" in case.message and "aten::" in case.message


def test_profile_warmup_profiles_a_later_call():
    """kbench profile --warmup N (protocol profile_warmup): N plain calls between the check and the profiled call, so
    the table shows the submission's steady state; without it, the official single call after the check."""
    (later,) = judge("fp8_steady.py", mode="profile", cases=[fp8_case()], protocol={"profile_warmup": 2}).cases
    (first,) = judge("fp8_steady.py", mode="profile", cases=[fp8_case()]).cases
    assert later.status == first.status == "pass"
    assert "aten::cumsum" in later.message and "aten::cumsum" not in first.message


# ----------------------------------------------------------------------------------------------------------------
# several ranks: gemm-rs smoke cases, world size 2 over gloo

def test_two_ranks_over_gloo_pass_test_and_leaderboard_modes():
    rec = judge("rs_good.py", problem="gemm-rs", cases=rs_smoke(), world_size=2)
    assert [c.status for c in rec.cases] == ["pass"] * 3, [c.message for c in rec.cases]
    assert rec.world_size == 2 and all(c.case["world_size"] == 2 for c in rec.cases)
    rec = judge("rs_good.py", problem="gemm-rs", mode="leaderboard", cases=rs_smoke()[:1], world_size=2,
                protocol={"max_runs": 3})
    (case,) = rec.cases
    assert case.status == "pass" and case.runs == 3 and case.mean_ns > 0, case
    assert_no_workers_left()


def test_one_run_over_mixed_world_sizes(tmp_path, monkeypatch):
    """Cases asking for 2 and 4 ranks in one evaluator.run: a process group per world size, merged in case order."""
    smoke = rs_smoke()
    assert sorted({c["world_size"] for c in smoke}) == [2, 4]
    cases = sorted(smoke, key=lambda c: -c["world_size"])[:1] + [c for c in smoke if c["world_size"] == 2]
    monkeypatch.setenv("POPCORN_SEED", "11")
    events = []
    rec = judge("rs_good.py", problem="gemm-rs", cases=cases, run_dir=tmp_path / "run",
                progress=lambda e, i, r: events.append((e, i, r and r.index)))
    assert [(c.index, c.case, c.status) for c in rec.cases] == [(i, c, "pass") for i, c in enumerate(cases)], \
        [c.message for c in rec.cases]
    assert rec.world_size == 4 and rec.seed == 11 and "POPCORN_SEED" not in os.environ and not rec.interrupted
    assert sorted(i for e, i, r in events if e == "done") == [0, 1, 2]
    assert all(i == r for e, i, r in events if e == "done")
    assert (tmp_path / "run" / "world_size_4" / "logs" / "rank3.log").is_file()
    assert (tmp_path / "run" / "world_size_2" / "logs" / "rank1.log").is_file()
    assert not (tmp_path / "run" / "world_size_2" / "logs" / "rank2.log").exists()
    assert_no_workers_left()


def test_a_dead_or_raising_rank_fails_its_case_and_leaves_no_process():
    # benchmark mode: every fresh group warms up first, and a case that killed a rank must not be the warm-up of
    # the groups after it (or every later case would die with it)
    rec = judge("rs_rank_fails.py", problem="gemm-rs", mode="benchmark", cases=rs_smoke(), world_size=2,
                timeout_s=60, protocol={"max_runs": 3})
    dead, raised, good = rec.cases
    assert dead.status == "crash" and dead.message.startswith("rank 1 - worker died with signal SIGABRT"), dead
    assert raised.status == "fail", raised
    assert raised.message.startswith("rank 1 - ") and "custom_kernel raised RuntimeError: rank 1 fails on purpose" \
        in raised.message.splitlines()[0], raised
    assert good.status == "pass" and good.runs == 3, good
    assert_no_workers_left()


# ----------------------------------------------------------------------------------------------------------------
# GPU only

@pytest.mark.gpu
def test_work_left_on_a_side_stream_fails_on_gpu():
    rec = evaluator.run("fp8-mm", FIX / "side_stream.py", mode="test", cases=fp8_smoke(), device="cuda")
    assert all(c.status == "fail" for c in rec.cases), [(c.status, c.message) for c in rec.cases]
    assert all("full device synchronize" in c.message for c in rec.cases)


@pytest.mark.gpu
def test_good_submission_passes_on_gpu_with_host_timer():
    rec = evaluator.run("fp8-mm", FIX / "fp8_good.py", mode="benchmark", cases=fp8_smoke(), device="cuda",
                        protocol=QUICK)
    assert [c.status for c in rec.cases] == ["pass", "pass"], [c.message for c in rec.cases]
    assert rec.environment.get("gpu") and rec.score_s() > 0


@pytest.mark.gpu
def test_cuda_event_timer_on_gpu_is_not_fooled_by_patched_timers():
    # gemm-rs on one rank times with CUDA events after an L2 flush; the fixture patches Event.elapsed_time and
    # synchronize, and sleeps 5 ms on the host inside the call, which a CUDA event window also spans
    rec = evaluator.run("gemm-rs", FIX / "rs_good.py", mode="benchmark", cases=rs_smoke()[:1], device="cuda",
                        world_size=1, protocol=QUICK)
    assert rec.cases[0].status == "pass" and rec.cases[0].runs == 5, rec.cases[0]
    rec = evaluator.run("fp8-mm", FIX / "patches_timer.py", mode="benchmark", cases=[fp8_case()], device="cuda",
                        protocol=dict(QUICK, timer="cuda_event"))
    assert rec.cases[0].status == "pass" and rec.cases[0].best_ns >= 5e6, rec.cases[0]


@pytest.mark.gpu
@pytest.mark.multigpu(2)
def test_two_ranks_over_nccl():
    rec = evaluator.run("gemm-rs", FIX / "rs_good.py", mode="leaderboard", cases=rs_smoke()[:2], device="cuda",
                        world_size=2, protocol=QUICK)
    assert [c.status for c in rec.cases] == ["pass", "pass"], [c.message for c in rec.cases]
    assert all(c.runs == 5 and c.mean_ns > 0 for c in rec.cases)
    assert_no_workers_left()


def test_the_record_keeps_how_long_the_submission_took_to_import():
    """load_inline builds inside the import, and the official runner allows 120 s for that: the report says how long
    it took, and warns past the allowance."""
    from rich.console import Console

    from kbench.evaluator import report

    rec = judge("slow_import.py", mode="benchmark", cases=[fp8_case()],
                protocol={**QUICK, "compile_allowance_s": 0.2}, worker_per_case=True)
    assert rec.passed(), rec.cases
    assert rec.environment["import_s"] >= 0.3 and rec.environment["imports"] == 1
    console = Console(record=True, width=200, color_system=None)
    report.print_report(rec, console)
    text = console.export_text()
    assert "submission import: " in text and "over the 0.2 s the official runner allows for compiling" in text
    quick = judge("fp8_good.py", mode="benchmark", cases=fp8_smoke()[:2], protocol=QUICK, worker_per_case=True)
    assert quick.environment["imports"] == 2                    # a fresh worker a case, as the official runner
    assert "allows" not in report.import_line(quick)
