"""Records on disk: the --json record (atomic), --compare against an older record, and the official --popcorn-log.

A record file is ``RunRecord.to_json()`` plus a few derived keys (``score_s``, ``passed``, ``sol_percent``) so that
tools reading it need not recompute them. Reading a record for --compare needs only the plain JSON, not the classes.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..problems import format_case


class RecordFileError(ValueError):
    """A --compare file that is missing, unreadable or not a kbench record (one line, names the file)."""


# ----------------------------------------------------------------------------------------------------------------
# writing

def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` so that ``path`` holds either the old content or the whole new one, never a torn file.
    The file gets the mode a plain ``open()`` would give it (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_writable(path: str | Path, flag: str) -> None:
    """Refuse, before any case runs, an output path a record could not be written to: RecordFileError, one line."""
    out = Path(path)
    if out.is_dir():
        raise RecordFileError(f"{flag} {path}: is a folder; name a file in it (e.g. {out / 'run.json'})")
    folder = out.resolve().parent
    if not folder.is_dir():
        raise RecordFileError(f"{flag} {path}: folder {folder} does not exist; create it first")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kbench-probe-"):
            pass
    except OSError as exc:
        raise RecordFileError(f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc}); "
                              "pick a writable folder") from None


def write_with_fallback(path: str | Path, text: str) -> tuple[Path, str | None]:
    """Write ``text`` to ``path``; if that fails at the end of a run, write it to a fallback file in the temporary
    folder instead, so the measured results are never lost. Returns (where it went, why not ``path`` or None)."""
    try:
        return atomic_write_text(path, text), None
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="kbench-")) / Path(path).name
        fallback.write_text(text)
        return fallback, f"{path}: {exc.strerror or exc}"


def environment() -> dict[str, Any]:
    """What produced a timing: GPU, driver, torch, CUDA/HIP, Python, platform, hostname."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "hostname": platform.node()}
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = torch.__version__
        env["cuda"] = torch.version.hip or torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpus"] = torch.cuda.device_count()
    env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def fill_environment(record: Any, command: str | None = None) -> None:
    """Complete a record's environment and command line where the runner left them empty (never overwrites)."""
    for key, value in environment().items():
        if record.environment.get(key) is None:
            record.environment[key] = value
    if command and not record.command:
        record.command = command


def record_json(record: Any, sol: Mapping[int, float] | None = None) -> dict[str, Any]:
    """The JSON form of a RunRecord: its own to_json() plus score, verdict and % SOL per case index."""
    data = record.to_json()
    data["score_s"] = record.score_s()
    data["passed"] = record.passed()
    if sol:
        data["sol_percent"] = {str(k): v for k, v in sol.items()}
    return data


def json_text(record: Any, sol: Mapping[int, float] | None = None) -> str:
    return json.dumps(record_json(record, sol), indent=2, default=str) + "\n"


def write_json(record: Any, path: str | Path, sol: Mapping[int, float] | None = None) -> Path:
    """Write the whole record to ``path`` atomically (tempfile in the same folder + os.replace)."""
    return atomic_write_text(path, json_text(record, sol))


# ----------------------------------------------------------------------------------------------------------------
# --compare

