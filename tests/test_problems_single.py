"""CPU tier for the single-GPU problems (fp8-mm, moe, mla-decode): spec, input generation, reference, checker.

Everything runs on the CPU on the specs' tiny smoke cases. The float64 versions below are written from the problem
statement (../shared/PROBLEMS.md), independently of reference.py, and the draw-order tests re-derive every tensor from a
fresh generator in the official order.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from kbench import problems

SINGLE = ("fp8-mm", "moe", "mla-decode")


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    # The CPU tier judges on the CPU even on a GPU machine, so its fixed seeds give the same numbers everywhere.
    monkeypatch.setenv("KBENCH_DEVICE", "cpu")


def mods(name):
    return problems.load_modules(name)


def smoke_cases(name):
    return [problems.official_case(c) for c in problems.load_spec(name).smoke]


def all_smoke():
    return [pytest.param(name, case, id=f"{name}-{i}") for name in SINGLE for i, case in enumerate(smoke_cases(name))]


def fresh_gen(seed):
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def fresh_data(name, case):
    """Inputs plus a reference output computed on an independent copy (mla-decode's reference mutates its cache)."""
    ref = mods(name).reference
    data = ref.generate_input(**case)
    if name == "mla-decode":
        return data, ref.ref_kernel(ref.copy_data(data))
    return data, ref.ref_kernel(data)


def check_copy(name, data):
    """What the checker may consume: a copy for mla-decode, whose reference appends to the cache it is given."""
    return mods(name).reference.copy_data(data) if name == "mla-decode" else data


def flat_tensors(data):
    """Every tensor of a problem's input, in a fixed order, for bitwise comparisons."""
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, dict):
        return [t for v in data.values() for t in flat_tensors(v)]
    if isinstance(data, (tuple, list)):
        return [t for v in data for t in flat_tensors(v)]
    if hasattr(data, "get_data"):
        return [data.get_data()]
    if hasattr(data, "__dataclass_fields__"):
        return [getattr(data, f) for f in data.__dataclass_fields__ if isinstance(getattr(data, f), torch.Tensor)]
    return []


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


# ----------------------------------------------------------------------------------------------------------------
# spec.yml against the published facts

def test_protocol_differences():
    """mla-decode's harness is the odd one out (EVAL_PROTOCOL.md); the other two share the common rules."""
    for name in ("fp8-mm", "moe"):
        p = problems.load_spec(name).protocol
        assert (p.timer, p.l2_flush, p.rel_err_stop, p.leaderboard_cases, p.combine_seed, p.clone_inputs) == (
            "host", False, 0.001, "all", True, True)
    p = problems.load_spec("mla-decode").protocol
    assert (p.timer, p.l2_flush, p.rel_err_stop, p.leaderboard_cases, p.combine_seed, p.clone_inputs) == (
        "host", False, 0.01, "last", False, False)


def test_roofline_matches_baselines():
    """The floors in ../shared/BASELINES.md follow from these expressions (H100: 1444 TF fp8, 795 TF bf16, 2.99 TB/s)."""
    def floor_us(name, case, peak):
        r = problems.load_spec(name).roofline
        return max(r.flops(case) / peak, r.bytes(case) / 2.99e12) * 1e6

    assert floor_us("fp8-mm", {"m": 1024, "n": 1536, "k": 7168, "seed": 0}, 1444e12) == pytest.approx(15.6, abs=0.1)
    assert floor_us("fp8-mm", {"m": 1024, "n": 4096, "k": 512, "seed": 0}, 1444e12) == pytest.approx(3.7, abs=0.1)
    moe = {"dhidden": 7168, "dexpert": 2048, "nroutedexperts": 32, "nsharedexperts": 1, "nexpertspertoken": 4,
           "bs": 1, "seqlen": 2048, "seed": 0}
    assert problems.load_spec("moe").roofline.flops(moe) == pytest.approx(0.90e12, rel=0.01)
    mla = {"batchsize": 128, "dim": 7168, "dq": 1536, "prefill": 4096, "seed": 0}
    assert floor_us("mla-decode", mla, 795e12) == pytest.approx(328, abs=1)
    assert floor_us("mla-decode", {**mla, "prefill": 6144}, 795e12) == pytest.approx(429, abs=1)


