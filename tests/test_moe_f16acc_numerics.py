"""benchmarks/moe_f16acc_numerics.py's emulation of fp16 accumulation: the rounding toward zero and the chained GEMM
(CPU, small shapes)."""
import pytest
import torch

from load_file import load_file


@pytest.fixture(scope="module")
def numerics():
    return load_file("benchmarks/moe_f16acc_numerics.py", "moe_f16acc_numerics")


def test_rounding_toward_zero_never_grows_a_value_and_stays_within_one_step(numerics):
    v = torch.randn(20000, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 3, 20000)
    down = numerics.f16_toward_zero(v)
    nearest = v.half().float()
    assert (down.abs() <= v.abs()).all()
    assert (torch.sign(down) * torch.sign(v) >= 0).all()  # no value crosses zero
    step = (nearest - down).abs()
    ulp = torch.finfo(torch.float16).eps * nearest.abs().clamp_min(2 ** -14)
    assert (step <= ulp * 1.0001).all()
    exact = torch.tensor([0.5, -1.25, 3.0, 0.0])
    assert torch.equal(numerics.f16_toward_zero(exact), exact)  # fp16 values are kept
    assert (down != nearest).any()  # and the mode differs from round to nearest somewhere


def test_the_fp32_mode_is_one_rounding_of_the_exact_product(numerics):
    g = torch.Generator().manual_seed(2)
    a, w = torch.randn(8, 256, generator=g).half(), torch.randn(256, 32, generator=g).half()
    assert torch.equal(numerics.gemm(a, w, None), (a.float() @ w.float()).half())


def test_fp16_chains_lose_more_the_longer_they_run(numerics):
    """Chains of 2 stages (k 128) stay closer to the fp32 product than one chain over K, and truncation loses more
    than rounding to nearest: the ordering the study's table rests on."""
    g = torch.Generator().manual_seed(3)
    a, w = torch.randn(16, 2048, generator=g).half(), (torch.randn(2048, 64, generator=g) / 45).half()
    exact = a.float() @ w.float()
    err = {key: (numerics.gemm(a, w, *key).float() - exact).abs().mean().item()
           for key in [(None,), (2,), (32,), (2, True)]}
    assert err[(None,)] < err[(2,)] < err[(32,)]
    assert err[(2,)] < err[(2, True)]
