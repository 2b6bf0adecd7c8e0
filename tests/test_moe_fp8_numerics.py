"""benchmarks/moe_fp8_numerics.py's emulation of FP8 operands: what the scales map, how far a rounding may move a
value, and that the fp16 form is the plain product (CPU, small shapes)."""
import sys

import pytest
import torch

from load_file import ROOT, load_file


@pytest.fixture(scope="module")
def numerics():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling moe_f16acc_numerics
    try:
        yield load_file("benchmarks/moe_fp8_numerics.py", "moe_fp8_numerics")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize("form,reduce_dim", [("fp8 channel", 0), ("fp8 channel", 1), ("fp8 block", 0),
                                             ("fp8 block", 1)])
def test_each_scale_group_keeps_its_largest_value_and_rounds_the_rest_to_e4m3(numerics, form, reduce_dim):
    """The group's largest magnitude maps to 448 (exact in e4m3), so it comes back up to fp32's rounding of the
    scale; every other value moves by at most half an e4m3 step (2^-4 relative to itself) or, below e4m3's normal
    range, an absolute half step."""
    g = torch.Generator().manual_seed(4)
    t = (torch.randn(256, 384, generator=g) * torch.logspace(-2, 1, 384)).half()
    q = numerics.quantize(t, form, reduce_dim)
    x = t.float()
    if form == "fp8 channel":
        amax = x.abs().amax(dim=reduce_dim, keepdim=True).expand_as(x)
    elif reduce_dim == 1:
        amax = x.view(256, 3, 128).abs().amax(dim=2, keepdim=True).expand(256, 3, 128).reshape(256, 384)
    else:
        amax = x.view(2, 128, 3, 128).abs().amax(dim=(1, 3), keepdim=True).expand(2, 128, 3, 128).reshape(256, 384)
    top = x.abs() == amax
    assert torch.allclose(q[top], x[top], rtol=1e-6, atol=0)
    scale = 448.0 / amax
    subnormal_step = 2.0 ** -9 / scale  # e4m3's smallest step, in the value's units
    assert ((q - x).abs() <= torch.maximum(x.abs() * 2.0 ** -4, subnormal_step / 2) * 1.0001).all()
    assert (q != x).any()


def test_the_fp16_form_is_one_rounding_of_the_exact_product(numerics):
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(8, 256, generator=g).half(), torch.randn(256, 128, generator=g).half()
    assert torch.equal(numerics.operands("fp16")(a, w), (a.float() @ w.float()).half())
    fp8 = numerics.operands("fp8 block")(a, w).float()
    exact = a.float() @ w.float()
    assert 0 < (fp8 - exact).abs().mean() < 0.1 * exact.abs().mean()  # coarser, not garbage
