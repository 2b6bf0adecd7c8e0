"""kbench as a new user meets it (CPU): installing, feedback, bad input refused up front, results never lost.

The install test builds a wheel-less, non-editable install into a fresh virtual environment (slow: tens of seconds;
CI runs it). The others drive the CLI in process; the ones that need real workers use tiny smoke cases.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench import __version__, cli, generator, problems

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "submissions"
FP8 = "m: 64; n: 64; k: 128; seed: 1"


def invoke(*args, env=None):
    return CliRunner().invoke(cli.main, list(args), env=env)


def one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for f in fragments:
        assert f in lines[0], lines[0]


# ----------------------------------------------------------------------------------------------------------------
# 1. install anywhere, own kernels folder, scaffolding

@pytest.mark.slow
def test_a_plain_install_works_from_any_folder(tmp_path):
    venv = tmp_path / "venv"
    # --without-pip: the environment's pip and setuptools are this interpreter's (a venv's bundled setuptools may
    # be too old to build the project offline); torch and the other dependencies come from the system site too
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    assert (site / "kbench" / "kernels" / "fp8-mm" / "cuda" / "gemm.cuh").is_file()
    for name in ("cli.py", "generator.py", "problems", "evaluator"):    # nothing top level but kbench
        assert not (site / name).exists(), name
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    env.pop("KBENCH_KERNELS", None)
    run = lambda *a: subprocess.run([str(venv / "bin" / "kbench"), *a], cwd=work, capture_output=True,  # noqa
                                    text=True, timeout=300, env=env)
    listed = run("list")
    assert listed.returncode == 0 and "cuda*" not in listed.stdout and "torch*" in listed.stdout, listed.stdout
    assert "—" not in listed.stdout
    gen = run("gen", "fp8-mm", "--backend", "cuda", "-o", "-")
    assert gen.returncode == 0 and gen.stdout.startswith("#!POPCORN leaderboard amd-fp8-mm"), gen.stderr
    own = run("new", "fp8-mm", "mine", "--kernels", str(work / "k"))
    assert own.returncode == 0, own.stderr
    test = run("test", "fp8-mm", "--kernels", str(work / "k"), "--backend", "mine", "--device", "cpu")
    assert test.returncode == 0, test.stdout + test.stderr


def test_version_and_gen_to_stdout(capfd):
    assert invoke("--version").output.strip() == f"kbench, version {__version__}"
    result = invoke("gen", "fp8-mm", "--backend", "torch", "-o", "-")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[:2] == ["#!POPCORN leaderboard amd-fp8-mm", "#!POPCORN gpu H100"]
    assert any(ln.startswith(generator.MARKER) for ln in lines[:4])


def test_kernels_folder_new_list_and_test(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("new", "gemm-rs", "mine")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "kernels" / "gemm-rs" / "mine"
    assert (folder / "kernel.yml").is_file() and (folder / "entry.py").is_file()
    one_line_error(invoke("new", "gemm-rs", "mine"), "already exists")
    one_line_error(invoke("new", "gemm-rs", "x", "--from", "nope"), "no shipped backend 'nope'")
    listed = invoke("list", "--kernels", "kernels", env={"COLUMNS": "200"})
    assert "mine" in next(ln for ln in listed.output.splitlines() if " gemm-rs " in ln)
    result = invoke("test", "gemm-rs", "--backend", "mine", "--device", "cpu", env={"KBENCH_KERNELS": "kernels"})
    assert result.exit_code == 0, result.output
    assert "judging backend 'mine'" in result.output.splitlines()[0]


def test_a_backend_folder_without_manifest_says_so(tmp_path):
    (tmp_path / "fp8-mm" / "bare").mkdir(parents=True)
    with pytest.raises(generator.GeneratorError, match="has no kernel.yml"):
        generator.render("fp8-mm", "bare", "h100", root=tmp_path)


def test_targets_a_backend_supports(tmp_path):
    one_line_error(invoke("gen", "fp8-mm", "--backend", "cuda", "--target", "mi300x", "-o", str(tmp_path / "s.py")),
                   "runs on h100, h200, not mi300x")
    one_line_error(invoke("test", "fp8-mm", "--backend", "cuda", "--device", "cpu"), "needs a GPU", "--backend torch")


def test_dev_entry_points_stay_out_of_the_shipped_build():
    shipped = generator.load_build("fp8-mm", "cuda", "h100")
    dev = generator.load_build("fp8-mm", "cuda", "h100", dev=True)
    assert shipped.context["functions"] == ["fp8_gemm"]
    assert dev.context["functions"] == ["fp8_gemm", "fp8_gemm_with_config", "fp8_gemm_config_for"]
    assert "-DKBENCH_DEV" in dev.context["flags"]["cflags"] and "-DKBENCH_DEV" not in shipped.context["flags"]["cflags"]
    assert shipped.context["ext_name"] != dev.context["ext_name"]
    assert "fp8_gemm_with_config" not in generator.render_build(shipped).split("_CPP_SOURCE")[0]


# ----------------------------------------------------------------------------------------------------------------
# 2-4. what is judged, what it printed, a hang bounded by the run's limit

def test_bare_test_judges_the_file_gen_wrote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke("gen", "fp8-mm", "--backend", "torch").exit_code == 0
    result = invoke("test", "fp8-mm", "--device", "cpu", "--cases", "smoke")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "kbench: judging submission.py"


def test_prints_are_shown_and_keep_names_the_folder(tmp_path):
    sub = tmp_path / "submission.py"
    sub.write_text("import sys\nfrom reference import ref_kernel\n\ndef custom_kernel(data):\n"
                   "    print('hello from the kernel')\n    raise ValueError('boom')\n")
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", str(sub), "--case", FP8, "--keep")
    assert result.exit_code == 1
    assert "hello from the kernel" in result.output and "ValueError: boom" in result.output
    kept = [ln.split("run folder kept: ")[1] for ln in result.output.splitlines() if "run folder kept: " in ln]
    assert kept and (Path(kept[0]) / "logs" / "rank0.log").is_file() and (Path(kept[0]) / "cases.txt").is_file()


def test_a_hang_costs_the_runs_time_limit_not_more(tmp_path):
    import time

    start = time.monotonic()
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", str(FIX / "abort_or_hang.py"),
                    "--case", "m: 128; n: 128; k: 256; seed: 1", "--case", "m: 192; n: 128; k: 256; seed: 1",
                    "--timeout", "15")
    assert result.exit_code == 1
    assert time.monotonic() - start < 45
    assert "timed out: the run passed its time limit of 15 s" in result.output
    assert "1 skipped: the run's time limit of 15 s was reached" in result.output
    assert "rank0.log" not in result.output          # a deleted folder is never named


def test_a_hang_on_a_stale_build_lock_names_the_lock(tmp_path, monkeypatch):
    lock = tmp_path / "ext" / "kbench_stale" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    os.utime(lock, (lock.stat().st_atime - 600, lock.stat().st_mtime - 600))  # left by a build 10 minutes ago
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    result = invoke("test", "fp8-mm", "--device", "cpu", "--submission", str(FIX / "waits_on_build_lock.py"),
                    "--case", "m: 128; n: 128; k: 256; seed: 1", "--timeout", "8")
    assert result.exit_code == 1
    assert f"torch's build lock {lock} is older than this run" in result.output.replace("\n", "")
    assert "delete it and run again" in result.output.replace("\n", "")


# ----------------------------------------------------------------------------------------------------------------
# 5. results never lost

@pytest.mark.parametrize("where,fragment", [("folder", "is a folder"), ("/proc/kbench.json", "cannot write"),
                                            ("missing/x.json", "does not exist")])
def test_bad_output_paths_are_refused_before_any_case(tmp_path, monkeypatch, where, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    one_line_error(invoke("perf", "fp8-mm", "--device", "cpu", "--backend", "torch", "--json", where), fragment)


def test_a_write_that_fails_at_the_end_goes_to_a_fallback(tmp_path, monkeypatch):
    from kbench.evaluator import results_io

    out = tmp_path / "run.json"

    def broken(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results_io, "atomic_write_text", broken)
    result = invoke("test", "fp8-mm", "--device", "cpu", "--backend", "torch", "--case", FP8, "--json", str(out))
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "could not write" in ln)
    fallback = Path(line.rsplit("written to ", 1)[1])
    assert json.loads(fallback.read_text())["passed"] is True


def test_records_get_the_users_file_mode(tmp_path):
    from kbench.evaluator import results_io

    old = os.umask(0o022)
    try:
        path = results_io.atomic_write_text(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# ----------------------------------------------------------------------------------------------------------------
# 6-7. bad input and messages

@pytest.mark.parametrize("case,fragment", [
    ("m: 64; n: 64; k: 128; seed: 1; bogus: 7", "unknown key bogus"),
    ("M: 64; n: 64; k: 128; seed: 1", "unknown key M"),
    ("m: 64, n: 64, k: 128, seed: 1", "not ','"),
    ("m: -64; n: 64; k: 128; seed: 1", "m must be a whole number >= 0"),
    ("m: big; n: 64; k: 128; seed: 1", "m must be a whole number >= 0"),
])
def test_bad_cases_are_refused_naming_the_fix(case, fragment):
    one_line_error(invoke("test", "fp8-mm", "--device", "cpu", "--backend", "torch", "--case", case), fragment)


def test_mismatch_reports_say_whose_value_and_the_largest_error():
    import torch

    utils = problems.load_modules("fp8-mm").utils
    exp = torch.ones(4, 4)
    got = exp.clone()
    got[1, 2], got[3, 3] = 1.5, 3.0
    lines = utils.verbose_allclose(got, exp, rtol=1e-2, atol=1e-3)
    assert lines[0].startswith("Number of mismatched elements: 2 of 16; largest error 2 at (3, 3)")
    assert lines[1] == "ERROR at (1, 2): submission 1.5, reference 1.0"


# ----------------------------------------------------------------------------------------------------------------
# 9. --compare

def test_compare_marks_noise_and_warns_about_differences(tmp_path):
    from kbench.evaluator import results_io
    from kbench.evaluator.record import CaseResult, RunRecord

    def rec(mode, means, errs, gpu):
        cases = [CaseResult(i, {"m": 64 * (i + 1), "seed": 1}, "pass", runs=10, mean_ns=m, err_ns=e)
                 for i, (m, e) in enumerate(zip(means, errs))]
        return RunRecord("fp8-mm", mode, "s.py", "ab", "cuda", None, None, cases, environment={"gpu": gpu})

    old = results_io.record_json(rec("benchmark", [1000.0, 1000.0], [10.0, 10.0], "H100"))
    cmp = results_io.compare(old, rec("leaderboard", [990.0, 500.0], [10.0, 10.0], "H200"))
    assert cmp.noise == {0}                         # 10 ns apart with 10 ns errors: noise; 2x: a real speedup
    assert any("leaderboard mode" in w for w in cmp.warnings) and any("H100" in w for w in cmp.warnings)


# ----------------------------------------------------------------------------------------------------------------
# 7. messages that help: a compiler's error, not only its header

def test_a_compile_error_shows_its_cause():
    from kbench.evaluator import guards

    class CompilationError(Exception):  # Triton's: a location header, the source excerpt, then (maybe) the error
        pass

    try:
        try:
            raise RuntimeError("type fp8e4b8 not supported in this architecture.\nThe supported fp8 dtypes are ...")
        except RuntimeError as cause:
            raise CompilationError("at 1:0:\ndef kernel(a_ptr):\n^") from cause
    except CompilationError as exc:
        line = guards.describe(exc, "custom_kernel")
    assert line == ("custom_kernel raised CompilationError: at 1:0: [caused by RuntimeError: type fp8e4b8 not "
                    "supported in this architecture.]"), line
    try:
        raise CompilationError("at 3:4:\n  x = tl.load(p)\n  ^\nunsupported pointer type")
    except CompilationError as exc:
        assert guards.describe(exc, "custom_kernel").endswith(": unsupported pointer type")
