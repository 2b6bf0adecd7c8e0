"""GPU tier: the mla-decode CUDA backend (kernels/mla-decode/cuda). The attention kernel alone against an fp32
definition (batch sizes that split the cache and that do not, kv lengths across tile edges, the allocator poisoned
with NaN); then the generated submission through the evaluator: every official case, extra prefills at the official
dims, and 200 reseeded leaderboard-mode runs, every one checked."""
import math
import subprocess
import sys
import textwrap

import pytest

import regenerated_inputs
from kbench import benchlib, evaluator, generator, problems


@pytest.fixture(scope="module")
def mla():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU for the sm_90a kernels")
    return benchlib.build("mla-decode", "cuda")


def attention_definition(q, cache, kv_len, cos, sin):
    """fp32: keys = latent | RoPE(k_rope) with the kernel's tables (bf16 roundings as the reference), softmax(q k^T /
    sqrt(192)) @ latent. q [bs, 128, 576], cache [bs, max_seq, 576] -> [bs, 128, 512]."""
    import torch

    kv = cache[:, :kv_len]
    latent, kr = kv[..., :512], kv[..., 512:]
    c, s = torch.cat([cos[:kv_len]] * 2, -1), torch.cat([sin[:kv_len]] * 2, -1)
    kr = kr * c + torch.cat((-kr[..., 32:], kr[..., :32]), -1) * s          # bf16 ops, as the reference
    keys = torch.cat([latent, kr], -1).float()
    p = torch.softmax(q.float() @ keys.transpose(1, 2) / math.sqrt(192), -1)
    return p @ latent.float()


def _set_knobs(monkeypatch, splits, knobs):
    """splits: None = the shipped choice, else KBENCH_MLA_SPLITS forces it; knobs: other KBENCH_MLA_ settings (the
    candidates' knobs), comma-separated NAME=VALUE."""
    if splits:
        monkeypatch.setenv("KBENCH_MLA_SPLITS", splits)
    for knob in filter(None, knobs.split(",")):
        name, value = knob.split("=")
        monkeypatch.setenv(f"KBENCH_MLA_{name}", value)


def _check_against_eager(mla, monkeypatch, data, expected_data=None, what: str = "") -> None:
    """custom_kernel(data) against the eager path (KBENCH_MLA_GRAPH=0) on expected_data, a copy of data (made here
    where not given), with the allocator poisoned in between: the cache must hold one more row, equal to the eager
    path's, and the output lie within the tolerance of its output."""
    import torch

    if expected_data is None:
        expected_data = problems.load_modules("mla-decode").reference.copy_data(data)
    monkeypatch.setenv("KBENCH_MLA_GRAPH", "0")
    expected, _ = mla.custom_kernel(expected_data)
    monkeypatch.delenv("KBENCH_MLA_GRAPH")
    benchlib.poison_allocator()
    seq_len = data[2].seq_len
    out, _ = mla.custom_kernel(data)
    torch.cuda.synchronize()
    assert data[2].seq_len == seq_len + 1
    assert torch.equal(data[2].data[:, :seq_len + 1], expected_data[2].data[:, :seq_len + 1]), what
    ratio = benchlib.tolerance_ratio(out, expected, 2e-2, 8e-3)
    assert ratio <= 1, f"{what}: {ratio:.2f}x the tolerance from the eager path's output"


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len,splits,knobs",
                         [(1, 2, None, ""), (3, 65, None, ""), (16, 1025, None, ""), (128, 130, None, ""),
                          (2, 8192, None, ""), (128, 4097, None, ""), (128, 4097, "2", ""), (16, 1025, "3", ""),
                          (3, 65, None, "ROPE_FIRST=0"), (128, 4097, None, "ROPE_FIRST=0"),
                          (16, 1025, "3", "ROPE_FIRST=0"),
                          (3, 65, None, "S_ONCE=0"), (128, 4097, None, "S_ONCE=0"), (16, 1025, "3", "S_ONCE=0"),
                          (3, 65, None, "S_ONCE=0,PREFETCH_TABLES=0"), (128, 4097, None, "S_ONCE=0,PREFETCH_TABLES=0"),
                          (16, 1025, "3", "S_ONCE=0,PREFETCH_TABLES=0"),
                          (1, 2, None, "SEESAW=1"), (3, 65, None, "SEESAW=1"), (16, 1025, None, "SEESAW=1"),
                          (128, 130, None, "SEESAW=1"), (2, 8192, None, "SEESAW=1"), (128, 4097, None, "SEESAW=1"),
                          (128, 4097, "2", "SEESAW=1"), (16, 1025, "3", "SEESAW=1"),
                          (3, 65, None, "BULK_STORE=0"), (128, 4097, None, "BULK_STORE=0"),
                          (3, 65, None, "STAGED_ST=0"), (128, 4097, None, "STAGED_ST=0"),
                          (16, 1025, "3", "STAGED_ST=0"),
                          (1, 2, None, "PERSISTENT=1"), (3, 65, None, "PERSISTENT=1"),
                          (128, 4097, None, "PERSISTENT=1"), (133, 1000, None, "PERSISTENT=1"),
                          (200, 130, None, "PERSISTENT=1"), (16, 1025, None, "PERSISTENT=1"),
                          (128, 4097, None, "PERSISTENT=1,ROPE_FIRST=0"),
                          # the last tile narrow where it holds <= 16 rows (the default): 15, 16 rows; 17 (wide);
                          # with the persistent kernel; then the wide last tile (the build before)
                          (5, 79, None, ""), (5, 80, None, ""), (5, 81, None, ""),
                          (200, 130, None, "PERSISTENT=1"),
                          (3, 65, None, "NARROW_TAIL=0"), (128, 4097, None, "NARROW_TAIL=0"),
                          (16, 1025, "3", "NARROW_TAIL=0"), (3, 65, None, "NARROW_TAIL=0,PERSISTENT=1"),
                          # each stage released in two halves (finding 65)
                          (1, 2, None, "SPLIT_RELEASE=1,PERSISTENT=1"), (5, 79, None, "SPLIT_RELEASE=1,PERSISTENT=1"),
                          (128, 4097, None, "SPLIT_RELEASE=1"), (200, 130, None, "SPLIT_RELEASE=1")])