# ----------------------------------------------------------------------------------------------------------------
# input generation: deterministic per seed, official draw order

@pytest.mark.parametrize("name,case", all_smoke())
def test_generation_is_deterministic_per_seed(name, case):
    gen = mods(name).reference.generate_input
    first, again = flat_tensors(gen(**case)), flat_tensors(gen(**case))
    assert len(first) == len(again) > 0
    assert all(same_bits(a, b) for a, b in zip(first, again))
    other = flat_tensors(gen(**{**case, "seed": case["seed"] + 1}))
    assert not same_bits(first[0], other[0]), "a different seed must give different inputs"


@pytest.mark.parametrize("case", smoke_cases("fp8-mm"))
def test_fp8_draw_order_and_layout(case):
    m, n, k, seed = case["m"], case["n"], case["k"], case["seed"]
    a, b, sa, sb, c = mods("fp8-mm").reference.generate_input(**case)
    g = fresh_gen(seed)
    a0 = torch.randn((k, m), dtype=torch.bfloat16, generator=g).to(torch.float8_e4m3fnuz)
    b0 = torch.randn((k, n), dtype=torch.bfloat16, generator=g).to(torch.float8_e4m3fnuz)
    sa0 = torch.randn((math.ceil(k / 128), m), dtype=torch.float32, generator=g)
    sb0 = torch.randn((math.ceil(k / 128), math.ceil(n / 128)), dtype=torch.float32, generator=g)
    for got, want in ((a, a0.T), (b, b0.T), (sa, sa0.T), (sb, sb0.T)):
        assert same_bits(got, want)
        assert got.stride(0) == 1, "inputs are column-major views"
    assert a.dtype == b.dtype == torch.float8_e4m3fnuz and sa.dtype == sb.dtype == torch.float32
    assert c.dtype == torch.bfloat16 and c.shape == (m, n) and c.is_contiguous() and not c.any()
    assert (sa < 0).any(), "scales are randn: negative ones must occur"


@pytest.mark.parametrize("case", smoke_cases("moe"))
def test_moe_draw_order(case):
    x, weights, config = mods("moe").reference.generate_input(**case)
    d, de, E, S = case["dhidden"], case["dexpert"], case["nroutedexperts"], case["nsharedexperts"]
    g = fresh_gen(case["seed"])

    def draw(shape, fan):
        return torch.randn(shape, dtype=torch.float16, generator=g) / math.sqrt(fan)

    assert same_bits(x, torch.randn((case["bs"], case["seqlen"], d), dtype=torch.float16, generator=g))
    expected = {"router.weight": draw((E, d), d)}
    for i in range(E):
        expected[f"experts.{i}.0.weight"] = draw((d, de), de)
        expected[f"experts.{i}.1.weight"] = draw((d, de), de)
        expected[f"experts.{i}.2.weight"] = draw((de, d), d)
    expected["shared_experts.0.weight"] = draw((d, de * S), de * S)
    expected["shared_experts.1.weight"] = draw((d, de * S), de * S)
    expected["shared_experts.2.weight"] = draw((de * S, d), d)
    assert list(weights) == list(expected), "weights dict keys in the official order"
    for key in expected:
        assert same_bits(weights[key], expected[key]), key
    assert config == {"d_hidden": d, "d_expert": de, "n_routed_experts": E, "n_shared_experts": S,
                      "n_experts_per_token": case["nexpertspertoken"], "batch_size": case["bs"],
                      "seq_len": case["seqlen"]}


