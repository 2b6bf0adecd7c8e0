"""GPU tier: the fp8-mm CUDA backend's named configurations (tile width, split-K, pipeline depth) against the
official reference on shapes with m and n tails and tile counts below, near and above one wave, outputs
NaN-poisoned before every call; each configuration runs twice, so a call cannot pass on what the previous one left
in the scratch buffers. The backend is built as the submission is, plus its dev entry points (kernel.yml dev)."""
import pytest

from kbench import benchlib, problems

# (m, n, k): 128 x 128 tiles x k-blocks against 132 SMs
SHAPES = [
    (576, 1216, 2048),   # 50 tiles, 16 k-blocks
    (1024, 1536, 1024),  # 96 tiles (< one wave)
    (2048, 2560, 1024),  # 320 tiles (2.4 waves)
    (256, 4160, 1024),   # n % 128 != 0: the last tile column is partly outside
    (96, 8192, 1024),    # m < one tile
]
# (tile_n, splits, exact, schedule, half_c, split_slices): 128 / 64-wide tiles, split-K with atomics and with
# per-split slices, 6 stages with C staged in halves; None: the automatic configuration
CONFIGS = [(128, 1, True, 0, False, False), (64, 1, True, 0, False, False), (128, 2, True, 0, False, False),
           (128, 3, True, 0, False, True), (64, 4, True, 0, False, True), (128, 1, True, 0, True, False),
           (128, 2, True, 0, True, True), None]


@pytest.fixture(scope="module")
def backend():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU for the sm_90a kernels")
    return benchlib.build("fp8-mm", "cuda", dev=True), problems.load_modules("fp8-mm").reference


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_configuration_matches_the_reference_twice(backend, shape):
    import torch

    mod, reference = backend
    m, n, k = shape
    data = reference.generate_input(m=m, n=n, k=k, seed=m + n + k)
    expected = reference.ref_kernel(tuple(t.clone() for t in data))
    tol = problems.load_spec("fp8-mm").tolerance
    for cfg in CONFIGS:
        for attempt in range(2):
            benchlib.poison(data[4])
            out = mod.custom_kernel(data) if cfg is None else mod.ext.fp8_gemm_with_config(*data, *cfg)
            torch.cuda.synchronize()
            ratio = benchlib.tolerance_ratio(out, expected, tol.rtol, tol.atol)
            assert ratio <= 1, f"config {cfg} call {attempt + 1}: worst error {ratio:.2f}x the tolerance"


@pytest.mark.gpu
@pytest.mark.parametrize("keep", ["", "0"], ids=["kept-scratch", "KBENCH_FP8_HOST_CACHE=0"])
def test_kept_scratch_follows_shapes_and_streams(backend, keep, monkeypatch):
    """The shipped call keeps its scratch buffers (the K-major copies, the split-K workspace) and tensor maps from one
    call to the next: shapes that grow, shrink, split K (1024x512x7168 on 132 SMs) or not, fresh inputs each call and
    a call on a side stream (which gets buffers of its own) must all match the reference, c NaN-poisoned before each
    call. KBENCH_FP8_HOST_CACHE=0 (a fresh buffer and fresh maps every call, the build before) alike."""
    import torch

    monkeypatch.setenv("KBENCH_FP8_HOST_CACHE", keep) if keep else monkeypatch.delenv("KBENCH_FP8_HOST_CACHE",
                                                                                      raising=False)
    mod, reference = backend
    tol = problems.load_spec("fp8-mm").tolerance
    side = torch.cuda.Stream()
    for i, (m, n, k) in enumerate([(256, 4160, 1024), (2048, 2560, 1024), (1024, 512, 7168), (96, 8192, 1024),
                                   (2048, 2560, 1024), (1024, 512, 7168)]):
        data = reference.generate_input(m=m, n=n, k=k, seed=100 + i)
        expected = reference.ref_kernel(tuple(t.clone() for t in data))
        for on_side in (False, True):
            benchlib.poison(data[4])
            if on_side:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = mod.custom_kernel(data)
                torch.cuda.current_stream().wait_stream(side)
            else:
                out = mod.custom_kernel(data)
            torch.cuda.synchronize()
            ratio = benchlib.tolerance_ratio(out, expected, tol.rtol, tol.atol)
            assert ratio <= 1, f"{m}x{n}x{k} (side stream: {on_side}): worst error {ratio:.2f}x the tolerance"
