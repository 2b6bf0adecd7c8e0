"""A backend called a few times on each official benchmark case's inputs, nothing else: the process for a profiler
(ncu, nsys) to attach to.

    python benchmarks/calls.py moe --backend cuda --calls 2
    ncu --kernel-name regex:grouped_gemm --launch-skip 2 --launch-count 2 python benchmarks/calls.py moe --calls 2

Each case: inputs generated once, `--calls` calls in a row (the first builds caches and graphs), synchronised.
"""
from __future__ import annotations

import argparse

import torch

from kbench import benchlib, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args()
    mod = benchlib.build(args.problem, args.backend)
    ref = problems.load_modules(args.problem).reference
    for case in problems.load_spec(args.problem).benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        for _ in range(args.calls):
            mod.custom_kernel(data)
        torch.cuda.synchronize()
        print(f"{problems.format_case(case)}: {args.calls} calls", flush=True)
        del data


if __name__ == "__main__":
    main()
