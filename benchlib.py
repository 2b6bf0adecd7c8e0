"""What the benchmark scripts under benchmarks/ share: in-process builds, timing, checks, tables and results files.

    from kbench import benchlib
    mod = benchlib.build("moe", "cuda", dev=True)           # the same text kbench gen packs, imported here
    us = benchlib.Timer()(lambda: mod.custom_kernel(data))   # CUDA events, L2 flushed, median (us)
    benchlib.record("moe", [benchlib.Row("H100", 1, "cuda", "kernel", case_line, us)])

Timing goes through evaluator/timing.py, the timers the judge uses. Results are data: one CSV per problem,
``benchmarks/results/<problem>.csv`` with the columns ``date,gpu,world_size,backend,metric,case,us`` (the folder is
$KBENCH_RESULTS when set, so a device machine can write under $OUT and the rows be merged back with ``merge``).
"""
from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import unittest.mock
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import generator, problems
from .evaluator import timing

COLUMNS = ("date", "gpu", "world_size", "backend", "metric", "case", "us")
# official: `kbench perf` benchmark mode; leaderboard: its leaderboard mode; kernel: CUDA events around one call;
# profiler: one call's device time per kernel from the torch profiler (`kbench profile`), where events cannot split it.
# ncu: one kernel's duration under Nsight Compute, which locks the clocks to base: the figure that compares across
# machines (the others move by a few % from one H100 to the next). host-loop: the official host-clock window replayed
# by benchmarks/host_gap.py, beside the CUDA events inside that window ("<backend>/host", "<backend>/device").
# trace: one phase of a kernel's loop from its own clock64 stamps in a dev build (benchmarks/mla_decode.py
# --phase-trace), the median per tile in us at the SM clock ("<backend>/trace:<phase>"). energy: millijoules a call
# from NVML's energy counter over back-to-back calls (benchmarks/energy.py). import: seconds the submission's import
# took in a `kbench perf` run (load_inline's build inside it; case IMPORT_CASE). official-median, leaderboard-median:
# the per-case medians of those runs. energy and import hold another unit than us in the value column (UNITS).
METRICS = ("official", "leaderboard", "official-median", "leaderboard-median", "kernel", "profiler", "ncu", "host-loop",
           "trace", "energy", "import", "timeline")
UNITS = {"energy": "mJ a call", "import": "s"}  # a metric's unit where it is not us
IMPORT_CASE = "submission import"  # the import metric's one row a run: not a case, the run's slowest import


# ----------------------------------------------------------------------------------------------------------------
# builds

def build(problem: str, backend: str, target: str = "h100", dev: bool = False, rev: str | None = None):
    """Import kernels/<problem>/<backend>/ built exactly as the submission file is (generator.load_build);
    dev=True adds the manifest's dev functions and flags; rev (a git revision of this checkout) builds that
    revision's kernels/ instead, to time an earlier version beside the current one in one process. Returns the
    module (``custom_kernel``, ``ext``)."""
    mods = problems.load_modules(problem)
    root = kernels_at(rev) if rev else None
    with problems.leaderboard_imports({"task": mods.task, "utils": mods.utils, "reference": mods.reference}):
        return generator.load_in_process(generator.load_build(problem, backend, target, root=root, dev=dev))


def _carried_kernels(rev: str) -> Path | None:
    """``rev``/kernels when ``rev`` is a folder holding a kernels/ tree: a copy of old kernels carried to a machine
    whose checkout lacks the revision (`git archive REV kernels | tar x -C FOLDER`)."""
    tree = Path(rev) / "kernels"
    return tree if tree.is_dir() else None


def revision_label(backend: str, rev: str) -> str:
    """The backend name rows of ``backend`` at ``rev`` go under: "<backend>@<rev>" (a carried folder: its name)."""
    return f"{backend}@{Path(rev).name if _carried_kernels(rev) else rev}"