def load_record_json(path: str | Path) -> dict[str, Any]:
    """Read a record written by --json, checking only what --compare needs; RecordFileError otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordFileError(f"record file not found: {path} (pass a file written by 'kbench perf --json')") from None
    except (OSError, ValueError) as exc:
        raise RecordFileError(f"cannot read record {path}: {exc} (pass a file written by 'kbench perf --json')") from None
    ok = isinstance(data, dict) and isinstance(data.get("cases"), list) and all(
        isinstance(c, dict) and isinstance(c.get("case"), dict) for c in data["cases"])
    if not ok or "problem" not in data:
        raise RecordFileError(f"{path} is not a kbench record (pass a file written by 'kbench perf --json')")
    return data


def case_key(case: Mapping[str, Any]) -> str:
    """Identity of a case across records: its keys and values, as text (the official form is text too)."""
    return json.dumps({k: str(v) for k, v in case.items()}, sort_keys=True)


@dataclass
class Comparison:
    """Old-vs-new timings of matching cases. speedup = old mean / new mean (above 1: the new run is faster)."""
    old_path: str
    speedups: dict[int, float] = field(default_factory=dict)    # new case index -> speedup
    geomean_ratio: float | None = None                           # geomean of speedups over the matched cases
    matched: int = 0
    old_score_s: float | None = None
    old_gpu: str | None = None                                   # the GPU the old record was timed on
    noise: set[int] = field(default_factory=set)                 # cases whose difference is within the errors
    warnings: list[str] = field(default_factory=list)            # the two runs differ in mode, GPU or cases


def _timed(case: Mapping[str, Any]) -> float | None:
    mean = case.get("mean_ns")
    if case.get("status") == "pass" and isinstance(mean, (int, float)) and mean > 0:
        return float(mean)
    return None


def compare(old: Mapping[str, Any], new: Any, old_path: str = "") -> Comparison:
    """Per-case speedups of ``new`` (a RunRecord) over ``old`` (a record's JSON), matching cases by their values.

    The geomean ratio is taken over the cases both runs timed; with identical case lists that is exactly
    old score / new score.
    """
    old_means = {}
    for c in old["cases"]:
        mean = _timed(c)
        if mean is not None:
            old_means[case_key(c["case"])] = (mean, float(c.get("err_ns") or 0.0))
    result = Comparison(old_path=old_path, old_score_s=old.get("score_s"),
                        old_gpu=(old.get("environment") or {}).get("gpu"))
    for r in new.cases:
        if r.status != "pass" or not r.mean_ns:
            continue
        hit = old_means.get(case_key(r.case))
        if hit is not None:
            old_mean, old_err = hit
            result.speedups[r.index] = old_mean / r.mean_ns
            # two standard errors of the difference: closer than that, neither run is faster
            if abs(old_mean - r.mean_ns) <= 2 * math.hypot(old_err, r.err_ns or 0.0):
                result.noise.add(r.index)
    result.warnings = differences(old, new)
    if result.speedups:
        result.matched = len(result.speedups)
        result.geomean_ratio = math.exp(sum(math.log(s) for s in result.speedups.values()) / result.matched)
    return result


def differences(old: Mapping[str, Any], new: Any) -> list[str]:
    """What makes two records' timings not like for like (not refused, but said): mode, GPU, case list."""
    out = []
    if old.get("mode") and old["mode"] != new.mode:
        out.append(f"the old record is {old['mode']} mode, this run {new.mode} mode")
    old_gpu, new_gpu = (old.get("environment") or {}).get("gpu"), (new.environment or {}).get("gpu")
    if new.device == "cuda" and old_gpu and new_gpu and old_gpu != new_gpu:
        out.append(f"the old record was timed on {old_gpu}, this run on {new_gpu}")
    if new.device == "cuda" and (new.world_size or 1) > 1:
        # on 2x H200 one file scored 505.7-699.2 us over six back-to-back runs: a case's level moves as a whole
        out.append("multi-GPU windows move as a whole from one run of a file to the next (a case's every run "
                   "with them; docs/distributed-notes.md): alternate several runs of each before trusting a difference")
    old_cases = sorted(case_key(c["case"]) for c in old["cases"])
    if old_cases != sorted(case_key(r.case) for r in new.cases):
        out.append("the two runs have different case lists (the geomean ratio covers the cases both timed)")
    return out


def check_comparable(old: Mapping[str, Any], problem: str, device: str, path: str) -> None:
    """Refuse comparisons that mean nothing: another problem, or CPU timings against GPU ones."""
    if old.get("problem") != problem:
        raise RecordFileError(f"{path} records problem {old.get('problem')!r}, not {problem!r}; compare runs of one problem")
    if old.get("device") and old["device"] != device:
        raise RecordFileError(f"{path} was timed on {old['device']}, this run is on {device}; "
                              "CPU and GPU timings are never compared (pass a record from the same device)")


# ----------------------------------------------------------------------------------------------------------------
# --popcorn-log: the official `key: value` result log

def _one_line(text: str) -> str:
    # The log is one key per line; a multi-rank message keeps its lines, escaped.
    return text.strip().replace("\r", "").replace("\n", "\\n")


def popcorn_log(record: Any) -> str:
    """The official harness's result log for a record (test.* keys in test mode, benchmark.* otherwise).

    Times are in nanoseconds. A case that did not pass is logged with status fail and its message as the error;
    skipped cases are left out and the others numbered 0.. in order, as the official harness numbers what it ran.
    """
    lines = []
    prefix = "test" if record.mode == "test" else "benchmark"
    # A case the mode does not run (mla-decode's leaderboard mode times only the last one) is not in the official log.
    ran = [r for r in record.cases if r.status != "skipped"]
    lines.append(f"{prefix}-count: {len(ran)}")
    for i, r in enumerate(ran):
        lines.append(f"{prefix}.{i}.spec: {format_case(r.case)}")
        if r.status != "pass":
            lines.append(f"{prefix}.{i}.status: fail")
            lines.append(f"{prefix}.{i}.error: {_one_line(r.message or r.status)}")
        elif prefix == "test":
            lines.append(f"{prefix}.{i}.status: pass")
        else:
            lines.append(f"{prefix}.{i}.runs: {r.runs}")
            for key in ("mean", "std", "err", "best", "worst"):
                value = getattr(r, f"{key}_ns")
                lines.append(f"{prefix}.{i}.{key}: {float(value) if value is not None else float('nan')}")
    lines.append(f"check: {'pass' if record.passed() else 'fail'}")
    return "\n".join(lines) + "\n"


def write_popcorn_log(record: Any, path: str | Path) -> Path:
    return atomic_write_text(path, popcorn_log(record))