@pytest.mark.parametrize("case", smoke_cases("mla-decode"))
def test_mla_draw_order_and_cache(case):
    ref = mods("mla-decode").reference
    config, x, cache = ref.generate_input(**case)
    dims = {**ref.OFFICIAL_DIMS, **{k: v for k, v in case.items() if k in ref.OFFICIAL_DIMS}}
    H, r, nope, rope, vd = (dims["n_heads"], dims["kv_lora_rank"], dims["qk_nope_head_dim"], dims["qk_rope_head_dim"],
                            dims["v_head_dim"])
    bs, dim, dq, prefill = case["batchsize"], case["dim"], case["dq"], case["prefill"]
    g = fresh_gen(case["seed"])

    def draw(shape, fan):
        return torch.randn(shape, dtype=torch.bfloat16, generator=g) / math.sqrt(fan)

    assert same_bits(config.Q_proj_down_weight, draw((dq, dim), dim))
    assert same_bits(config.KV_proj_down_weight, draw((r + rope, dim), dim))
    assert same_bits(config.Q_proj_up_weight, draw(((nope + rope) * H, dq), dq))
    assert same_bits(config.KV_proj_up_weight, draw(((nope + vd) * H, r), r))
    assert same_bits(config.wo_weight, draw((dim, H * vd), H * vd))
    assert same_bits(x, torch.randn((bs, 1, dim), dtype=torch.bfloat16, generator=g))
    pre = torch.randn((bs, prefill, r + rope), dtype=torch.bfloat16, generator=g)
    assert cache.data.shape == config.kv_cache_shape == (bs, dims["max_seq_len"], r + rope)
    assert cache.seq_len == prefill and same_bits(cache.data[:, :prefill], pre)
    assert not cache.data[:, prefill:].any(), "rows past the prefill are zero"
    assert (config.batch_size, config.dim, config.q_lora_rank, config.seq_len, config.n_heads) == (bs, dim, dq, 1, H)


def test_mla_classes_have_official_names():
    ref, task = mods("mla-decode").reference, mods("mla-decode").task
    assert ref.Config is task.Config and ref.KVCache is task.KVCache, "importable from task and from reference"
    assert list(task.Config.__dataclass_fields__) == [
        "batch_size", "dim", "n_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "seq_len", "max_seq_len", "kv_cache_shape", "Q_proj_down_weight", "Q_proj_up_weight",
        "KV_proj_down_weight", "KV_proj_up_weight", "wo_weight"]
    cache = task.KVCache((2, 5, 3))  # the official call shape, no device argument
    rows = torch.randn(2, 2, 3, dtype=torch.bfloat16)
    view, length = cache(rows)
    assert length == 2 and cache.seq_len == 2 and torch.equal(view, rows)
    more = torch.randn(2, 1, 3, dtype=torch.bfloat16)
    view, length = cache(more)
    assert length == 3 and torch.equal(view[:, 2:], more) and torch.equal(cache.get_data()[:, :2], rows)
    with pytest.raises(ValueError, match="max_seq_len"):
        cache(torch.zeros(2, 3, 3, dtype=torch.bfloat16))


def test_mla_rejects_unknown_case_key():
    with pytest.raises(TypeError, match="unknown keys"):
        mods("mla-decode").reference.generate_input(batchsize=1, dim=64, dq=32, prefill=4, seed=1, heads=2)


# ----------------------------------------------------------------------------------------------------------------
# reference == an independent float64 computation of the problem statement

def fp8_f64(data):
    a, b, sa, sb, _ = data
    k = a.shape[1]
    sa = sa.double().repeat_interleave(128, 1)[:, :k]
    sb = sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[: b.shape[0], :k]
    return (a.double() * sa) @ (b.double() * sb).T


