"""moe CUDA backend entry: one extension call (moe_layer) runs the router through the reference's own ATen ops (so the
same experts win every tie), then sorts, gathers and runs the two grouped wgmma GEMMs (kernels/moe/cuda/*.cuh), the
second adding each expert's scored output into the output tensor.

data = (x [bs, seqlen, d] fp16, weights dict, config); output [bs, seqlen, d] fp16. `ext` is the load_inline
module the template defines above this code. The expert weights are read in place (a tensor map per weight).
The call is replayed as one CUDA graph while the inputs stay at their addresses (graph_replay: the harness's clone
of the inputs lands at the same addresses run after run; in leaderboard mode, whose inputs are regenerated every run,
at one of two address sets in turn after a few runs, so both are captured and replayed: notes, thirty-seventh
session), which takes the host's launches and its per-call work on
99 weights out of the timed call; the graph launches on the inputs' addresses and their full key is checked behind
the launch. The output is a new tensor every call: moe_output makes it before the launch and writes its address to
device memory, where the graph's kernels read it. Once captured, a graph is also held by the binding, whose
moe_replay checks the inputs against it, launches the graph and then makes the output in one call (the fast path;
the graph's routing takes the output's address from mapped host memory, _common/late_address.h, so such a graph is
the binding's alone; KBENCH_MOE_FAST_REPLAY=0: the Python path, candidate `py-replay`). (KBENCH_MOE_RED_COMBINE=0,
the previous path: the graph writes the experts' outputs to its own buffer Y and moe_combine makes the output from
it after the launch.)
"""
import functools
import os

import torch

import graph_replay
from task import input_t, output_t

_graphs = graph_replay.GraphReplay()
# MoeConfig's knobs (moe_api.h): the binding reads them on each call, a graph keeps what it saw when captured
_KNOBS = ("KBENCH_MOE_SKIP_EMPTY_HALVES", "KBENCH_MOE_KEEP_WORKSPACES", "KBENCH_MOE_STAGES", "KBENCH_MOE_RED_COMBINE",
          "KBENCH_MOE_SPLIT_ROUTE", "KBENCH_MOE_ASYNC_EPILOGUE", "KBENCH_MOE_SHARED_FIRST",
          "KBENCH_MOE_SHARED_GATHER", "KBENCH_MOE_GATHER_LSU", "KBENCH_MOE_BAND",
          "KBENCH_MOE_BK32", "KBENCH_MOE_DECODE_AHEAD", "KBENCH_MOE_LATE_OUTPUT", "KBENCH_MOE_FUSED_TOPK",
          "KBENCH_MOE_PUBLISH_KERNEL")  # (the last used before the launch, outside the graph; keyed all the same)
_PY_KEY = ("KBENCH_MOE_PY_KEY",)  # (how the key is read, not what the graph holds: no part of the key)


@functools.lru_cache(maxsize=None)
def _weight_names(n_experts: int) -> tuple:
    """The weights' keys, gate / up / down, routed experts then the shared one (built once: leaderboard mode's eager
    calls pay the host's time for every string)."""
    names = [f"experts.{e}" for e in range(n_experts)] + ["shared_experts"]
    return tuple(tuple(f"{n}.{i}.weight" for n in names) for i in range(3))


def _experts(x: torch.Tensor, weights: dict, n_experts: int, k: int, out: torch.Tensor | None):
    """Router, routing sort, gather, both grouped GEMMs, in one extension call (moe_layer: the router through the
    reference's own ATen ops). x [bs, seqlen, d] fp16 -> (Y [T*K + T, d] fp16: each (token, slot) pair's expert
    output, then the shared expert's rows; top scores [T, K] fp16), T = bs * seqlen.
    out: moe_output's tensor when GEMM 2 adds into it (then Y is None), else None."""
    gate, up, down = _weight_names(n_experts)
    return ext.moe_layer(x, weights["router.weight"], k, [weights[n] for n in gate],  # noqa: F821 (ext: template)
                         [weights[n] for n in up], [weights[n] for n in down], out)