def test_attention_matches_the_definition(mla, bs, kv_len, splits, knobs, monkeypatch, grow=1.0):
    """splits, knobs: as _set_knobs takes them. grow: the keys' rope columns scaled from 1 at position 0 to
    `grow` at the last, so that the row maxima keep rising tile after tile (the s-once softmax rescales lazily)."""
    import torch

    _set_knobs(monkeypatch, splits, knobs)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(bs * 10000 + kv_len)
    max_seq = 8192
    q = torch.randn(bs, 128, 576, generator=gen, device="cuda").bfloat16()
    cache = torch.zeros(bs, max_seq, 576, device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(bs, kv_len, 576, generator=gen, device="cuda")
    rows[..., 512:] *= torch.linspace(1.0, grow, kv_len, device="cuda")[:, None]
    cache[:, :kv_len] = rows.bfloat16()
    cos, sin = mla._rope_tables(max_seq, 64, q.device)
    expected = attention_definition(q, cache, kv_len, cos, sin)
    for attempt in range(2):
        benchlib.poison_allocator()
        out = mla.ext.mla_attention(q, cache, kv_len, cos, sin, None)
        torch.cuda.synchronize()
        rel = ((out.float() - expected).norm() / expected.norm()).item()
        ratio = benchlib.tolerance_ratio(out, expected, 2e-2, 8e-3)
        assert rel < 1e-2 and ratio <= 1, f"call {attempt + 1}: relative error {rel:.2e}, worst {ratio:.2f}x tolerance"


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len,splits,knobs", [(16, 1025, None, ""), (128, 4097, "2", ""),
                                                    (16, 1025, None, "ROPE_FIRST=0"),
                                                    (133, 1025, None, "PERSISTENT=1"),
                                                    (133, 1025, None, "PERSISTENT=1,SPLIT_RELEASE=1"),
                                                    (16, 1025, None, "NARROW_TAIL=0"),
                                                    (16, 1025, None, "S_ONCE=0"),
                                                    (16, 1025, None, "SEESAW=1"), (128, 4097, "2", "SEESAW=1"),
                                                    (3, 65, None, "SEESAW=1")])
def test_attention_with_rising_maxima(mla, bs, kv_len, splits, knobs, monkeypatch):
    """The keys' rope columns growing 64x along the cache (the values, the latent columns, stay as they are): at
    kv_len 1025 a tile's best scores exceed the previous tiles' maxima by about the lazy rescale's slack (8 in log2
    units) or more, so the maxima move all along the cache, a path random data takes only on the first tiles.
    (Scaling whole rows fails both schedules: the outputs grow with the values, and bf16 P's rounding with them.)"""
    test_attention_matches_the_definition(mla, bs, kv_len, splits, knobs, monkeypatch, grow=64.0)


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len,splits,knobs", [(128, 4097, "2", ""), (128, 4097, "2", "SEESAW=1"),
                                                    (16, 1025, None, "SEESAW=1"), (128, 4097, None, ""),
                                                    (200, 1025, None, "PERSISTENT=1"),
                                                    (128, 4097, None, "NARROW_TAIL=0"),
                                                    (128, 4097, None, "SPLIT_RELEASE=1"),
                                                    (200, 1025, None, "SPLIT_RELEASE=1")])
def test_attention_repeats_bit_for_bit(mla, bs, kv_len, splits, knobs, monkeypatch):
    """The kernel is deterministic: 30 calls on the same inputs must give the same bits. A race between the
    warpgroups, the loads and the rotators shows up here as an occasional difference (a version of the seesaw
    schedule once failed the definition test's tolerance in one run of it, and passed the next)."""
    import torch

    _set_knobs(monkeypatch, splits, knobs)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(bs + kv_len)
    q = torch.randn(bs, 128, 576, generator=gen, device="cuda").bfloat16()
    cache = torch.randn(bs, 8192, 576, generator=gen, device="cuda").bfloat16()
    cos, sin = mla._rope_tables(8192, 64, q.device)

    def call():
        return mla.ext.mla_attention(q, cache, kv_len, cos, sin, None)

    first = call()
    differing = [i for i in range(30) if not torch.equal(call(), first)]
    assert not differing, f"calls {differing} of 30 differ from the first"


