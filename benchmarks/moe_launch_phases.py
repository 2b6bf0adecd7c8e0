"""The host's side of one official moe call, phase by phase: how long the cuda backend's custom_kernel keeps the host
busy before its graph reaches the GPU (docs/moe-notes.md, twenty-fifth session: at 2048 tokens ~100 us of the
official window has no kernel running).

    python benchmarks/moe_launch_phases.py --runs 30      # table last; rows into benchmarks/results/moe.csv

Per benchmark case: inputs generated once, the call checked, three calls to capture its graph, then --runs calls the
official way (inputs cloned, synchronize) with custom_kernel's steps taken one at a time under the host clock, as
kernels/moe/cuda/entry.py runs them: `prepare` (entry.prepare: the output, the launch that hands its address to the
graph, and the key: the inputs' addresses and the knobs; the twenty-fifth session's rows split it into
`alloc+publish` and `key`), `graph-launch` (the replay's cudaGraphLaunch), `verify` (the inputs' shapes and strides,
checked while the GPU runs), `gpu-rest` (the synchronize after them). Medians, us. Rows: metric host-loop, backend
"cuda[phases]/<phase>", and "cuda+<candidate>[phases]/<phase>" for each --candidates name (their knobs set for
every other call, alternating with the shipped path).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kbench import benchlib, problems
from kbench.evaluator import guards

guards.torch = torch  # the harness sets it when it starts; guards.clone needs it
PHASES = ("prepare", "graph-launch", "verify", "gpu-rest")
# candidate name -> knobs: the host path before this one (kernels/moe/cuda/entry.py prepare)
CANDIDATES = {"py-key": {"KBENCH_MOE_PY_KEY": "1"}}


def phases_of_one_call(mod, data) -> list[float]:
    """custom_kernel(data)'s graph path, step by step (the same calls as entry.py), host clock per step (us)."""
    x, weights, config = data
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    t = [time.perf_counter_ns()]
    out, key = mod.prepare(x, weights, n_experts, k)  # as custom_kernel keys its replay
    held = mod._graphs._graphs[key]  # a KeyError: the graph was not captured (the knobs or the inputs moved)
    t.append(time.perf_counter_ns())
    held[0].replay()
    t.append(time.perf_counter_ns())
    if mod.graph_replay.tensor_key(x, *weights.values()) != held[2]:
        raise SystemExit("the inputs' shapes or strides changed under the graph: not an official loop")
    t.append(time.perf_counter_ns())
    torch.cuda.synchronize()
    t.append(time.perf_counter_ns())
    del out
    return [(b - a) / 1e3 for a, b in zip(t, t[1:])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--candidates", default="", help=f"comma-separated, of {', '.join(CANDIDATES)}")
    args = ap.parse_args()
    variants = {"cuda": {}} | {f"cuda+{n}": CANDIDATES[n] for n in benchlib.selected(CANDIDATES, args.candidates)}
    mod = benchlib.build("moe", "cuda")
    ref = problems.load_modules("moe").reference
    gpu, rows, table = torch.cuda.get_device_name(), [], []
    for case in problems.load_spec("moe").benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        line = problems.format_case(case)
        ok, msg = ref.check_implementation(guards.clone(data, deep=True), mod.custom_kernel(guards.clone(data)))
        if not ok:
            raise SystemExit(f"cuda fails {line}: {msg}")
        runs = {name: [] for name in variants}
        for name, knobs in variants.items():
            with benchlib.knobs(knobs):
                for _ in range(3):  # eager, captured, replayed
                    mod.custom_kernel(guards.clone(data))
        torch.cuda.synchronize()
        for _ in range(args.runs):
            for name, knobs in variants.items():
                given = guards.clone(data)
                torch.cuda.synchronize()
                with benchlib.knobs(knobs):
                    runs[name].append(phases_of_one_call(mod, given))
                del given
        for name in variants:
            medians = [statistics.median(r[i] for r in runs[name]) for i in range(len(PHASES))]
            rows += [benchlib.Row(gpu, 1, f"{name}[phases]/{p}", "host-loop", line, v) for p, v in zip(PHASES, medians)]
            table.append([line.split("; seed")[0].split("; ")[-1], name] + [f"{v:.1f}" for v in medians])
        del data
    benchlib.record("moe", rows)
    benchlib.table(f"moe cuda: custom_kernel's host phases, medians of {args.runs} official-style calls (us, {gpu})",
                   ["case", "build", *PHASES], table)


if __name__ == "__main__":
    main()