def _host_values(x: torch.Tensor, n_experts: int, k: int) -> tuple:
    """The launch key's host values (after the addresses of the tensors a replay reads: x, then the weights in the
    dict's order): the counts, x's shape (a replay writes the output with the captured token count) and the knobs."""
    return (n_experts, k, x.shape) + graph_replay.env_values(_KNOBS)


def prepare(x: torch.Tensor, weights: dict, n_experts: int, k: int) -> tuple:
    """(the call's output from moe_output, or None; the graph's launch key: the addresses of x and of the weights in
    the dict's order, then _host_values). One extension call (moe_prepare) makes the output and reads
    the 101 addresses; KBENCH_MOE_PY_KEY=1 (the build before, candidate `py-key`): moe_output, then the addresses
    through Python's data_ptr(). benchmarks/moe_launch_phases.py times this step as custom_kernel takes it."""
    x2d = x.view(-1, x.shape[-1])
    extra = _host_values(x, n_experts, k)
    if graph_replay.env_values(_PY_KEY)[0] in graph_replay.ON:
        out = ext.moe_output(x2d, k, n_experts)  # noqa: F821 (ext: template)
        return out, graph_replay.addresses((x, *weights.values())) + extra
    out, addresses = ext.moe_prepare(x2d, weights, k, n_experts)  # noqa: F821 (ext: template)
    return out, (addresses,) + extra


def _hold(x: torch.Tensor, weights: dict, n_experts: int, k: int):
    """GraphReplay's on_capture: the new graph also held by the binding, for moe_replay. True where the graph takes
    its output's address after the launch (MoeConfig::late_output): then only moe_replay launches it."""
    def hold(graph, _output):  # (the output is the slot's tensor, made anew by moe_replay)
        return ext.moe_hold_graph(_graphs, graph, graph.raw_cuda_graph_exec(), x, weights, k,  # noqa: F821
                                  n_experts)
    return hold


if not graph_replay.BINDING_LAUNCHES:  # (a graph replayed from Python takes no output address late)
    os.environ.setdefault("KBENCH_MOE_LATE_OUTPUT", "0")


def custom_kernel(data: input_t) -> output_t:
    x, weights, config = data
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    if config["n_shared_experts"] != 1:
        raise ValueError("the moe cuda backend takes exactly one shared expert (all official cases); "
                         "use the torch backend for others")
    # The fast path: where the binding holds a graph captured on these inputs, it makes the output and launches the
    # graph in this one call (the host runs slowly right after the timer's synchronize: docs/moe-notes.md, thirtieth
    # session). Its checks are the full key's (addresses, shapes, strides, dtypes, the knobs), before the launch.
    out = ext.moe_replay(_graphs, x, weights, k, n_experts)  # noqa: F821 (ext: template)
    if out is not None:
        return out
    if ext.moe_fast_replays():  # noqa: F821 (ext: template)
        _graphs.replayed_elsewhere()
    # MoeConfig::red_combine: GEMM 2 adds into this new tensor `out`, published to the kernels through device memory
    # so that the graph below serves it; None: moe_combine makes the output from Y after the graph
    out, key = prepare(x, weights, n_experts, k)
    step = lambda: _experts(x, weights, n_experts, k, out)  # noqa: E731
    # The harness clones the 100 inputs every call (new objects, at the same addresses): the graph launches on their
    # addresses and their shapes, strides and dtypes (tensor_key, ~30 us of host time on the CPU machine) are checked
    # after the launch, while the GPU runs
    full_key = lambda: graph_replay.tensor_key(x, *weights.values())  # noqa: E731
    if os.environ.get("KBENCH_MOE_GRAPH") == "0":  # the launches one by one (docs/moe-notes.md)
        y, top_scores = step()
    elif os.environ.get("KBENCH_MOE_FULL_KEY") == "1":  # the whole key before the launch, as before verify=
        y, top_scores = _graphs.replay(full_key() + _host_values(x, n_experts, k), step)
    else:
        y, top_scores = _graphs.replay(key, step, verify=full_key, on_capture=_hold(x, weights, n_experts, k)
                                       if out is not None and graph_replay.BINDING_LAUNCHES else None)
    if out is None:
        out = ext.moe_combine(y, top_scores)  # noqa: F821 (ext: template)
    return out.view(x.shape)