def moe_f64(data):
    x, w, cfg = data
    xd = x.double().reshape(-1, x.shape[-1])
    W = {k: v.double() for k, v in w.items()}

    def expert(v, p):
        return (F.silu(v @ W[f"{p}.0.weight"]) * (v @ W[f"{p}.1.weight"])) @ W[f"{p}.2.weight"]

    scores = torch.softmax(xd @ W["router.weight"].T, dim=-1)
    k = cfg["n_experts_per_token"]
    top = torch.topk(scores, k, dim=-1)
    # Where the k-th and (k+1)-th scores are closer than fp16 rounding can resolve, fp16 may legitimately pick the
    # other expert: such tokens are reported as ambiguous instead of compared.
    ranked = scores.sort(dim=-1, descending=True).values
    gap = ranked[:, k - 1] - ranked[:, k] if k < scores.shape[1] else torch.ones(scores.shape[0], dtype=scores.dtype)
    ambiguous = gap < 2e-3
    out = expert(xd, "shared_experts")
    for t in range(xd.shape[0]):
        for score, e in zip(top.values[t], top.indices[t]):
            out[t] += score * expert(xd[t], f"experts.{int(e)}")
    return out.view(x.shape), ambiguous.view(x.shape[:-1])


def mla_f64(data):
    """Float64 everywhere except the RoPE angles, which the problem defines in bf16 (theta and pos*theta)."""
    config, x, cache = data
    H, r, nope, rope, vd = (config.n_heads, config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim,
                            config.v_head_dim)
    bs, prefill = x.shape[0], cache.seq_len
    L = prefill + 1
    W = {f: getattr(config, f).double() for f in ("Q_proj_down_weight", "Q_proj_up_weight", "KV_proj_down_weight",
                                                  "KV_proj_up_weight", "wo_weight")}
    xd = x.double()[:, 0]
    new_row = xd @ W["KV_proj_down_weight"].T
    rows = torch.cat([cache.data[:, :prefill].double(), new_row[:, None]], dim=1)        # (bs, L, r+rope)
    q = (xd @ W["Q_proj_down_weight"].T @ W["Q_proj_up_weight"].T).view(bs, H, nope + rope)
    kv = (rows[..., :r] @ W["KV_proj_up_weight"].T).view(bs, L, H, nope + vd)

    half = rope // 2
    theta = 10000 ** (-torch.arange(half, dtype=torch.bfloat16) / half)
    angles = (torch.arange(L).to(torch.bfloat16)[:, None] * theta[None, :]).double()    # (L, half), bf16-rounded
    angles = torch.cat([angles, angles], dim=-1)

    def rotate(v, ang):  # v (..., rope), ang broadcastable
        return v * ang.cos() + torch.cat([-v[..., half:], v[..., :half]], dim=-1) * ang.sin()

    q_rope = rotate(q[..., nope:], angles[L - 1])                                           # (bs, H, rope)
    k_rope = rotate(rows[..., r:], angles)                                                  # (bs, L, rope)
    scores = (torch.einsum("bhd,blhd->bhl", q[..., :nope], kv[..., :nope])
              + torch.einsum("bhd,bld->bhl", q_rope, k_rope)) / math.sqrt(nope + rope)
    y = torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), kv[..., nope:])
    out = (y.reshape(bs, H * vd) @ W["wo_weight"].T)[:, None]
    full = cache.data.double().clone()
    full[:, prefill] = new_row
    return out, full


@pytest.mark.parametrize("name,case", all_smoke())
def test_reference_equals_float64(name, case):
    utils = mods(name).utils
    tol = problems.load_spec(name).tolerance
    data, got = fresh_data(name, case)
    if name == "fp8-mm":
        pairs = [(got, fp8_f64(data))]
        assert got.dtype == torch.bfloat16 and got.shape == data[4].shape
    elif name == "moe":
        want, ambiguous = moe_f64(data)
        assert ambiguous.float().mean() < 0.25, "too many near-ties in routing for a meaningful comparison"
        want[ambiguous] = got[ambiguous].double()
        pairs = [(got, want)]
        assert got.dtype == torch.float16 and got.shape == data[0].shape
    else:
        pairs = list(zip(got, mla_f64(data)))
        assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16]
    for out, want in pairs:
        assert want.abs().max() > 0.05, "compare on real numbers, not zeros"
        problems_found = utils.verbose_allclose(out, want, rtol=tol.rtol, atol=tol.atol)
        assert problems_found == [], "\n".join(problems_found)


