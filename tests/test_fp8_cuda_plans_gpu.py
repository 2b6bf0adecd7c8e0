"""GPU tier: the fp8-mm CUDA backend's work decompositions against the definition, outputs NaN-poisoned per call.

Stream-K (plan flag 32) hands fp32 partial tiles between CTAs through a workspace kept across calls and flags
stamped with a per-call epoch; the shapes below make tiles span one, two and three or more CTAs, include m and n
tails, and run every plan twice so a second call cannot pass on the first call's partials or flags."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 2e-2, 1e-3

# (m, n, k): tiles x k-blocks vs 132 SMs
SHAPES = [
    (576, 1216, 2048),   # 50 tiles, 16 k-blocks: each CTA ~6 k-blocks, a tile spans ~3 CTAs
    (1024, 1536, 1024),  # 96 tiles (< one wave): all stream-K
    (2048, 2560, 1024),  # 320 tiles: one round-robin wave, then 188 tiles stream-K
    (256, 4160, 1024),   # n % 128 != 0: the last tile column is partly outside
    (96, 8192, 1024),    # m < one tile
]
# (bn, splits, schedule): stream-K with 5 / 6 stages, 64-wide tiles; rolling schedules (5: groups of 4, 6: of 2,
# +8 six stages), alone, with split-K slices and with stream-K; the automatic plan for comparison
PLANS = [(128, 1, 32), (128, 1, 40), (64, 1, 32), (128, 1, 5), (128, 1, 14), (128, 3, 6 + 16), (128, 1, 6 + 32),
         (0, 1, -1)]


@pytest.fixture(scope="module")
def backend():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU for the sm_90a kernels")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dev_build import load_backend
    from problems import load_modules

    ext, _ = load_backend("fp8-mm", "cuda")
    return ext, load_modules("fp8-mm").reference


def _expected(a, b, sa, sb):
    m, k = a.shape
    n = b.shape[0]
    af = a.float() * sa.repeat_interleave(128, dim=1)[:, :k]
    bf = b.float() * sb.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return af @ bf.T


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_plan_matches_the_definition_twice(backend, shape):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ext, reference = backend
    m, n, k = shape
    a, b, sa, sb, c = reference.generate_input(m=m, n=n, k=k, seed=m + n + k)
    expected = _expected(a, b, sa, sb)
    for bn, splits, sched in PLANS:
        for attempt in range(2):
            c.fill_(float("nan"))
            if sched < 0:
                out = ext.fp8_gemm(a, b, sa, sb, c)
            else:
                out = ext.fp8_gemm_with_sched(a, b, sa, sb, c, bn, splits, True, sched)
            torch.cuda.synchronize()
            got = out.float()
            label = f"plan ({bn},{splits},s{sched}) call {attempt + 1}"
            assert torch.isfinite(got).all(), f"{label}: unwritten or NaN outputs"
            close = torch.isclose(got, expected, rtol=RTOL, atol=ATOL)
            assert close.all(), f"{label}: {(~close).sum().item()} mismatches, first {(~close).nonzero()[:3].tolist()}"


@pytest.mark.gpu
def test_stream_k_with_a_forced_split_count_is_refused(backend):
    import torch

    ext, reference = backend
    a, b, sa, sb, c = reference.generate_input(m=256, n=256, k=1024, seed=3)
    with pytest.raises(RuntimeError, match="stream-K"):
        ext.fp8_gemm_with_sched(a, b, sa, sb, c, 128, 2, True, 32)
    torch.cuda.synchronize()
