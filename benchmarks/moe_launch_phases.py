"""The host's side of one official moe call, phase by phase: how long the cuda backend's custom_kernel keeps the host
busy before its graph reaches the GPU (docs/moe-notes.md, twenty-fifth session: at 2048 tokens ~100 us of the
official window has no kernel running).

    python benchmarks/moe_launch_phases.py --runs 30      # table last; rows into benchmarks/results/moe.csv

Per benchmark case: inputs generated once, the call checked, three calls to capture its graph, then --runs calls the
official way (inputs cloned, synchronize) with custom_kernel's steps taken one at a time under the host clock, as
kernels/moe/cuda/entry.py runs them: `fast-replay` (the shipped path: ext.moe_replay checks the inputs against the
held graph, makes the output and launches the graph), or on the Python path `prepare` (entry.prepare: the output,
the launch that hands its address to the graph, and the key: the inputs' addresses and the knobs; the twenty-fifth
session's rows split it into
`alloc+publish` and `key`), `graph-launch` (the replay's cudaGraphLaunch), `verify` (the inputs' shapes and strides,
checked while the GPU runs); then `gpu-rest` (the synchronize after them) and `to-launch` (the host's time before
the GPU has the graph: fast-replay, or prepare + graph-launch). Medians, us. Rows: metric host-loop, backend
"cuda[phases]/<phase>", and "cuda+<candidate>[phases]/<phase>" for each --candidates name (their knobs set for
every other call, alternating with the shipped path).

--pieces N: then each host step inside `prepare` and the launch alone, N times apiece after a synchronize (untimed),
once with the GPU idle (rows "cuda[pieces]/<piece>") and once right after a replay of the call's graph, as in the
official loop ("cuda[pieces,after-work]/<piece>"); medians, us: what a faster host path would have to remove.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kbench import benchlib, problems
from kbench.evaluator import guards

guards.torch = torch  # the harness sets it when it starts; guards.clone needs it
PHASES = ("fast-replay", "prepare", "graph-launch", "verify", "gpu-rest", "to-launch", "total", "late-wait")
NO_CLONE = "cuda[no-clone]"
# candidate name -> knobs: the host paths before this one (kernels/moe/cuda/entry.py): the Python path with the key
# read in C++ (py-replay, the build before the thirtieth session) or through Python's data_ptr() (py-key); the
# output's address published by a kernel launch instead of the stream's write (publish-kernel); the output made
# before the launch (early-output, the build before the thirty-fifth session's late output); the knobs read every
# call (knob-reads, the build before the forty-seventh session)
CANDIDATES = {"py-key": {"KBENCH_MOE_FAST_REPLAY": "0", "KBENCH_MOE_PY_KEY": "1"},
              "py-replay": {"KBENCH_MOE_FAST_REPLAY": "0"},
              "publish-kernel": {"KBENCH_MOE_PUBLISH_KERNEL": "1", "KBENCH_MOE_LATE_OUTPUT": "0"},
              "early-output": {"KBENCH_MOE_LATE_OUTPUT": "0"},
              # moe_replay's knobs read through getenv every call (the build before kb::KnobsMemo)
              "knob-reads": {"KBENCH_MOE_KNOB_MEMO": "0"},
              "no-speculate": {"KBENCH_MOE_SPECULATE": "0"}}


def phases_of_one_call(mod, data) -> dict[str, float]:
    """custom_kernel(data)'s graph path, step by step (the same calls as entry.py), host clock per step (us): the fast
    path's one extension call, or (KBENCH_MOE_FAST_REPLAY=0) the Python path's prepare, replay and verify."""
    x, weights, config = data
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    t0 = time.perf_counter_ns()
    if os.environ.get("KBENCH_MOE_FAST_REPLAY") != "0":
        out = mod.ext.moe_replay(mod._graphs, x, weights, k, n_experts)
        if out is None:
            raise SystemExit("the fast path holds no graph for these inputs: not an official loop")
        t = {"fast-replay": time.perf_counter_ns()}
        steps = dict(mod.ext.moe_replay_steps())  # moe_replay's own steps, named by the binding's clock
        names = list(steps)
        # late_output: the graph launches before the output is made, which then runs while the GPU works
        late = names.index("output") > names.index("launch")
        # (speculate: the comparison's steps run after the launch too)
        after_launch = sum(steps[name] for name in names[names.index("launch") + 1:]) if late else 0.0
    else:
        late, after_launch = False, 0.0
        out, key = mod.prepare(x, weights, n_experts, k)  # as custom_kernel keys its replay
        held = mod._graphs._graphs[key]  # a KeyError: the graph was not captured (the knobs or the inputs moved)
        t = {"prepare": time.perf_counter_ns()}
        held[0].replay()
        t["graph-launch"] = time.perf_counter_ns()
        if mod.graph_replay.tensor_key(x, *weights.values()) != held[2]:
            raise SystemExit("the inputs' shapes or strides changed under the graph: not an official loop")
        t["verify"] = time.perf_counter_ns()
    torch.cuda.synchronize()
    t["gpu-rest"] = time.perf_counter_ns()
    del out
    phases, before = {}, t0
    for name, at in t.items():
        phases[name], before = (at - before) / 1e3, at
    phases["total"] = (t["gpu-rest"] - t0) / 1e3
    if late:  # how long the graph's routing waited for the output's address (late_address.h; >= one PCIe read)
        phases["late-wait"] = mod.ext.moe_late_wait_us(x.view(-1, x.shape[-1]))
    # what the GPU waits for: the host's work up to the launch
    phases["to-launch"] = (phases.get("fast-replay", 0.0) - after_launch + phases.get("prepare", 0.0)
                           + phases.get("graph-launch", 0.0))
    if "fast-replay" in phases:  # (replay:call: the rest of the call, Python and pybind11)
        phases |= {f"replay:{name}": us for name, us in steps.items()}
        phases["replay:call"] = phases["fast-replay"] - sum(steps.values())
    return phases


def pieces_of_the_host_path(mod, data, reps: int, after_work: bool) -> dict[str, float]:
    """Median host time (us) of each step entry.prepare and the replay take, one at a time. after_work: each right after
    a synchronize that waited for a replay of the call's graph (as in the official loop), else with the GPU idle."""
    x, weights, config = data
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    x2d = x.view(-1, x.shape[-1])
    ext = mod.ext
    _, key = mod.prepare(x, weights, n_experts, k)
    graph = mod._graphs._graphs[key][0]
    small = torch.empty(8, dtype=torch.uint8, device=x.device)
    steps = {
        "x.view": lambda: x.view(-1, x.shape[-1]),
        "host-values": lambda: mod._host_values(x, n_experts, k),
        "torch.empty": lambda: torch.empty_like(x2d),
        "small-launch": small.zero_,
        "moe_output": lambda: ext.moe_output(x2d, k, n_experts),
        "moe_prepare": lambda: ext.moe_prepare(x2d, weights, k, n_experts),
        "prepare": lambda: mod.prepare(x, weights, n_experts, k),
        "graph-lookup": lambda: mod._graphs._graphs.get((bytes(bytearray(key[0])),) + key[1:]),
        "graph-replay": graph.replay,
        "moe_replay": lambda: ext.moe_replay(mod._graphs, x, weights, k, n_experts),
        "custom_kernel": lambda: mod.custom_kernel(data),
    }
    medians = {}
    for name, step in steps.items():
        times = []
        for _ in range(reps):
            if after_work:
                graph.replay()
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            step()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        medians[name] = statistics.median(times)
    torch.cuda.synchronize()
    return medians


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--candidates", default="", help=f"comma-separated, of {', '.join(CANDIDATES)}")
    ap.add_argument("--pieces", type=int, default=0, help="then time each host step this many times (0: not)")
    ap.add_argument("--no-clone", action="store_true",
                    help="also 'cuda[no-clone]': the shipped path on one set of cloned inputs kept across its calls "
                         "(the official loop clones before each: does a clone slow the host's path? "
                         "docs/moe-notes.md, thirty-second session: no)")
    args = ap.parse_args()
    variants = {"cuda": {}} | {f"cuda+{n}": CANDIDATES[n] for n in benchlib.selected(CANDIDATES, args.candidates)}
    if args.no_clone:
        variants[NO_CLONE] = {}
    mod = benchlib.build("moe", "cuda")
    ref = problems.load_modules("moe").reference
    gpu, rows, table, pieces_table = torch.cuda.get_device_name(), [], [], []
    for case in problems.load_spec("moe").benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        line = problems.format_case(case)
        ok, msg = ref.check_implementation(guards.clone(data, deep=True), mod.custom_kernel(guards.clone(data)))
        if not ok:
            raise SystemExit(f"cuda fails {line}: {msg}")
        runs = {name: [] for name in variants}
        kept = guards.clone(data)  # NO_CLONE's inputs, every call
        for name, knobs in variants.items():
            with benchlib.knobs(knobs):
                for _ in range(3):  # eager, captured, replayed
                    mod.custom_kernel(kept if name == NO_CLONE else guards.clone(data))
        torch.cuda.synchronize()
        for _ in range(args.runs):
            for name, knobs in variants.items():
                given = kept if name == NO_CLONE else guards.clone(data)
                torch.cuda.synchronize()
                with benchlib.knobs(knobs):
                    runs[name].append(phases_of_one_call(mod, given))
                del given
        # PHASES, then the fast path's steps in the binding's order
        columns = list(PHASES) + [p for p in dict.fromkeys(p for r in runs.values() for p in r[0]) if p not in PHASES]
        for name in variants:
            medians = {p: statistics.median(r[p] for r in runs[name]) for p in columns if p in runs[name][0]}
            rows += [benchlib.Row(gpu, 1, f"{name}[phases]/{p}", "host-loop", line, v) for p, v in medians.items()]
            table.append([line.split("; seed")[0].split("; ")[-1], name]
                         + [f"{medians[p]:.1f}" if p in medians else "" for p in columns])
        for after_work in (False, True) if args.pieces else ():
            pieces = pieces_of_the_host_path(mod, guards.clone(data), args.pieces, after_work)
            label = "pieces,after-work" if after_work else "pieces"
            rows += [benchlib.Row(gpu, 1, f"cuda[{label}]/{p}", "host-loop", line, v) for p, v in pieces.items()]
            pieces_table.append([line.split("; seed")[0].split("; ")[-1], "after work" if after_work else "idle"]
                                + [f"{v:.1f}" for v in pieces.values()])
            piece_names = list(pieces)  # (the steps pieces_of_the_host_path times, in its order)
        del data
    benchlib.record("moe", rows)
    benchlib.table(f"moe cuda: custom_kernel's host phases, medians of {args.runs} official-style calls (us, {gpu})",
                   ["case", "build", *columns], table)
    if pieces_table:
        benchlib.table(f"moe cuda: the host path's steps alone, medians of {args.pieces} (us, {gpu})",
                       ["case", "GPU before", *piece_names], pieces_table)


if __name__ == "__main__":
    main()
