"""A backend called a few times on each official benchmark case's inputs, nothing else: the process for a profiler
(ncu, nsys) to attach to, or (--timeline) the steady state's device timeline under the torch profiler.

    python benchmarks/calls.py moe --backend cuda --calls 2
    ncu --kernel-name regex:grouped_gemm --launch-skip 2 --launch-count 2 python benchmarks/calls.py moe --calls 2
    python benchmarks/calls.py mla-decode --timeline --calls 5 --record

Each case: inputs generated once, `--calls` calls in a row (the first builds caches and graphs), synchronised.
--timeline: `--warmup` calls first (past the first call's capture, onto the replayed graphs), then `--calls` calls
under the profiler, each on the inputs the harness would give it (a clone where the problem's protocol clones) and
synchronised, as the official window times them; printed per kernel position, medians over the calls: where it
starts after the call's host start, how long it runs and how long the device sat idle before it. The first kernel's
start is the host's time to the GPU (Python, the launch); the idle column inside a replayed graph is the graph's own
gaps. The profiler adds host time to every launch, so read the first start as an upper bound.
"""
from __future__ import annotations

import argparse
import datetime
import re

import torch

from kbench import benchlib, problems
from kbench.evaluator import guards, timing

guards.torch = torch  # (the harness sets it when it starts; the clone below is the harness's own)


def short_name(kernel: str) -> str:
    """A kernel's name without its return type, template arguments and parameters: `void kb::f<1>(int)` -> `kb::f`."""
    name = re.sub(r"^void\s+", "", kernel.strip()).replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or kernel[:60]


def timeline(mod, data, clone_inputs: bool, warmup: int, calls: int) -> list[list[tuple[str, float, float, float]]]:
    """`calls` profiled calls after `warmup` plain ones, each synchronised: call_timelines' rows a call."""
    def given():
        return guards.clone(data) if clone_inputs else data

    for _ in range(warmup):
        mod.custom_kernel(given())
        torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            inputs = given()
            torch.cuda.synchronize()
            with record_function(f"kbench-call-{i}"):
                mod.custom_kernel(inputs)
                torch.cuda.synchronize()
            del inputs
    events = timing.trace_events(prof)
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("kbench-call-"))
    return timing.call_timelines(timing.work_of(events), windows)


def summarize(timelines: list[list[tuple[str, float, float, float]]]) -> list[tuple[str, float, float, float]]:
    """Medians per kernel position over the calls whose kernel sequence is the most common one."""
    names = [tuple(short_name(r[0]) for r in t) for t in timelines if t]
    if not names:
        return []
    common = max(set(names), key=names.count)
    same = [t for t in timelines if tuple(short_name(r[0]) for r in t) == common]
    return [(name, *(benchlib.median([t[i][j] for t in same]) for j in (1, 2, 3))) for i, name in enumerate(common)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--timeline", action="store_true", help="profile the calls after --warmup ones (see above)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--record", action="store_true", help="with --timeline: the medians to benchmarks/results")
    ap.add_argument("--label", help="with --record: the rows' backend name (default: --backend), e.g. for a knob set")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("calls.py: needs a CUDA GPU (run it on the device machine: bash benchmarks/gpu_session.sh "
                         "timeline)")
    mod = benchlib.build(args.problem, args.backend)
    spec = problems.load_spec(args.problem)
    ref = problems.load_modules(args.problem).reference
    gpu = torch.cuda.get_device_name()
    for case in spec.benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        label = problems.format_case(case)
        if not args.timeline:
            for _ in range(args.calls):
                mod.custom_kernel(data)
            torch.cuda.synchronize()
            print(f"{label}: {args.calls} calls", flush=True)
            del data
            continue
        rows = summarize(timeline(mod, data, spec.protocol.clone_inputs, args.warmup, args.calls))
        del data
        benchlib.table(f"{args.problem} {args.backend}, {label}: medians of {args.calls} calls (us)",
                       ["#", "kernel", "starts at", "runs", "idle before"],
                       [(i, name[:60], f"{s:.1f}", f"{d:.1f}", f"{g:.1f}") for i, (name, s, d, g) in enumerate(rows)])
        if not rows:
            continue
        end = max(s + d for _, s, d, _ in rows)
        _, busy = timing.device_gaps([(s, d) for _, s, d, _ in rows])  # (kernels of two streams overlap)
        totals = {"to-first": rows[0][1], "busy": busy, "idle": sum(g for *_, g in rows[1:]), "end": end}
        print("  " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()), flush=True)
        if args.record:
            tag = f"{args.label or args.backend}[timeline]"
            # (a figure is a positive time: an idle of 0 is left out, and its cell reads as not measured)
            out = [benchlib.Row(gpu, 1, f"{tag}/{k}", "timeline", label, v) for k, v in totals.items() if v > 0]
            out += [benchlib.Row(gpu, 1, f"{tag}/{i}:{name}", "timeline", label, d)
                    for i, (name, _, d, _) in enumerate(rows)]
            benchlib.record(args.problem, out)
    print(f"({datetime.date.today()}, {gpu})")


if __name__ == "__main__":
    main()