def _outputs_per_knob_value(mla, monkeypatch, knob, values, bs, kv_len):
    """The attention's output for each value of KBENCH_MLA_<knob> on one set of random inputs, the allocator
    poisoned before each call; the rows must all have been written."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(7 * bs + kv_len)
    q = torch.randn(bs, 128, 576, generator=gen, device="cuda").bfloat16()
    cache = torch.randn(bs, 8192, 576, generator=gen, device="cuda").bfloat16()
    cos, sin = mla._rope_tables(8192, 64, q.device)
    outs = {}
    for value in values:
        monkeypatch.setenv(f"KBENCH_MLA_{knob}", value)
        benchlib.poison_allocator()
        outs[value] = mla.ext.mla_attention(q, cache, kv_len, cos, sin, None)
        assert not outs[value].isnan().any(), f"{knob}={value}: rows left unwritten (the poison shows through)"
    return outs


@pytest.mark.gpu
@pytest.mark.parametrize("knob", ["BULK_STORE", "STAGED_ST"])
@pytest.mark.parametrize("bs,kv_len", [(3, 65), (128, 4097)])
def test_staged_rows_equal_the_direct_stores(mla, bs, kv_len, knob, monkeypatch):
    """MlaConfig::bulk_store only changes how the rows reach memory (through shared memory and bulk copies instead of
    stores from registers), and staged_st how the staged rows leave shared memory (16-byte stores instead of bulk
    copies): the same bits, with the output poisoned before each call."""
    import torch

    outs = _outputs_per_knob_value(mla, monkeypatch, knob, ("0", "1"), bs, kv_len)
    assert torch.equal(outs["0"], outs["1"]), f"{knob}=1 changes the rows"


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len", [(3, 65), (128, 4097), (133, 1000), (200, 130)])
def test_the_persistent_kernel_equals_the_one_item_kernel(mla, bs, kv_len, monkeypatch):
    """MlaConfig::persistent runs the same per-tile arithmetic in the same order, one CTA an SM walking the work items
    (2 to 4 a CTA at these batches, so the ring, Q and the barriers' phases carry across items), and stores the rows
    from registers: the same bits as the one-item kernel, with the output poisoned before each call."""
    import torch

    outs = _outputs_per_knob_value(mla, monkeypatch, "PERSISTENT", ("0", "1"), bs, kv_len)
    assert torch.equal(outs["0"], outs["1"]), "the persistent kernel changes the rows"


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len,knobs", [(128, 4097, ""), (133, 1000, ""), (200, 130, ""), (128, 6145, ""),
                                             (1, 2, "PERSISTENT=1"), (3, 65, "PERSISTENT=1"), (5, 79, "PERSISTENT=1"),
                                             (16, 1025, "PERSISTENT=1"), (128, 4097, "NARROW_TAIL=0")])
def test_the_split_release_equals_the_whole_stage(mla, bs, kv_len, knobs, monkeypatch):
    """MlaConfig::split_release (the persistent kernel): each stage released and reloaded in two halves, S waiting for
    latent blocks 4-7 on their own barrier, in the same order of MMAs: the same bits, the ring's two barriers a stage
    carried across items, with the output poisoned before each call."""
    import torch

    _set_knobs(monkeypatch, None, knobs)
    outs = _outputs_per_knob_value(mla, monkeypatch, "SPLIT_RELEASE", ("0", "1"), bs, kv_len)
    assert torch.equal(outs["0"], outs["1"]), "the split release changes the rows"


@pytest.mark.gpu
@pytest.mark.parametrize("bs,kv_len,knobs", [(3, 65, ""), (5, 79, ""), (5, 80, ""), (1, 2, ""), (128, 4097, ""),
                                             (200, 130, "PERSISTENT=1"), (3, 65, "ROPE_FIRST=0")])
def test_the_narrow_tail_equals_the_wide_tile(mla, bs, kv_len, knobs, monkeypatch):
    """MlaConfig::narrow_tail computes a last tile of <= 16 rows over those rows only (16-row boxes, S by m64n16, one
    P V step) where the wide tile adds positions whose P is 0 (the cache past kv_len is random here, so a narrow tile
    that read a row it should not, or dropped one it should, shows): the same bits, the output poisoned before each
    call."""
    import torch

    _set_knobs(monkeypatch, None, knobs)
    outs = _outputs_per_knob_value(mla, monkeypatch, "NARROW_TAIL", ("0", "1"), bs, kv_len)
    assert torch.equal(outs["0"], outs["1"]), "the narrow last tile changes the rows"


@pytest.mark.gpu
def test_attention_refuses_a_length_tensor_of_another_dtype(mla):
    """A known-bad input to the binding: the device-side length as int64. The call raises its one-line message
    (formatted messages go through KB_CHECK: kernels/_common/torch_check.h)."""
    import torch

    q = torch.randn(1, 128, 576, device="cuda").bfloat16()
    cache = torch.randn(1, 128, 576, device="cuda").bfloat16()
    cos, sin = mla._rope_tables(128, 64, q.device)
    lens = torch.full((1,), 65, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="mla_attention: lens must be an int32 tensor of one element"):
        mla.ext.mla_attention(q, cache, 65, cos, sin, lens)


def _judge(tmp_path, cases, mode="test", **kw):
    sub = generator.generate("mla-decode", "cuda", out=tmp_path / "submission.py")
    record = evaluator.run("mla-decode", sub, mode=mode, cases=[problems.official_case(c) for c in cases],
                           device="cuda", **kw)
    failed = [(problems.format_case(c.case), c.status, c.message) for c in record.cases if c.status != "pass"]
    assert not failed, failed
    return record


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", ["", "LINEAR=0,HEAD_GEMM=0", "ABSORB_UK=0"])
def test_every_official_case(mla, tmp_path, knobs, monkeypatch):
    _set_knobs(monkeypatch, None, knobs)
    spec = problems.load_spec("mla-decode")
    _judge(tmp_path, list(spec.tests) + list(spec.benchmarks))


@pytest.mark.gpu
def test_extra_prefills_at_the_official_dims(mla, tmp_path):
    _judge(tmp_path, [{"batchsize": 16, "dim": 7168, "dq": 1536, "prefill": p, "seed": 100 + p}
                      for p in (1, 127, 1000, 8191)])


@pytest.mark.gpu
def test_200_reseeded_leaderboard_runs(mla, tmp_path):
    record = _judge(tmp_path, [{"batchsize": 8, "dim": 7168, "dq": 1536, "prefill": 1024, "seed": 7}],
                    mode="leaderboard", protocol={"max_runs": 200, "rel_err_stop": 0.0, "leaderboard_cases": "all"})
    assert record.cases[0].runs == 200


@pytest.mark.gpu
@pytest.mark.parametrize("bs,pos", [(1, 0), (16, 1024), (128, 6144)])
def test_fused_q_assembly_is_bitwise_the_torch_path(mla, bs, pos):
    """ext.mla_assemble_q builds q_full in one launch reading the position from device memory; it must equal the
    torch ops it replaced (the reference's bf16 RoPE)."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(bs + pos)
    q = torch.randn(bs, 128, 192, generator=gen, device="cuda").bfloat16()
    qn = torch.randn(128, bs, 512, generator=gen, device="cuda").bfloat16()
    cos, sin = mla._rope_tables(8192, 64, q.device)
    c, s = cos[pos].repeat(2), sin[pos].repeat(2)
    rope = q[..., 128:]
    expected = torch.cat([qn.transpose(0, 1), rope * c + torch.cat((-rope[..., 32:], rope[..., :32]), -1) * s], -1)
    benchlib.poison_allocator()
    lens = torch.tensor([pos + 1], dtype=torch.int32, device="cuda")
    assert torch.equal(mla.ext.mla_assemble_q(qn, q, cos, sin, lens), expected)
    # the rope columns alone, in place, beside latent columns written there before (the shipped path)
    q_full = expected.clone()
    q_full[..., 512:] = float("nan")
    mla.ext.mla_rope_q(q_full, q, cos, sin, lens)
    assert torch.equal(q_full, expected)
    lens.fill_(8193)  # past the tables: NaN rather than a read out of bounds
    assert mla.ext.mla_assemble_q(qn, q, cos, sin, lens)[..., 512:].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 77, 128])
