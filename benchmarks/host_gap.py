"""Where the official figure goes beyond the device's time: the official benchmark loop of a single-GPU problem
replayed in one process, with CUDA events inside each host-clock window and the SM clock read after each run.

    python benchmarks/host_gap.py mla-decode --backend cuda --runs 40      # table last; rows into results/

Per benchmark case, in the spec's order and after the warm-up case (as the harness runs them): inputs generated
once, one call checked against the reference (untimed), then --runs timed calls the official way (synchronize,
host clock, call, synchronize, host clock; no L2 flush; inputs cloned before each run where the protocol clones)
with a pair of CUDA events recorded around the same call. Then --runs more calls with the L2 flushed before each
(benchmarks' usual event timer) on the same inputs. Columns (us, means over the runs):
  host    the official window (what `kbench perf` averages)
  device  the CUDA events inside that window: the GPU's span of the call
  host-device  host time not covered by the events (the events only bracket the call, so a GPU waiting for the host
          inside the call counts as device time: compare with the kernels' sum under --profile)
  issue   host time until the call returned, before the closing synchronize
  flushed the CUDA events with an L2 flush before each call
  MHz     the SM clock after the runs (min / median), from NVML when pynvml imports
Rows: metric host-loop, backend "<backend>/host", "<backend>/device", "<backend>/flushed", "<backend>/issue"
(<backend>: --label where given).
--cprofile: the Python profile (cProfile, top 15 by cumulative time) of the timed runs of each case.
--no-clone: the same input objects every run where the protocol clones them before each window (rows under
"<backend>[no-clone]/..."): what the clone between windows (for moe 2.9 GB of weights) does to the call after it.
--leaderboard: the inputs of every run regenerated as leaderboard mode does (the case seed + 13 (i + 1), generated
while the previous run's inputs are still held, then cloned where the protocol clones), so they move between runs;
rows under "<backend>[leaderboard]/..." (the flushed column then regenerates too). --check-each: every run's output
checked after its window too, as leaderboard mode does (rows "<backend>[leaderboard+check]/...").
--profile N: then N more runs of the official window under the torch profiler, and per kernel (CUPTI's trace: the
kernels inside a replayed graph count) the launches a run and the mean / min / max duration: which kernel varies.
--addresses: per case, the input address sets of the timed runs as letters (a set seen before gets its first letter
again: "ABAB..." alternates between two), the inputs whose addresses moved, and the graphs the binding launched
(its fast-replay count, where the backend has one): whether a graph keyed on addresses can ever replay in that loop.
--host-trace N: then N more runs under the profiler with the host's side recorded too: per top-level torch op and
CUDA runtime call inside the window, the calls a run and the mean host time, longest total first (a call that blocks
the host, an allocation that reaches cudaMalloc, a slow launch), and the last window's timeline (host events and
kernels, us from the window's start).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import time

import torch

from kbench import benchlib, problems
from kbench.evaluator import guards, timing

guards.torch = torch  # the harness sets it when it starts; guards.clone needs it


def sm_clock():
    """A function returning the SM clock in MHz, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # no pynvml, or no NVML on this machine
        return lambda: None


def timed_runs(call, given_for_run, runs: int, flush=None, clock=lambda: None, seen=None):
    """runs x (host us, device us, SM MHz, issue us): the official host window with CUDA events inside it; issue is
    the host time until the call returned (before the closing synchronize). seen: a list that gets each run's
    inputs as ((path, address), ...) (read before the window)."""
    out = []
    for _ in range(runs):
        given = given_for_run()
        if seen is not None:
            seen.append(tuple((path, t.data_ptr()) for path, t in guards.leaves(given)))
        if flush is not None:
            flush()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter_ns()
        start.record()
        result = call(given)
        issue = (time.perf_counter_ns() - t0) / 1e3
        end.record()
        torch.cuda.synchronize()
        host = (time.perf_counter_ns() - t0) / 1e3
        out.append((host, start.elapsed_time(end) * 1e3, clock(), issue))
        if getattr(given_for_run, "check", None):  # leaderboard mode checks every run, after its window
            given_for_run.check(result)
        del result, given
    return out


def reseeded_inputs(ref, case, data, clone_inputs: bool, step: int, check_each: bool = False):
    """A given_for_run for timed_runs that regenerates the inputs as leaderboard mode does: run i's seed is the
    case's + step * (i + 1), generated while the previous run's inputs are still held (the harness rebinds its
    `data` after generating), then cloned where the protocol clones. check_each: its `check(result)` checks each
    run's output as leaderboard mode does (against the original where the submission got a clone, else against a
    deep copy made before the call), so that the reference's work between the windows is there too."""
    base = problems.official_case(case)
    held = {"data": data, "i": 0}

    def given():
        held["i"] += 1
        held["data"] = ref.generate_input(**dict(base, seed=base["seed"] + step * held["i"]))
        if clone_inputs:
            return guards.clone(held["data"])
        if check_each:
            held["copy"] = guards.clone(held["data"], deep=True)
        return held["data"]

    def check(result):
        ok, msg = ref.check_implementation(held["data"] if clone_inputs else held.pop("copy"), result)
        if not ok:
            raise SystemExit(f"leaderboard run {held['i']} fails: {msg}")
    given.check = check if check_each else None
    return given