def kernels_at(rev: str) -> Path:
    """The kernels/ tree of git revision ``rev`` of the checkout kbench runs from, extracted to a temporary folder
    (kept for the process: its builds import from there); a carried folder (_carried_kernels) is taken as it is."""
    carried = _carried_kernels(rev)
    if carried:
        return carried
    repo = Path(__file__).resolve().parent
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "kernels"], capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        raise ValueError(f"cannot read kernels/ at revision {rev!r} of {repo} (a git checkout is needed): "
                         f"{detail.decode(errors='replace').strip()}") from None
    out = Path(tempfile.mkdtemp(prefix="kbench-rev-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return out / "kernels"


# ----------------------------------------------------------------------------------------------------------------
# timing

class Timer:
    """Median device time (us) of ``fn`` with the judge's CUDA-event timer, the L2 flushed before every run.
    clean=True flushes by reading 256 MB instead of writing them: the L2 is left clean, so the timed kernel does not
    pay for the flush's write-backs (what a kernel that follows a read-mostly one sees)."""

    def __init__(self, flush: bool = True, clean: bool = False):
        import torch

        self._buf = torch.ones(64 * 1024 * 1024, dtype=torch.int32, device="cuda") if flush else None
        flush_fn = (lambda: self._buf.sum()) if clean else (lambda: self._buf.fill_(42))
        self.clock = timing.Clock(sync=torch.cuda.synchronize, new_event=lambda: torch.cuda.Event(enable_timing=True),
                                  record=torch.cuda.Event.record, elapsed_ms=torch.cuda.Event.elapsed_time,
                                  flush=flush_fn if flush else None)

    def samples(self, fn: Callable[[], Any], runs: int = 25, warmup: int = 3) -> list[float]:
        for _ in range(warmup):
            fn()
        return [timing.cuda_event_window(self.clock, fn)[0] / 1e3 for _ in range(runs)]

    def __call__(self, fn: Callable[[], Any], runs: int = 25, warmup: int = 3) -> float:
        return median(self.samples(fn, runs, warmup))


def interleaved(timer: Timer, variants: Mapping[str, tuple[Callable[[], Any], Mapping[str, str]]], runs: int = 25,
                rounds: int = 4, warmup: int = 3) -> dict[str, float]:
    """The median time (us) of each variant, name -> (fn, knobs: the environment it runs under), its ``runs`` samples
    taken in ``rounds`` passes that alternate in order (A B C, C B A, ...), ``warmup`` calls before each pass (a knob
    that changes a graph's key makes the first calls capture it). Timed one after the other, two identical moe
    configurations read up to 7% apart on an H100 whose clock drifted under the power cap (docs/moe-notes.md,
    twenty-sixth session); alternated, a drift favours none."""
    samples = interleaved_samples(timer.samples, variants, runs, rounds, warmup)
    return {name: median(got) for name, got in samples.items()}


def interleaved_samples(sample: Callable[[Callable[[], Any], int, int], list],
                        variants: Mapping[str, tuple[Callable[[], Any], Mapping[str, str]]], runs: int = 25,
                        rounds: int = 4, warmup: int = 3, settle: bool = True) -> dict[str, list]:
    """interleaved's rounds with any sampler: sample(fn, n, warmup) -> n samples of fn (Timer.samples, or the values
    fn returns); name -> the variant's samples, in the order taken. settle: one pass over every variant first, its
    samples dropped: alternating cancels a steady drift, not a fast one at the start (a clock that rose during a
    pause), which would favour the variant that runs first."""
    samples: dict[str, list] = {name: [] for name in variants}
    names, per_round = list(variants), max(1, -(-runs // rounds))
    for name in names if settle else []:
        fn, settings = variants[name]
        with knobs(settings):
            sample(fn, per_round, warmup)
    for r in range(rounds):
        for name in (names[::-1] if r % 2 else names):
            fn, settings = variants[name]
            with knobs(settings):
                samples[name] += sample(fn, per_round, warmup)
    return samples


def host_samples(fn: Callable[[], Any], runs: int = 10, warmup: int = 2) -> list[float]:
    """The official host-clock timer's windows (synchronize, clock, call, synchronize, clock), in us."""
    import torch

    clock = timing.Clock(sync=torch.cuda.synchronize)
    for _ in range(warmup):
        fn()
    return [timing.host_window(clock, fn)[0] / 1e3 for _ in range(runs)]


def host_time_us(fn: Callable[[], Any], runs: int = 10, warmup: int = 2) -> float:
    """Median of host_samples."""
    return median(host_samples(fn, runs, warmup))


def rank_time_us(fn: Callable[[], Any], runs: int = 20, warmup: int = 3, flush: bool = True) -> float:
    """Kernel-level time of a collective call (us): on every rank the L2 is flushed, the ranks meet at a barrier,
    CUDA events bracket the call; the run's time is the slowest rank's; the median over runs. Every rank calls it."""
    import torch
    import torch.distributed as dist

    buf = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda") if flush else None
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if buf is not None:
            buf.fill_(42)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        t = torch.tensor([start.elapsed_time(end) * 1e3], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return median(times)


def rank_window_us(fn: Callable[[], Any], runs: int = 20, warmup: int = 3) -> tuple[float, float]:
    """The official multi-rank window (evaluator.timing.ranks_window: L2 flush, synchronize, barrier, host clock,
    call, synchronize, barrier, host clock), rank 0's figure broadcast to every rank: (median, mean) over
    runs, in us (the official score is a mean: a few slow windows move it). What it adds to rank_time_us is the
    host's part of a call and the barrier. Every rank calls it."""
    import torch
    import torch.distributed as dist

    buf = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    clock = timing.Clock(sync=torch.cuda.synchronize, barrier=dist.barrier, flush=lambda: buf.fill_(42))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = torch.tensor([timing.ranks_window(clock, fn)[0] / 1e3], device="cuda")
        dist.broadcast(t, 0)
        times.append(t.item())
    return median(times), sum(times) / len(times)


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def geomean(xs: Iterable[float | None]) -> float | None:
    """Geometric mean; None when any value is missing (a partial geomean would mislead)."""
    xs = list(xs)
    if not xs or any(not x for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# ----------------------------------------------------------------------------------------------------------------
# checks

def tolerance_ratios(out, expected, rtol: float, atol: float):
    """|out - expected| / (atol + rtol |expected|) element by element, fp32: each output passes where it is <= 1."""
    out, expected = out.float(), expected.float()
    return (out - expected).abs() / (atol + rtol * expected.abs())


def tolerance_ratio(out, expected, rtol: float, atol: float) -> float:
    """The worst of tolerance_ratios: the official check passes when it is <= 1. Non-finite outputs give inf."""
    import torch

    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float(tolerance_ratios(out, expected, rtol, atol).max().item())


def poison(*tensors) -> None:
    """Fill output buffers with NaN (or all ones bits for integers) so an unwritten element cannot pass."""
    for t in tensors:
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(-1)


def poison_allocator(nbytes: int = 8 << 30) -> None:
    """Fill memory torch's caching allocator hands out next with NaN (half of what is free, up to nbytes): an output
    or workspace element a kernel forgets to write then reads NaN instead of a plausible stale value."""
    import torch

    free = torch.cuda.mem_get_info()[0]
    buf = torch.empty(min(nbytes, free // 2) // 2, dtype=torch.float16, device="cuda")
    buf.fill_(float("nan"))
    del buf


# ----------------------------------------------------------------------------------------------------------------
# results

@dataclass(frozen=True)
class Row:
    """One measured figure. metric: one of METRICS; case: the official case line, or "geomean"; backend: a backend
    name, a peer's name, or "<backend>/<stage>" for one stage of a backend's call."""
    gpu: str
    world_size: int
    backend: str
    metric: str
    case: str
    us: float
    date: str = ""

    def values(self) -> tuple:
        date = self.date or datetime.date.today().isoformat()
        # two decimals, but three significant digits under 0.01 (a cached import takes ~0.0006 s, not 0.00)
        figure = f"{self.us:.2f}" if abs(self.us) >= 0.01 or self.us == 0 else f"{self.us:.3g}"
        return (date, self.gpu, self.world_size, self.backend, self.metric, self.case, figure)


def results_dir() -> Path:
    """$KBENCH_RESULTS, else benchmarks/results under the current folder (run the scripts from the checkout)."""
    return Path(os.environ.get("KBENCH_RESULTS") or Path.cwd() / "benchmarks" / "results")


def record(problem: str, rows: Iterable[Row], folder: Path | None = None) -> Path:
    """Append rows to <folder>/<problem>.csv (header written when the file is new)."""
    problems.problem_dir(problem)  # an unknown problem is refused, not given a file
    rows = list(rows)
    for r in rows:
        if r.metric not in METRICS:
            raise ValueError(f"metric {r.metric!r}: choose one of {', '.join(METRICS)}")
    path = (folder or results_dir()) / f"{problem}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    _append(path, [r.values() for r in rows])
    return path


def _append(path: Path, rows: list) -> None:
    """Append rows (COLUMNS' values in order) to the CSV at path, the header first where the file is new. Lines end
    in LF like the rest of the file (csv's default CRLF, appended to files written with LF, had mixed the two)."""
    new = not path.is_file()
    with open(path, "a", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        if new:
            w.writerow(COLUMNS)
        w.writerows(rows)


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def merge(src: Path, dst: Path, rename: Callable[[str], str] | None = None) -> int:
    """Append the rows of every <src>/<problem>.csv to <dst>/<problem>.csv, backends passed through ``rename``
    (a session that measured an experiment under the name of the backend); returns how many rows moved."""
    moved = 0
    for path in sorted(Path(src).glob("*.csv")):
        rows = read(path)
        if rename:
            for r in rows:
                r["backend"] = rename(r["backend"])
        _append(Path(dst) / path.name, [[r[c] for c in COLUMNS] for r in rows])
        moved += len(rows)
    return moved


def rows_from_record(record: dict, backend: str, metric: str | None = None, against: str | None = None) -> list[Row]:
    """The per-case means and the score of a ``kbench perf --json`` record as rows (metric: the record's mode), then,
    where the record kept them, the submission's import time (metric "import", seconds: load_inline's build inside
    it) and the per-case medians and their geomean (metric + "-median": the figure a few slow runs of the machine
    cannot move, for comparing runs on one machine; the score is the means'). A ``--rounds`` record gives a score row
    for every round instead of the last one's, and with ``against`` (the backend name of ``--against``'s file) that
    file's scores too: the per-case rows are the submission's last round."""
    metric = metric or ("official" if record["mode"] == "benchmark" else "leaderboard")
    env = record.get("environment") or {}
    gpu, ws = env.get("gpu") or record["device"], record.get("world_size") or 1
    passed = [c for c in record["cases"] if c["status"] == "pass" and c.get("mean_ns")]
    rows = [Row(gpu, ws, backend, metric, problems.format_case(c["case"]), c["mean_ns"] / 1e3) for c in passed]
    names = {"submission": backend, "against": against}
    scores = [(names[r["file"]], r["score_s"]) for r in record.get("rounds") or () if r.get("passed")] or \
        [(backend, record.get("score_s"))]
    rows += [Row(gpu, ws, name, metric, "geomean", score * 1e6) for name, score in scores if name and score]
    if env.get("import_s") is not None:
        rows.append(Row(gpu, ws, backend, "import", IMPORT_CASE, env["import_s"]))
    medians = [c["median_ns"] / 1e3 for c in passed if c.get("median_ns")]
    if medians and len(medians) == len(passed):
        rows += [Row(gpu, ws, backend, f"{metric}-median", problems.format_case(c["case"]), us)
                 for c, us in zip(passed, medians)]
        if record.get("score_s"):  # every case passed
            rows.append(Row(gpu, ws, backend, f"{metric}-median", "geomean", geomean(medians)))
    return rows


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table (rich), numbers right-aligned; the scripts print theirs last so a device reply ends with it."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*("—" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v) for v in r))
    Console(width=max(100, len(columns) * 12)).print(t)


def knobs(settings: Mapping[str, str]):
    """Set environment knobs for the duration (the KBENCH_* variables a CUDA backend reads on every call,
    kernels/_common/knobs.h), then restore the environment: how a benchmark times a candidate beside the default."""
    return unittest.mock.patch.dict(os.environ, settings)


def selected(candidates: Mapping[str, Mapping[str, str]], names: str) -> dict[str, Mapping[str, str]]:
    """The candidates named in ``names`` (comma-separated keys of ``candidates``); an unknown name exits, naming
    the choices."""
    wanted = [n for n in names.split(",") if n]
    for name in wanted:
        if name not in candidates:
            raise SystemExit(f"unknown candidate {name!r}: choose from {', '.join(candidates)}")
    return {n: candidates[n] for n in wanted}


def checked_candidates(candidates: Mapping[str, Mapping[str, str]], names: str,
                       check: Callable[[], list[str]]) -> tuple[list[str], list[str]]:
    """Run ``check`` (-> failure lines) under the knobs of each candidate named in ``names`` (comma-separated keys
    of ``candidates``). Returns (the names that passed, to be timed; the failures of the others, "cuda+<name>: ...")."""
    passed, failures = [], []
    for name in selected(candidates, names):
        with knobs(candidates[name]):
            wrong = check()
        failures += [f"cuda+{name}: {w}" for w in wrong]
        passed += [] if wrong else [name]
    return passed, failures


def checked_revisions(problem: str, backend: str, revs: Sequence[str], check: Callable[[Any], list[str]],
                      dev: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Build ``backend`` as it was at each git revision in ``revs`` (dev: with its dev functions, as build's) and
    run ``check(module)`` (-> failure lines). Returns ({"<backend>@<rev>": module} of those that passed, to be
    timed; the failures of the others)."""
    passed, failures = {}, []
    for rev in revs:
        mod = build(problem, backend, dev=dev, rev=rev)
        label = revision_label(backend, rev)
        wrong = [f"{label}: {w}" for w in check(mod)]
        failures += wrong
        passed.update({} if wrong else {label: mod})
    return passed, failures


def official_figures(problem: str, backend: str, candidates: Mapping[str, Mapping[str, str]],
                     modes: Sequence[str] = ("benchmark",), rounds: int = 1) -> list[Row]:
    """Judge ``backend`` as shipped and under each candidate's knobs with ``kbench perf PROBLEM --mode MODE`` (one
    worker process each, the official protocol), record the rows (backend "<backend>+<name>" for a candidate) and
    return them. A run that fails or crashes adds no rows; its output is printed. With rounds > 1 every odd round
    runs the list backwards (A B, B A, ...): a machine that speeds up or slows down over the session then favours
    no configuration."""
    rows = []
    configs = [("", {})] + list(candidates.items())
    for mode, r in ((m, r) for m in modes for r in range(rounds)):
        for name, settings in (configs[::-1] if r % 2 else configs):
            label = f"{backend}+{name}" if name else backend
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "record.json"
                cmd = [sys.executable, "-m", "kbench", "perf", problem, "--backend", backend, "--mode", mode,
                       "--json", str(path)]
                done = subprocess.run(cmd, env={**os.environ, **settings}, capture_output=True, text=True)
                print(f"{label} ({mode}): rc={done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}",
                      flush=True)
                got = rows_from_record(json.loads(path.read_text()), label) if path.is_file() else []
            record(problem, got)  # each run's rows at once: a session cut off later keeps them
            rows += got
    table(f"{problem}: official-protocol scores (us)", ["backend", "metric", "geomean"],
          [[r.backend, r.metric, r.us] for r in rows if r.case == "geomean"])
    return rows

# ----------------------------------------------------------------------------------------------------------------
# README tables: made from the results files, never typed

README_BEGIN = "<!-- results:begin (made by `python benchmarks/readme_tables.py` from benchmarks/results/*.csv) -->"
README_END = "<!-- results:end -->"
SUMMARY_BEGIN = "<!-- summary:begin (made by `python benchmarks/readme_tables.py` from benchmarks/results/*.csv) -->"
SUMMARY_END = "<!-- summary:end -->"
SUMMARY_BACKENDS = ("cuda", "torch")  # the shipped kernels and the baseline every problem has


def _case_labels(cases: Sequence[str]) -> dict[str, str]:
    """Short labels: only the keys whose values differ between the cases that have them (the seed only where labels
    would clash; a case measured outside the official set may lack keys the official ones share)."""
    whole_run = ("geomean", IMPORT_CASE)  # a figure of the whole run, not a case
    parsed = {c: dict(kv.split(": ", 1) for kv in c.split("; ")) for c in cases if c not in whole_run}
    keys = [k for c in parsed.values() for k in c]
    varying = [k for k in dict.fromkeys(keys) if len({c[k] for c in parsed.values() if k in c}) > 1]
    labels = {c: "; ".join(f"{k}: {v[k]}" for k in varying if k != "seed" and k in v) for c, v in parsed.items()}
    if len(set(labels.values())) < len(labels):
        labels = {c: "; ".join(f"{k}: {v[k]}" for k in varying if k in v) for c, v in parsed.items()}
    return {**{c: (label or c) for c, label in labels.items()}, "geomean": "**geomean**", IMPORT_CASE: IMPORT_CASE}


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
            ["| " + " | ".join(r) + " |" for r in rows])


def results_markdown(folder: Path) -> str:
    """Markdown tables of every <folder>/<problem>.csv. Per problem and per (metric, GPU, world size): cases x
    backends, each cell the latest figure (us, or the metric's UNITS); "<backend>/<stage>" rows go to a table of
    stages below it, each (backend, case) row with the stages of its latest date only."""
    order = {m: i for i, m in enumerate(METRICS)}
    out = []
    for path in sorted(Path(folder).glob("*.csv")):
        rows = read(path)
        labels = _case_labels(list(dict.fromkeys(r["case"] for r in rows)))
        out.append(f"#### {path.stem}")
        groups = dict.fromkeys((r["metric"], r["gpu"], r["world_size"]) for r in rows)
        for metric, gpu, ws in sorted(groups, key=lambda g: (order.get(g[0], 99), g[1], int(g[2]))):
            sel = [r for r in rows if (r["metric"], r["gpu"], r["world_size"]) == (metric, gpu, ws)]
            latest = {(r["backend"], r["case"]): r for r in sorted(sel, key=lambda r: r["date"])}
            cases = list(dict.fromkeys(r["case"] for r in sel if r["case"] != "geomean"))
            cases += ["geomean"] if any(r["case"] == "geomean" for r in sel) else []
            backends = list(dict.fromkeys(r["backend"] for r in sel))
            dates = sorted({r["date"] for r in sel})
            span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
            out += ["", f"{metric} · {gpu} · world size {ws} · {span} ({UNITS.get(metric, 'µs')})", ""]

            def cell(b, c):
                r = latest.get((b, c))
                return f"{float(r['us']):.1f}" if r else "—"

            whole = [b for b in backends if "/" not in b]
            if whole:  # the cases some whole backend has (a stage may be measured on cases of its own)
                out += _markdown(["case"] + whole, [[labels[c]] + [cell(b, c) for b in whole] for c in cases
                                                    if any((b, c) in latest for b in whole)])
            stages = [b for b in backends if "/" in b]
            if stages:
                owners = list(dict.fromkeys(b.split("/", 1)[0] for b in stages))
                names = list(dict.fromkeys(b.split("/", 1)[1] for b in stages))
                # a breakdown is one measurement: stages of an owner's earlier builds (gone since) are left out
                newest = {}
                for (b, c), r in latest.items():
                    if "/" in b:
                        key = (b.split("/", 1)[0], c)
                        newest[key] = max(newest.get(key, ""), r["date"])

                def stage_cell(o, n, c):
                    r = latest.get((f"{o}/{n}", c))
                    return cell(f"{o}/{n}", c) if r and r["date"] == newest[(o, c)] else "—"

                names = [n for n in names if any(stage_cell(o, n, c) != "—" for o in owners for c in cases)]
                out += ([""] if whole else []) + _markdown(["stages of", "case"] + names,
                                        [[o, labels[c]] + [stage_cell(o, n, c) for n in names]
                                         for o in owners for c in cases
                                         if any((f"{o}/{n}", c) in latest for n in names)])
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def summary_markdown(folder: Path) -> str:
    """One table of the official scores: per problem, GPU and world size, the geomean of each of SUMMARY_BACKENDS on
    the latest date it was measured: the median of that date's rows, with their spread where there are several (one
    machine differs from the next by a few %, the multi-GPU windows by more), and torch's over cuda's."""
    header = ["problem", "GPU", "world size"] + [f"{b} (µs)" for b in SUMMARY_BACKENDS] + ["torch / cuda", "dates"]
    lines = []
    for path in sorted(Path(folder).glob("*.csv")):
        rows = [r for r in read(path) if r["metric"] == "official" and r["case"] == "geomean"
                and r["backend"] in SUMMARY_BACKENDS]
        for gpu, ws in sorted(dict.fromkeys((r["gpu"], r["world_size"]) for r in rows), key=lambda g: (g[0], int(g[1]))):
            sel = sorted((r for r in rows if (r["gpu"], r["world_size"]) == (gpu, ws)), key=lambda r: r["date"])
            median, dates, cells = {}, {}, []
            for b in SUMMARY_BACKENDS:
                mine = [r for r in sel if r["backend"] == b]
                if not mine:
                    cells.append("—")
                    continue
                dates[b] = mine[-1]["date"]
                day = [float(r["us"]) for r in mine if r["date"] == dates[b]]
                median[b] = statistics.median(day)
                spread = f" ({min(day):.1f}–{max(day):.1f}, {len(day)} runs)" if len(day) > 1 else ""
                cells.append(f"{median[b]:.1f}{spread}")
            if "cuda" not in median:
                continue
            ratio = f"{median['torch'] / median['cuda']:.2f}x" if "torch" in median else "—"
            lines.append([path.stem, gpu, ws] + cells + [ratio, " / ".join(dict.fromkeys(dates.values()))])
    return "\n".join(_markdown(header, lines)) + "\n"


def _rewrite(text: str, begin: str, end: str, fresh: str) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"the README lacks the markers {begin!r} ... {end!r}")
    return head + begin + fresh + end + tail


def update_readme(readme: Path, folder: Path, check: bool = False) -> bool:
    """Rewrite the README's blocks between SUMMARY_BEGIN / SUMMARY_END (summary_markdown) and README_BEGIN /
    README_END (results_markdown) from the results; True if both were current. check=True only compares."""
    text = readme.read_text()
    fresh = _rewrite(text, SUMMARY_BEGIN, SUMMARY_END, "\n" + summary_markdown(folder))
    fresh = _rewrite(fresh, README_BEGIN, README_END, "\n" + results_markdown(folder) + "\n")
    if fresh == text:
        return True
    if not check:
        readme.write_text(fresh)
    return False