@pytest.mark.parametrize("which", ["w_uk", "w_uv"])
def test_head_gemm_matches_fp32(mla, bs, which):
    """head_gemm.cuh through ext.mla_bmm_out on the step's own strided views: W_UK into the query (b [H, 128, 512] with
    n contiguous, c the latent columns of q_full [bs, H, 576]) and W_UV out of the attention (b a transposed view, k
    contiguous), against fp32 per-head products of the same bf16 operands; outputs poisoned first, rows past bs
    untouched."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(bs + len(which))
    w_kvu = (torch.randn(128, 256, 512, generator=gen, device="cuda") / 16).bfloat16()
    if which == "w_uk":
        q = torch.randn(bs, 128, 192, generator=gen, device="cuda").bfloat16()
        a, b = q.narrow(2, 0, 128).transpose(0, 1), w_kvu.narrow(1, 0, 128)
        full = torch.full((bs, 128, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = full.narrow(2, 0, 512).transpose(0, 1)
    else:
        o = torch.randn(bs, 128, 512, generator=gen, device="cuda").bfloat16()
        a, b = o.transpose(0, 1), w_kvu.narrow(1, 128, 128).transpose(1, 2)
        full = torch.full((bs, 128, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        c = full.transpose(0, 1)
    mla.ext.mla_bmm_out(c, a, b)
    torch.cuda.synchronize()
    want = torch.bmm(a.float(), b.float())
    assert benchlib.tolerance_ratio(c, want, 8e-3, 1e-2) <= 1
    if which == "w_uk":
        assert full[..., 512:].isnan().all(), "wrote past the latent columns"


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,bn,splits", [
    (128, 7168, 16384, None, None), (128, 24576, 1536, None, None), (128, 1536, 7168, None, None),
    (128, 576, 7168, None, None), (37, 1600, 7168, "256", "2"), (1, 1600, 1024, "224", "4"),
    (100, 576, 2048, "192", "8"), (128, 512, 512, "128", "1"), (64, 4096, 4096, "96", "2"), (5, 200, 640, "64", "1"),
    (100, 1000, 1024, "112", "2"), (3, 600, 1024, "56", "1")])
def test_linear_matches_fp32(mla, m, n, k, bn, splits, monkeypatch):
    """linear.cuh (the step's wo projection): y = x w^T against fp32 on fresh random inputs, the allocator poisoned
    with NaN, at the step's projection shapes (the plan linear_config picks) and with each tile width and split
    forced on edge shapes (rows short of 128, a partial last n-tile); two runs must agree bit for bit (the cluster's
    partials are summed in rank order)."""
    import torch

    _set_knobs(monkeypatch, None, f"LINEAR_BN={bn},LINEAR_SPLITS={splits}" if bn else "")
    plan = mla.ext.mla_linear_plan(m, n, k)
    assert plan[0] == (int(bn) if bn else plan[0]) and plan[0] > 0 and plan[1] == (int(splits) if splits else plan[1])
    gen = torch.Generator(device="cuda")
    gen.manual_seed(m * 7 + n * 3 + k)
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(n, k, generator=gen, device="cuda") / math.sqrt(k)).bfloat16()
    expected = x.float() @ w.float().T
    outs = []
    for _ in range(2):
        benchlib.poison_allocator()
        outs.append(mla.ext.mla_linear(x, w))
        torch.cuda.synchronize()
    ratio = benchlib.tolerance_ratio(outs[0], expected, 1e-2, 1e-2)
    assert outs[0].shape == (m, n) and ratio <= 1, f"plan {plan}: {ratio:.2f}x the tolerance from fp32"
    assert torch.equal(outs[0], outs[1]), "two runs differ"


@pytest.mark.gpu
@pytest.mark.parametrize("m, n1, n2, k", [(128, 1536, 576, 7168), (77, 1536, 576, 7168), (3, 1000, 68, 1024)])
def test_a_pair_of_projections_in_one_launch_matches_fp32_and_the_single_launches(mla, m, n1, n2, k):
    """linear.cuh's pair (the step's q_down and kv_down of one x, finding 54): both outputs against fp32 on fresh
    random inputs with the allocator poisoned, at the step's shapes and on edge shapes (rows short of 128, partial
    last n-tiles in both projections); where the pair's tile and split equal a single projection's plan, that output
    equals mla_linear's bit for bit (the same tiles summed in the same order)."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(m + n1 + n2 + k)
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    w1 = (torch.randn(n1, k, generator=gen, device="cuda") / math.sqrt(k)).bfloat16()
    w2 = (torch.randn(n2, k, generator=gen, device="cuda") / math.sqrt(k)).bfloat16()
    benchlib.poison_allocator()
    pair = mla.ext.mla_linear_pair(x, w1, w2)
    assert pair is not None, "no pair configuration at these shapes"
    torch.cuda.synchronize()
    for y, w, name in zip(pair, (w1, w2), ("first", "second")):
        ratio = benchlib.tolerance_ratio(y, x.float() @ w.float().T, 1e-2, 1e-2)
        assert y.shape == (m, w.shape[0]) and ratio <= 1, f"{name}: {ratio:.2f}x the tolerance from fp32"
    plan = mla.ext.mla_linear_plan(m, n1 + n2, k)[:2]
    for y, w in zip(pair, (w1, w2)):
        if mla.ext.mla_linear_plan(m, w.shape[0], k)[:2] == plan:
            assert torch.equal(y, mla.ext.mla_linear(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [128, 77, 1])
def test_q_up_absorbing_w_uk_matches_fp32_and_the_separate_launches(mla, m):
    """linear.cuh's kAbsorb (the step's q_up with each head's q_nope multiplied by its W_UK in the same CTA, finding
    59) on fresh random inputs with the allocator and q_full poisoned: q's rope columns (the only ones it writes)
    equal mla_linear's bit for bit (the same tiles, the same sums); q_full's latent columns lie within the tolerance
    of fp32 products of mla_linear's bf16 q_nope by W_UK, and of the separate per-head GEMM (head_gemm.cuh); its
    rope columns stay untouched."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(m)
    x = torch.randn(m, 1536, generator=gen, device="cuda").bfloat16()
    w = (torch.randn(128 * 192, 1536, generator=gen, device="cuda") / math.sqrt(1536)).bfloat16()
    w_kvu = (torch.randn(128 * 256, 512, generator=gen, device="cuda") / 16).bfloat16()
    benchlib.poison_allocator()
    q_full = torch.full((m, 128, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = mla.ext.mla_linear_absorb(x, w, w_kvu, q_full)
    assert y is not None, "the step's q_up shape must take the absorbing kernel"
    torch.cuda.synchronize()
    q = mla.ext.mla_linear(x, w).view(m, 128, 192)
    assert torch.equal(y.view(m, 128, 192)[..., 128:], q[..., 128:])
    q_nope = q[..., :128].transpose(0, 1)
    w_uk = w_kvu.view(128, 256, 512).narrow(1, 0, 128)
    want = torch.bmm(q_nope.float(), w_uk.float()).transpose(0, 1)
    ratio = benchlib.tolerance_ratio(q_full[..., :512], want, 8e-3, 1e-2)
    assert ratio <= 1, f"{ratio:.2f}x the tolerance from fp32"
    assert q_full[..., 512:].isnan().all(), "wrote past the latent columns"
    separate = torch.full_like(q_full, float("nan"))
    mla.ext.mla_bmm_out(separate.narrow(2, 0, 512).transpose(0, 1), q_nope, w_uk)
    ratio = benchlib.tolerance_ratio(q_full[..., :512], separate[..., :512].float(), 8e-3, 1e-2)
    assert ratio <= 1, f"{ratio:.2f}x the tolerance from the per-head GEMM"


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", ["", "LINEAR=0", "FAST_REPLAY=0"])
def test_graph_replays_follow_the_inputs_and_the_growing_cache(mla, monkeypatch, knobs):
    """The shipped graph path, as benchmark mode calls it: the same (config, x, cache) objects call after call, the cache
    one row longer each time, x rewritten in place between calls. Every call must equal the eager path on a copy
    (run eagerly and captured on the first call, replayed from the second: by the binding's fast path unless
    FAST_REPLAY=0), and each call returns its own tensor."""
    import torch

    _set_knobs(monkeypatch, None, knobs)
    monkeypatch.setattr(mla, "_graphs", type(mla._graphs)())  # a fresh cache: one capture per parameter
    ref = problems.load_modules("mla-decode").reference
    config, x, cache = ref.generate_input(batchsize=16, dim=7168, dq=1536, prefill=1100, seed=5)
    outputs = []
    for call in range(4):
        x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype))
        expected_data = ref.copy_data((config, x, cache))
        monkeypatch.setenv("KBENCH_MLA_GRAPH", "0")
        expected, _ = mla.custom_kernel(expected_data)
        monkeypatch.delenv("KBENCH_MLA_GRAPH")
        benchlib.poison_allocator()
        out, data = mla.custom_kernel((config, x, cache))
        torch.cuda.synchronize()
        assert data is cache.data and cache.seq_len == 1100 + call + 1
        assert torch.equal(cache.data[:, :cache.seq_len], expected_data[2].data[:, :cache.seq_len]), f"call {call}"
        ratio = benchlib.tolerance_ratio(out, expected, 2e-2, 8e-3)  # cuBLAS may pick other algorithms in a graph
        assert ratio <= 1, f"call {call}: the graph's output is {ratio:.2f}x the tolerance from the eager path's"
        outputs.append(out)
    # captured once, after the first call; a graph that takes its output and length late is the binding's alone
    # (KBENCH_MLA_LATE needs the fast path and wo on linear.cuh)
    assert len(mla._graphs) == (0 if knobs == "" else 1)
    assert len({o.data_ptr() for o in outputs}) == len(outputs), "each call returns its own tensor"
    assert mla.ext.mla_fast_replays() == (0 if knobs == "FAST_REPLAY=0" else 1), "the last call's replay"


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", ["", "MOVING=0"])
def test_the_fast_path_launches_a_held_graph_only_on_its_own_inputs(mla, monkeypatch, knobs):
    """mla_replay (the shipped fast path) launches a held graph only for the inputs (their addresses too with
    MOVING=0; a moving graph takes any) and knobs it was captured on and only for the GraphReplay that captured it;
    any other call takes entry.py's Python path. Each output (poisoned allocator) must equal the eager path's on a
    copy, and the cache must grow by one row a call either way."""
    _set_knobs(monkeypatch, None, knobs)
    monkeypatch.setattr(mla, "_graphs", type(mla._graphs)())
    mla.ext.mla_fast_replays()  # from zero
    ref = problems.load_modules("mla-decode").reference
    config, x, cache = ref.generate_input(batchsize=16, dim=7168, dq=1536, prefill=1100, seed=8)

    def fast_replays(inputs) -> int:
        _check_against_eager(mla, monkeypatch, inputs)
        return mla.ext.mla_fast_replays()

    assert fast_replays((config, x, cache)) == 0, "the first call runs eagerly (and is captured)"
    assert fast_replays((config, x, cache)) == 1, "the next is launched by the fast path"
    monkeypatch.setenv("KBENCH_MLA_LINEAR_SPLITS", "1")  # the same inputs, another configuration
    assert fast_replays((config, x, cache)) == 0
    monkeypatch.delenv("KBENCH_MLA_LINEAR_SPLITS")
    assert fast_replays((config, x, cache)) == 1, "both graphs held: the first one again"
    assert fast_replays((config, x.clone(), cache)) == (1 if knobs == "" else 0), "x at another address"
    monkeypatch.setattr(mla, "_graphs", type(mla._graphs)())  # another GraphReplay: not its graphs
    assert fast_replays((config, x, cache)) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("recur,knobs", [("", ""), ("", "MOVING=0"), ("1", "MOVING=0")],
                         ids=["shipped", "MOVING=0", "MOVING=0,RECUR=1"])
def test_inputs_regenerated_at_two_addresses_in_turn_reach_the_fast_path(mla, monkeypatch, recur, knobs):
    """Inputs regenerated every call (leaderboard mode) that the allocator hands two address sets in turn (as it does
    moe's: host_gap.py --addresses; mla-decode's came back only every 8 runs or more, notes finding 50): after a capture
    that never came back (set X), each of A and B is captured when it comes back, then both run on the fast path.
    Every call's inputs are new values written in place (weights, x, the cache and its length), every output poisoned
    first and compared with the eager path on a copy. KBENCH_GRAPH_RECUR=1 (twice in a row only) never captures them.
    The shipped moving graph (captured on X) serves every call after X."""
    _set_knobs(monkeypatch, None, knobs)
    ref = problems.load_modules("mla-decode").reference
    case = dict(batchsize=16, dim=7168, dq=1536)
    sets = {name: ref.generate_input(**case, prefill=1100, seed=seed) for name, seed in (("X", 1), ("A", 2), ("B", 3))}

    def call(index: int, name: str) -> None:
        config, x, cache = sets[name]
        fresh_config, fresh_x, fresh_cache = ref.generate_input(**case, prefill=1090 + index, seed=100 + index)
        for weight in ("Q_proj_down_weight", "Q_proj_up_weight", "KV_proj_down_weight", "KV_proj_up_weight",
                       "wo_weight"):
            getattr(config, weight).copy_(getattr(fresh_config, weight))
        x.copy_(fresh_x)
        cache.data.copy_(fresh_cache.data)
        cache.seq_len = fresh_cache.seq_len
        _check_against_eager(mla, monkeypatch, sets[name], what=f"call {index} ({name})")

    regenerated_inputs.run_schedule(monkeypatch, mla, mla.ext.mla_fast_replays, recur, call,
                                    any_address=knobs == "")


def _unaligned_x(data):
    """data with x copied to an address 2 bytes past a 16-byte boundary."""
    import torch

    config, x, cache = data
    padded = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    moved = padded[1:].view(x.shape)
    moved.copy_(x)
    return config, moved, cache


@pytest.mark.gpu
def test_a_moving_graph_follows_inputs_new_every_call(mla, monkeypatch):
    """Leaderboard mode's inputs: every call's seven inputs newly allocated (x, the cache, the five weights), with new
    values and a new cache length. The moving graph captured on the first call (KBENCH_MLA_MOVING, shipped) must
    serve every later call through the fast path, each output (poisoned allocator) within the tolerance of the
    eager path's on a copy and each cache with its new row. An x whose address is not 16-byte aligned (a TMA map
    cannot read it) must take the eager path, and still be right."""
    monkeypatch.setattr(mla, "_graphs", type(mla._graphs)())
    mla.ext.mla_fast_replays()  # from zero
    ref = problems.load_modules("mla-decode").reference
    case = dict(batchsize=16, dim=7168, dq=1536)
    held = []  # every call's inputs kept alive, so that no later call's land at an earlier call's addresses
    fast = []
    for index in range(8):
        data = ref.generate_input(**case, prefill=1000 + 37 * index, seed=200 + index)
        expected_data = ref.copy_data(data)
        if index == 6:  # x at an odd element offset inside a larger buffer, in both (cuBLAS reads it in both)
            data, expected_data = (_unaligned_x(d) for d in (data, expected_data))
        held.append(data)
        _check_against_eager(mla, monkeypatch, data, expected_data, f"call {index}")
        fast.append(mla.ext.mla_fast_replays())
    assert fast == [0, 1, 1, 1, 1, 1, 0, 1], fast
    # the last call's steps: the graph on the first call's own addresses missed, the moving graph's launch took
    # the call's addresses after it
    assert [step for step, _ in mla.ext.mla_replay_steps()] == ["knobs", "describe", "find", "launch", "inputs",
                                                                  "output"]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", ["", "LATE=0", "three-x"])
def test_late_lengths_and_outputs_reach_their_own_launches_while_the_host_runs_ahead(mla, monkeypatch, knobs):
    """KBENCH_MLA_LATE (the shipped fast path): each held graph's launch takes its own call's cache length and output
    address, published after the launch through a ring of kLateRing = 64 calls (late_address.h). 150 calls are
    queued behind a 0.2 s GPU sleep, so the host runs more than 64 calls ahead and must wait for the GPU instead of
    overwriting a call not yet taken. Call i writes x_j and the cache length seq0 + j (j = i % 3): its append goes to
    row seq0 + j and its attention reads rows [0, seq0 + j], so a launch that took another call's length or address
    differs bit for bit from the eager result for j (or is NaN: outputs poisoned). An eager call (KBENCH_MLA_GRAPH=0,
    which takes nothing) sits in the middle. LATE=0: the same with the length written by the stream. three-x: x_j
    is a tensor of its own at its own address, so calls with x_1 and x_2 launch the moving graph, whose input
    addresses go through a ring of their own (moving_inputs.h), under the same backlog."""
    import torch

    _set_knobs(monkeypatch, None, "" if knobs == "three-x" else knobs)
    monkeypatch.setattr(mla, "_graphs", type(mla._graphs)())
    ref = problems.load_modules("mla-decode").reference
    config, x, cache = ref.generate_input(batchsize=16, dim=7168, dq=1536, prefill=1100, seed=9)
    seq0 = cache.seq_len
    values = [torch.randn_like(x) for _ in range(3)]

    def call(j: int) -> torch.Tensor:
        if knobs == "three-x":
            given = values[j]
        else:
            x.copy_(values[j])
            given = x
        cache.seq_len = seq0 + j
        return mla.custom_kernel((config, given, cache))[0]

    monkeypatch.setenv("KBENCH_MLA_GRAPH", "0")
    expected = [call(j).clone() for j in range(3)]  # (rows seq0 + j then hold x_j's row, as after every later cycle)
    monkeypatch.delenv("KBENCH_MLA_GRAPH")
    for _ in range(2):  # eager and captured, then launched by the binding
        call(0)
    mla.ext.mla_fast_replays()  # from zero
    torch.cuda.synchronize()
    benchlib.poison_allocator()
    # the outputs come from the allocator's small pool: grown here, every block NaN, so that the 150 outputs made
    # during the backlog start poisoned and need no new segment (compute-sanitizer judges a kernel's accesses by the
    # allocations that existed at its launch, and a late output is made after its graph's launch)
    spare = [torch.full_like(expected[0], float("nan")) for _ in range(160)]
    del spare
    outputs = []
    torch.cuda._sleep(300_000_000)  # ~0.2 s of GPU time: the host queues every call below before the GPU runs one
    for i in range(150):
        if i == 75:
            monkeypatch.setenv("KBENCH_MLA_GRAPH", "0")
            outputs.append(call(i % 3))
            monkeypatch.delenv("KBENCH_MLA_GRAPH")
        else:
            outputs.append(call(i % 3))
    torch.cuda.synchronize()
    # every call but the eager one launched a held graph; the eager call's Python path read (and reset) the count of
    # the 75 before it
    assert mla.ext.mla_fast_replays() == 74
    assert len(mla._graphs) == (1 if knobs == "LATE=0" else 0), "a late graph is the binding's alone"
    # the last call's steps in the fast path (benchmarks/mla_decode.py --windows reads them); call 149 has j = 2
    assert [step for step, _ in mla.ext.mla_replay_steps()] == {
        "": ["knobs", "describe", "find", "launch", "output"],
        "three-x": ["knobs", "describe", "find", "launch", "inputs", "output"],
        "LATE=0": ["knobs", "describe", "find", "length", "launch", "output"]}[knobs]
    for i, out in enumerate(outputs):
        assert torch.equal(out, expected[i % 3]), f"call {i} differs from the eager result for its x and length"
    if knobs != "LATE=0":
        assert 0 < mla.ext.mla_late_wait_us(x) < 1e6


# Three calls of one step in a process that has made no CUDA library call before: the first runs eagerly and is
# captured behind (graph_replay), the next two replay the graph.
_FRESH_PROCESS_STEP = textwrap.dedent("""
    import torch
    from kbench import benchlib, problems
    mod = benchlib.build("mla-decode", "cuda")
    ref = problems.load_modules("mla-decode").reference
    config, x, cache = ref.generate_input(batchsize=16, dim=7168, dq=1536, prefill=1100, seed=7)
    seq0, outs = cache.seq_len, []
    for call in range(3):
        cache.seq_len = seq0  # the same step each time: the new row rewritten
        out, _ = mod.custom_kernel((config, x, cache))
        outs.append(out.clone())
    torch.cuda.synchronize()
    assert mod.ext.mla_fast_replays() == 2, "captured once, on the first call, and launched by the next two"
    for i, out in enumerate(outs[1:], 1):
        assert torch.equal(out, outs[0]), f"call {i} (a replay) differs from the eager first call"
    print("three calls ok")
""")


@pytest.mark.gpu
def test_the_first_capture_in_a_fresh_process(mla):
    """The step's capture (behind its first, eager run) must not be the process's first use of a library whose set-up
    cannot be captured: the shipped build of 2026-11-25 captured cuBLAS's first call and failed
    (docs/mla-decode-notes.md, finding 33). Run in a new process, where nothing but the step has touched the GPU; the
    replays must equal the eager call bit for bit (the same kernels run in both paths)."""
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_STEP], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "three calls ok" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