def moe_grouped_like_official(data):
    """The official grouping and accumulation: unstable argsort of the picks, scatter-add per expert in id order."""
    x, w, cfg = data
    k = cfg["n_experts_per_token"]

    def expert(v, p):  # nn.Linear with weight W.t() is F.linear(v, W.t())
        gate = F.silu(F.linear(v, w[f"{p}.0.weight"].t()))
        return F.linear(gate * F.linear(v, w[f"{p}.1.weight"].t()), w[f"{p}.2.weight"].t())

    shared = expert(x, "shared_experts")
    values, picks = torch.topk(F.linear(x, w["router.weight"]).softmax(dim=-1), k=k, dim=-1, sorted=False)
    rows = x.view(-1, x.shape[-1])
    picks, values = picks.view(-1), values.view(-1, 1)
    order = picks.argsort()
    ends = picks.bincount().cumsum(0).tolist()
    acc = torch.zeros_like(rows)
    begin = 0
    for e, end in enumerate(ends):
        if end > begin:
            sel = order[begin:end]
            out = expert(rows[sel // k], f"experts.{e}") * values[sel]
            acc.scatter_reduce_(0, (sel // k)[:, None].expand(-1, rows.shape[1]), out, reduce="sum")
        begin = end
    return acc.view(x.shape) + shared


@pytest.mark.parametrize("case", smoke_cases("moe"))
def test_moe_equals_official_grouping_bitwise(case):
    data, got = fresh_data("moe", case)
    assert same_bits(got, moe_grouped_like_official(data))


@pytest.mark.parametrize("case", smoke_cases("mla-decode"))
def test_mla_batch_chunking_is_bit_identical(case):
    ref = mods("mla-decode").reference
    data = ref.generate_input(**case)
    bs = case["batchsize"]
    whole = ref.mla_decode(*ref.copy_data(data), rows_per_chunk=bs)
    for step in sorted({1, 2, bs - 1} - {0}):
        chunked = ref.mla_decode(*ref.copy_data(data), rows_per_chunk=step)
        assert same_bits(chunked[0], whole[0]) and same_bits(chunked[1], whole[1]), f"rows_per_chunk={step}"


def test_mla_rope_angles_are_bf16_at_long_positions():
    """At position ~6k a bf16 angle is off by up to 16 rad from the exact one; the problem uses the bf16 angle."""
    rope = mods("mla-decode").reference._rope
    x = torch.randn(3, 2, 64, generator=fresh_gen(5)).to(torch.bfloat16)
    got = rope(x, 6143).double()
    theta = 10000 ** (-torch.arange(32, dtype=torch.bfloat16) / 32)
    angles = (torch.arange(6143, 6145).to(torch.bfloat16)[:, None] * theta).double()
    angles = torch.cat([angles, angles], dim=-1)
    xd = x.double()
    want = xd * angles.cos() + torch.cat([-xd[..., 32:], xd[..., :32]], dim=-1) * angles.sin()
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    exact = (torch.arange(6143, 6145, dtype=torch.float64)[:, None] * theta.double())
    assert (exact - angles[:, :32]).abs().max() > 1, "the check above must be able to tell bf16 angles from exact"


def test_mla_reference_appends_like_official():
    ref = mods("mla-decode").reference
    case = smoke_cases("mla-decode")[0]
    config, x, cache = ref.generate_input(**case)
    before = cache.data.clone()
    out, data = ref.ref_kernel((config, x, cache))
    p = case["prefill"]
    assert cache.seq_len == p + 1 and data is cache.data
    assert torch.equal(data[:, :p], before[:, :p]) and not data[:, p + 1:].any()
    assert torch.equal(data[:, p], F.linear(x, config.KV_proj_down_weight)[:, 0])
    assert out.shape == (case["batchsize"], 1, case["dim"])


def test_mla_copy_data_is_independent():
    ref = mods("mla-decode").reference
    data = ref.generate_input(**smoke_cases("mla-decode")[0])
    copy = ref.copy_data(data)
    ref.ref_kernel(copy)
    assert data[2].seq_len == copy[2].seq_len - 1, "mutating the copy leaves the original alone"
    assert copy[0].wo_weight.data_ptr() != data[0].wo_weight.data_ptr()


# mla-decode is left out: its reference appends to the cache by definition (test_mla_reference_appends_like_official).
@pytest.mark.parametrize("name,case", [p for p in all_smoke() if p.values[0] != "mla-decode"])
def test_reference_leaves_inputs_alone(name, case):
    ref = mods(name).reference
    data = ref.generate_input(**case)
    before = [t.clone() for t in flat_tensors(data)]
    ref.ref_kernel(data)
    assert all(same_bits(a, b) for a, b in zip(before, flat_tensors(data)))


# ----------------------------------------------------------------------------------------------------------------
# check_implementation: accepts the reference, rejects what is out of tolerance, NaN, wrong shape, wrong dtype

def bump(t, index, factor, tol):
    """t with one element moved by factor * (atol + rtol * |t|), away from zero."""
    t = t.clone()
    v = t[index].float()
    t[index] = (v + factor * (tol.atol + tol.rtol * v.abs()) * (1 if v >= 0 else -1)).to(t.dtype)
    return t


def replace_first(out, new):
    return (new, out[1]) if isinstance(out, tuple) else new


@pytest.mark.parametrize("name,case", all_smoke())
def test_check_implementation(name, case):
    ref = mods(name).reference
    tol = problems.load_spec(name).tolerance
    data, expected = fresh_data(name, case)
    check = lambda output: ref.check_implementation(check_copy(name, data), output)  # noqa: E731
    main = expected[0] if isinstance(expected, tuple) else expected
    spot = tuple(s // 2 for s in main.shape)

    ok, msg = check(expected)
    assert ok and msg == ""
    ok, msg = check(replace_first(expected, bump(main, spot, 0.5, tol)))
    assert ok, f"a change within tolerance must pass: {msg}"

    ok, msg = check(replace_first(expected, bump(main, spot, 3.0, tol)))
    assert not ok and "mismatch" in msg.lower() and str(spot) in msg
    nan = main.clone()
    nan[spot] = float("nan")
    ok, msg = check(replace_first(expected, nan))
    assert not ok and "nan" in msg.lower()
    ok, msg = check(replace_first(expected, main[:-1]))
    assert not ok and "shape" in msg.lower()
    ok, msg = check(replace_first(expected, main.float()))
    assert not ok and "dtype" in msg.lower()


@pytest.mark.parametrize("case", smoke_cases("mla-decode"))
def test_mla_check_covers_the_cache(case):
    ref = mods("mla-decode").reference
    tol = problems.load_spec("mla-decode").tolerance
    data, (out, cache) = fresh_data("mla-decode", case)
    p = case["prefill"]
    ok, msg = ref.check_implementation(ref.copy_data(data), (out, bump(cache, (0, p, 3), 3.0, tol)))
    assert not ok and str((0, p, 3)) in msg, "a wrong new cache row must fail"
    ok, msg = ref.check_implementation(ref.copy_data(data), (out, cache[:, : p + 1]))
    assert not ok and "shape" in msg.lower(), "returning only the filled rows is not the official output"
    ok, msg = ref.check_implementation(ref.copy_data(data), out)
    assert not ok, "a bare tensor instead of (out, cache) must fail"
