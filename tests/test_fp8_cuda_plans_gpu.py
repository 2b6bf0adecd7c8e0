"""GPU tier: the fp8-mm CUDA backend's plans (tile width, split-K, pipeline depth) against the definition on
shapes with m and n tails and tile counts below, near and above one wave, outputs NaN-poisoned before every call;
each plan runs twice, so a call cannot pass on what the previous one left in the scratch buffers."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (m, n, k): 128 x 128 tiles x k-blocks against 132 SMs
SHAPES = [
    (576, 1216, 2048),   # 50 tiles, 16 k-blocks
    (1024, 1536, 1024),  # 96 tiles (< one wave)
    (2048, 2560, 1024),  # 320 tiles (2.4 waves)
    (256, 4160, 1024),   # n % 128 != 0: the last tile column is partly outside
    (96, 8192, 1024),    # m < one tile
]
# (bn, splits, schedule): 128 / 64-wide tiles, split-K with atomics and with per-split slices (+16), 6 stages with
# C staged in halves (+8), and the automatic plan
PLANS = [(128, 1, 0), (64, 1, 0), (128, 2, 0), (128, 3, 16), (64, 4, 16), (128, 1, 8), (128, 2, 24), (0, 1, -1)]


@pytest.fixture(scope="module")
def backend():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU for the sm_90a kernels")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fp8_mm  # the benchmark's definition-level reference and its strict, NaN-poisoning check
    from dev_build import load_backend
    from problems import load_modules

    ext, _ = load_backend("fp8-mm", "cuda")
    return ext, load_modules("fp8-mm").reference, fp8_mm


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_plan_matches_the_definition_twice(backend, shape):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ext, reference, bench = backend
    m, n, k = shape
    data = reference.generate_input(m=m, n=n, k=k, seed=m + n + k)
    expected = bench.reference_f32(*data[:4])
    for bn, splits, sched in PLANS:
        def fn(d, bn=bn, splits=splits, sched=sched):
            return ext.fp8_gemm(*d) if sched < 0 else ext.fp8_gemm_with_sched(*d, bn, splits, True, sched)

        for attempt in range(2):
            ok, msg = bench.check(fn, data, expected, f"plan ({bn},{splits},s{sched}) call {attempt + 1}")
            assert ok, msg