def address_pattern(sets: list) -> tuple[str, list[str]]:
    """(one letter a run, a new letter for each address set not seen before; the paths whose address changed at
    least once), from timed_runs' seen list."""
    letters, names = {}, []
    for s in sets:
        letters.setdefault(tuple(a for _, a in s), chr(ord("A") + len(letters)) if len(letters) < 26 else "*")
        names.append(letters[tuple(a for _, a in s)])
    moved = [path for i, (path, a) in enumerate(sets[0]) if any(s[i][1] != a for s in sets[1:])] if sets else []
    return "".join(names), moved


def fast_replays(mod) -> int | None:
    """The graphs the backend's binding launched itself since the last read (its *_fast_replays()), or None."""
    fn = next((getattr(mod.ext, n) for n in dir(getattr(mod, "ext", None)) if n.endswith("_fast_replays")), None)
    return fn() if fn is not None else None


def kernel_spread(call, given_for_run, runs: int) -> list[list[str]]:
    """runs calls in the official window under the torch profiler: per kernel name, [name, launches a run, mean,
    min, max us], the longest total first."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timed_runs(call, given_for_run, runs)
    durations = collections.defaultdict(list)
    for name, _, dur in timing.device_work(prof):
        durations[name[:60]].append(float(dur))
    ordered = sorted(durations.items(), key=lambda kv: -sum(kv[1]))
    busy = sum(sum(d) for d in durations.values()) / runs
    return [["(all kernels and copies: busy a run)", "", f"{busy:.1f}", "", ""]] + \
        [[name, f"{len(d) / runs:.1f}", f"{statistics.mean(d):.1f}", f"{min(d):.1f}", f"{max(d):.1f}"]
         for name, d in ordered[:14]]


WINDOW = "kbench.window"


def windowed_call(call):
    """call, each run inside a profiler annotation marking the official window."""
    def run(given):
        with torch.profiler.record_function(WINDOW):
            return call(given)
    return run


def host_events(call, given_for_run, runs: int):
    """runs calls under the profiler (host and device): (per-name rows, last window's timeline). A row: [kind, name,
    calls a run, mean us, total us a run]; kinds: op (a top-level torch op), rt (a CUDA runtime or driver call)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed_runs(windowed_call(call), given_for_run, runs)
    events = [e for e in timing.trace_events(prof) if "dur" in e and "ts" in e]
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("name") == WINDOW and e.get("cat") == "user_annotation")
    kinds = {"cpu_op": "op", "cuda_runtime": "rt", "cuda_driver": "rt", "kernel": "gpu", "gpu_memcpy": "gpu",
             "gpu_memset": "gpu"}
    per_name = collections.defaultdict(list)
    timeline = []
    for w0, w1 in windows:
        inside = sorted((e for e in events if e.get("cat") in kinds and w0 <= e["ts"] < w1), key=lambda e: e["ts"])
        covered = -1.0  # the end of the current top-level op: ops inside it are its callees
        for e in inside:
            kind = kinds[e["cat"]]
            if kind == "op":
                if e["ts"] < covered:
                    continue
                covered = e["ts"] + e["dur"]
            if kind != "gpu":
                per_name[(kind, e["name"][:70])].append(e["dur"])
            if (w0, w1) == windows[-1]:
                timeline.append([kind, e["name"][:70], f"{e['ts'] - w0:.1f}", f"{e['dur']:.1f}"])
    n = max(len(windows), 1)
    rows = sorted(([kind, name, f"{len(d) / n:.1f}", f"{statistics.mean(d):.1f}", f"{sum(d) / n:.1f}"]
                   for (kind, name), d in per_name.items()), key=lambda r: -float(r[4]))
    return rows, timeline


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--cprofile", action="store_true", help="cProfile the timed runs (top 15 functions a case)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="N more runs under the profiler per case")
    ap.add_argument("--check-each", action="store_true",
                    help="with --leaderboard: check every run's output after its window, as leaderboard mode does")
    ap.add_argument("--host-trace", type=int, default=0, metavar="N",
                    help="N more runs under the profiler with host events: what the host spends the window on")
    ap.add_argument("--rev", metavar="REV", help="the backend as it was at this git revision (or a carried kernels "
                    "folder, benchlib.kernels_at); rows under benchlib.revision_label")
    ap.add_argument("--label", help="the rows' backend name (a build run with a knob set, e.g. cuda[full-key])")
    ap.add_argument("--no-clone", action="store_true",
                    help="the same input objects every run where the protocol clones them before each (rows under "
                         "'<backend>[no-clone]/...'): what the clone between windows does to the call after it")
    ap.add_argument("--addresses", action="store_true",
                    help="the timed runs' input address sets as letters, the inputs that moved, the fast replays")
    ap.add_argument("--leaderboard", action="store_true",
                    help="regenerate the inputs every run as leaderboard mode does (they move between runs)")
    args = ap.parse_args()
    spec = problems.load_spec(args.problem)
    if spec.distributed:
        raise SystemExit(f"{args.problem} is distributed: its official window is the ranks' "
                         "(benchmarks/distributed.py)")
    mod = benchlib.build(args.problem, args.backend, rev=args.rev)
    label_backend = args.label or (benchlib.revision_label(args.backend, args.rev) if args.rev else args.backend)
    if args.check_each and not args.leaderboard:
        raise SystemExit("--check-each goes with --leaderboard (benchmark mode checks only the first call)")
    if args.leaderboard:
        label_backend += "[leaderboard+check]" if args.check_each else "[leaderboard]"
    if args.no_clone and args.leaderboard:
        raise SystemExit("--no-clone goes without --leaderboard (leaderboard mode's inputs are new every run)")
    if args.no_clone:
        label_backend += "[no-clone]"
    ref = problems.load_modules(args.problem).reference
    clone_inputs = spec.protocol.clone_inputs
    flush_buf = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    clock = sm_clock()
    gpu = torch.cuda.get_device_name()
    rows, table, spreads = [], [], []
    for label, case in [("warm-up", spec.tests[0])] + [("", c) for c in spec.benchmarks]:
        data = ref.generate_input(**problems.official_case(case))
        given, check = (guards.clone(data), data) if clone_inputs else (data, guards.clone(data, deep=True))
        ok, msg = ref.check_implementation(check, mod.custom_kernel(given))
        del check
        line = problems.format_case(case)
        print(f"{label or 'case'} {line}: {'ok' if ok else msg}", flush=True)
        if not ok:
            raise SystemExit(f"{label_backend} fails {line}: fix it before timing")
        next_given = (lambda: guards.clone(data)) if clone_inputs and not args.no_clone else (lambda: data)
        if args.leaderboard:
            next_given = reseeded_inputs(ref, case, data, clone_inputs, spec.protocol.reseed_step, args.check_each)
        if label:
            timed_runs(mod.custom_kernel, next_given, 3)
            continue
        profiler = cProfile.Profile() if args.cprofile else None
        if profiler:
            profiler.enable()
        seen = [] if args.addresses else None
        fast_replays(mod)
        plain = timed_runs(mod.custom_kernel, next_given, args.runs, clock=clock, seen=seen)
        if seen is not None:
            pattern, moved = address_pattern(seen)
            print(f"addresses of {args.runs} runs, {line}: {pattern}; fast replays {fast_replays(mod)}; moved "
                  f"({len(moved)} of {len(seen[0]) if seen else 0}): {', '.join(moved[:8])}"
                  f"{' ...' if len(moved) > 8 else ''}", flush=True)
        if profiler:
            profiler.disable()
            print(f"cProfile of {args.runs} timed runs, {line}:")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
        flushed = timed_runs(mod.custom_kernel, next_given, args.runs, flush=lambda: flush_buf.fill_(42), clock=clock)
        host, dev, issue = [r[0] for r in plain], [r[1] for r in plain], [r[3] for r in plain]
        mhz = [r[2] for r in plain + flushed if r[2] is not None]
        fl = [r[1] for r in flushed]
        means = {"host": statistics.mean(host), "device": statistics.mean(dev), "flushed": statistics.mean(fl),
                 "issue": statistics.mean(issue)}
        rows += [benchlib.Row(gpu, 1, f"{label_backend}/{k}", "host-loop", line, v) for k, v in means.items()]
        table.append([line.split("; seed")[0], f"{means['host']:.1f}", f"{statistics.median(host):.1f}",
                      f"{means['device']:.1f}", f"{statistics.median(dev):.1f}",
                      f"{means['host'] - means['device']:.1f}", f"{statistics.mean(issue):.1f}",
                      f"{means['flushed']:.1f}",
                      " ".join(f"{h:.0f}/{d:.0f}" for h, d in zip(host[:4], dev[:4])),
                      f"{min(mhz)}/{statistics.median(mhz):.0f}" if mhz else "—"])
        if args.profile:
            spreads.append((line, kernel_spread(mod.custom_kernel, next_given, args.profile)))
        if args.host_trace:
            per_name, timeline = host_events(mod.custom_kernel, next_given, args.host_trace)
            benchlib.table(f"host time in the window, {args.host_trace} runs: {line}",
                           ["kind", "name", "a run", "mean", "total a run"], per_name[:25])
            benchlib.table(f"the last window's timeline: {line}", ["kind", "name", "start", "dur"], timeline[:120])
        del data, given
    for line, spread in spreads:
        benchlib.table(f"kernels over {args.profile} runs of the official window: {line}",
                       ["kernel", "a run", "mean", "min", "max"], spread)
    benchlib.record(args.problem, rows)
    benchlib.table(f"{args.problem} {label_backend}: the official window, {args.runs} runs a column ({gpu})",
                   ["case", "host", "host med", "device", "device med", "host-device", "issue", "flushed",
                    "first runs host/device", "MHz min/med"], table)


if __name__ == "__main__":
    main()
