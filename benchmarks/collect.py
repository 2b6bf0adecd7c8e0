"""Bring measured figures into benchmarks/results/<problem>.csv: the rows a GPU session wrote (benchmark scripts) and
the `kbench perf --json` records it kept (official = benchmark mode, leaderboard).

    python benchmarks/collect.py rows SESSION/results [--rename OLD=NEW ...]
    python benchmarks/collect.py record perf.json --backend cuda [--against torch] [--rename ...]
    python benchmarks/collect.py profile LOG --problem P --backend cuda --gpu G --kernel NAME=REGEX [...]
    python benchmarks/collect.py ncu LOG --problem P --backend cuda --gpu G --kernel NAME=REGEX [...]

profile: a `kbench profile` log (one torch profiler table a case, headed "#i <case>"); each kernel matching REGEX
becomes a row "<backend>/NAME", metric profiler, its CUDA time per call. ncu: an Nsight Compute log of
benchmarks/calls.py with gpu__time_duration.sum among its metrics; each profiled launch belongs to the case line
calls.py printed after it started, and becomes a row "<backend>/NAME", metric ncu (ncu flushes the caches first).

--rename relabels a backend (and its "<backend>/<stage>" rows) when a session measured a build that is not the one
the backend name now stands for (an experiment that was reverted, an earlier version).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from kbench import benchlib

RESULTS = Path(__file__).resolve().parent / "results"


def renamed(backend: str, renames: dict[str, str]) -> str:
    head, sep, tail = backend.partition("/")
    return renames.get(head, head) + sep + tail


# microseconds per unit, as the torch profiler ("us") and Nsight Compute ("usecond") print them
_UNIT_US = {"us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def _us(text: str) -> float:
    """'256.294us', '1.2ms' or '259.10 usecond' -> microseconds."""
    m = re.fullmatch(r"([0-9.,]+)\s*([a-z]+)", text.strip())
    if not m or m.group(2) not in _UNIT_US:
        raise ValueError(f"not a time: {text!r}")
    return float(m.group(1).replace(",", "")) * _UNIT_US[m.group(2)]


def profile_rows(log: str, gpu: str, backend: str, kernels: dict[str, str]) -> list[benchlib.Row]:
    """Rows from a `kbench profile` log: per case ("#i <case>"), the CUDA time per call (the table's "CUDA time avg"
    column, the second to last) of each kernel whose name matches a pattern of kernels (NAME -> regex)."""
    rows, case = [], None
    for line in log.splitlines():
        if m := re.match(r"#\d+ (\S.*)$", line):
            case = m.group(1).strip()
            continue
        cols = re.split(r"\s{2,}", line.strip())
        if case is None or len(cols) < 10:
            continue
        for name, pattern in kernels.items():
            if re.search(pattern, cols[0]):
                rows.append(benchlib.Row(gpu, 1, f"{backend}/{name}", "profiler", case, _us(cols[-2])))
    return rows


def ncu_rows(log: str, gpu: str, backend: str, kernels: dict[str, str]) -> list[benchlib.Row]:
    """Rows from an Nsight Compute log of benchmarks/calls.py: the k-th profiled launch ("==PROF== Profiling") ran in
    the case whose "<case>: N calls" line came next; its gpu__time_duration.sum (the k-th result section) is the
    figure, named after the pattern its kernel matches. A name list "a,b" names a case's successive launches of one
    kernel (moe's two GEMM 1 launches); launches past the list are left out."""
    launch_cases, pending = [], 0
    sections = []  # (kernel line, duration us)
    for line in log.splitlines():
        if line.startswith("==PROF== Profiling"):
            pending += 1
        elif m := re.match(r"(\S.*): \d+ calls$", line):
            launch_cases += [m.group(1)] * pending
            pending = 0
        elif line.startswith("  ") and not line.startswith("    ") and "(" in line:
            sections.append([line.strip(), None])
        elif "gpu__time_duration.sum" in line and sections:  # "<metric>  <unit>  <value>"
            *_, unit, value = line.split()
            sections[-1][1] = _us(f"{value} {unit}")
    rows, seen = [], {}  # (case, names) -> launches matched so far
    for (kernel, us), case in zip(sections, launch_cases):
        for names, pattern in kernels.items():
            if us is None or not re.search(pattern, kernel):
                continue
            listed = names.split(",")
            i = seen[case, names] = seen.get((case, names), -1) + 1
            if len(listed) == 1 or i < len(listed):
                rows.append(benchlib.Row(gpu, 1, f"{backend}/{listed[min(i, len(listed) - 1)]}", "ncu", case, us))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("rows", "record", "profile", "ncu"))
    ap.add_argument("path")
    ap.add_argument("--backend", help="record: the backend the record judged; profile, ncu: the rows' prefix")
    ap.add_argument("--problem", help="record: the problem (default: the record's own); profile, ncu: required")
    ap.add_argument("--against", metavar="NAME",
                    help="record: the backend name of a --rounds record's --against file (its scores become rows)")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    ap.add_argument("--gpu", help="profile, ncu: the GPU the log was made on (the logs do not say)")
    ap.add_argument("--kernel", action="append", default=[], metavar="NAME=REGEX",
                    help="profile, ncu: a kernel to keep and the stage name its rows get")
    args = ap.parse_args()
    renames = dict(r.split("=", 1) for r in args.rename)
    if args.kind in ("profile", "ncu"):
        if not (args.problem and args.backend and args.gpu and args.kernel):
            ap.error(f"{args.kind} needs --problem, --backend, --gpu and at least one --kernel NAME=REGEX")
        parse = profile_rows if args.kind == "profile" else ncu_rows
        rows = parse(Path(args.path).read_text(), args.gpu, args.backend,
                     dict(k.split("=", 1) for k in args.kernel))
        if not rows:
            raise SystemExit(f"{args.path}: no kernel matched {', '.join(args.kernel)}; check the patterns")
        benchlib.record(args.problem, rows, RESULTS)
        print(f"{args.problem}: {len(rows)} rows ({args.kind})")
        return
    if args.kind == "rows":
        moved = benchlib.merge(Path(args.path), RESULTS, rename=lambda b: renamed(b, renames))
        print(f"{moved} rows into {RESULTS}")
        return
    record = json.loads(Path(args.path).read_text())
    backend = renamed(args.backend or record["environment"].get("backend") or "submission", renames)
    if record.get("rounds") and any(r["file"] == "against" for r in record["rounds"]) and not args.against:
        ap.error("this record alternated with an --against file: name its backend with --against NAME")
    rows = benchlib.rows_from_record(record, backend, against=args.against and renamed(args.against, renames))
    benchlib.record(args.problem or record["problem"], rows, RESULTS)
    print(f"{record['problem']}: {len(rows)} rows ({', '.join(dict.fromkeys(r.metric for r in rows)) or 'none'})")


if __name__ == "__main__":
    main()
