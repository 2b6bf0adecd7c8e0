"""GPU tier: the moe CUDA backend (kernels/moe/cuda). Synthetic routings the official generator rarely makes (empty
experts, every token on a few experts, one token, E = 4 and 8, K = 1) against an fp32 definition, the allocator
poisoned with NaN before every call; then the generated submission through the evaluator on every official test and
benchmark case. compute-sanitizer runs the synthetic test in benchmarks/gpu_session.sh."""
import math

import pytest

import regenerated_inputs
from kbench import benchlib, evaluator, generator, problems


@pytest.fixture(scope="module")
def moe():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper (sm_90) GPU for the sm_90a kernels")
    return benchlib.build("moe", "cuda")


def definition(x, experts, scores, gate, up, down):
    """out = shared(x) + sum_k score * expert_k(x), in fp32 from the fp16 operands (last weights: the shared expert)."""
    import torch.nn.functional as F

    xf = x.float()

    def ffn(v, g):
        return (F.silu(v @ gate[g].float()) * (v @ up[g].float())) @ down[g].float()

    out = ffn(xf, len(gate) - 1)
    for e in range(len(gate) - 1):
        t, k = (experts == e).nonzero(as_tuple=True)
        if t.numel():
            out.index_add_(0, t, ffn(xf[t], e) * scores[t, k].float().unsqueeze(1))
    return out


# (tokens, experts, slots, skew): skew = every token picks among the first `skew` experts (the others get none)
# (4096, 8, 4): ~320 units, so each CTA of the persistent GEMMs walks two or three and every ring wraps
# (192 / 193, 4, 1, 1): one expert and the shared one get 192 / 193 rows: a last m-tile of exactly 64 rows and of 65
ROUTINGS = [(1, 4, 4, None), (7, 8, 2, None), (300, 8, 4, 4), (1000, 32, 4, None), (513, 4, 1, 1),
            (2048, 32, 4, 6), (129, 64, 8, None), (4096, 8, 4, None), (192, 4, 1, 1), (193, 4, 1, 1)]


# the shipped configuration (the async epilogue, the gather through the load/store units, bands of 16 m-tiles: the
# (4096, 8, 4) routing's shared expert has 32; k-32 ring stages in the shared expert's GEMM 1 and GEMM 2), the
# candidates' knobs (kernels/moe/cuda/moe_api.h: MoeConfig) on
# together with the consumers' own epilogue, the previous builds' combine pass and one-block routing, the consumers'
# own epilogue alone and with Y written, the gather pass, the TMA gather without bands, bands of 2 and 3 m-tiles
# (a band shorter than the others at the group's end), and the ring stages' k: 32 (64-byte swizzled A tiles) in
# every launch, 64 in every launch (the default has 32 in the shared expert's GEMM 1 and GEMM 2 beside the routed
# GEMM 1's 64), and 32 with bands and the gather pass; every half-empty unit's MMAs issued (the default skips them
# where experts average <= 512 rows: most of these routings); each unit decoded at its start from group 0 (the build
# before decode-ahead), with the consumers' own epilogue and bands of 2
KNOBS = [{}, {"KBENCH_MOE_SKIP_EMPTY_HALVES": "1", "KBENCH_MOE_KEEP_WORKSPACES": "1", "KBENCH_MOE_STAGES": "3",
              "KBENCH_MOE_ASYNC_EPILOGUE": "0"},
         {"KBENCH_MOE_RED_COMBINE": "0", "KBENCH_MOE_SPLIT_ROUTE": "0"},
         {"KBENCH_MOE_ASYNC_EPILOGUE": "0"}, {"KBENCH_MOE_ASYNC_EPILOGUE": "0", "KBENCH_MOE_RED_COMBINE": "0"},
         {"KBENCH_MOE_SHARED_GATHER": "0"}, {"KBENCH_MOE_GATHER_LSU": "0", "KBENCH_MOE_BAND": "0"},
         {"KBENCH_MOE_BAND": "2"}, {"KBENCH_MOE_BAND": "3", "KBENCH_MOE_ASYNC_EPILOGUE": "0"},
         {"KBENCH_MOE_BK32": "7"}, {"KBENCH_MOE_BK32": "0"},
         {"KBENCH_MOE_BK32": "7", "KBENCH_MOE_BAND": "2", "KBENCH_MOE_SHARED_GATHER": "0"},
         {"KBENCH_MOE_SKIP_EMPTY_HALVES": "0"},
         {"KBENCH_MOE_DECODE_AHEAD": "0", "KBENCH_MOE_ASYNC_EPILOGUE": "0", "KBENCH_MOE_BAND": "2"}]
KNOB_IDS = ["default", "candidates", "combine-pass", "sync-epilogue", "sync-epilogue-y", "gather-pass",
            "tma-gather-no-band", "band2", "band3-sync-epilogue", "bk32", "bk64", "bk32-band2-gather-pass",
            "no-skip", "decode-scan-sync-epilogue-band2"]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", KNOBS, ids=KNOB_IDS)
@pytest.mark.parametrize("tokens,n_experts,k,skew", ROUTINGS)
def test_synthetic_routings_match_the_definition(moe, tokens, n_experts, k, skew, knobs, monkeypatch):
    import torch

    for name, value in knobs.items():
        monkeypatch.setenv(name, value)

    gen = torch.Generator(device="cuda")
    gen.manual_seed(tokens + n_experts)
    d, dexp = 512, 256

    def w(r, c):
        return (torch.randn(r, c, generator=gen, device="cuda") / math.sqrt(c)).half()

    x = torch.randn(tokens, d, generator=gen, device="cuda").half()
    gate, up = [w(d, dexp) for _ in range(n_experts + 1)], [w(d, dexp) for _ in range(n_experts + 1)]
    down = [w(dexp, d) for _ in range(n_experts + 1)]
    pool = skew or n_experts
    experts = torch.stack([torch.randperm(pool, generator=gen, device="cuda")[:k] for _ in range(tokens)])
    scores = torch.rand(tokens, k, generator=gen, device="cuda").half()
    for attempt in range(2):  # twice: nothing may depend on what the previous call left in the workspaces
        benchlib.poison_allocator()
        out = moe.ext.moe_forward(x, experts, scores, gate, up, down)
        torch.cuda.synchronize()
        ratio = benchlib.tolerance_ratio(out, definition(x, experts, scores, gate, up, down), 1e-2, 1e-2)
        assert ratio <= 1, f"call {attempt + 1}: worst error {ratio:.3f}x the tolerance"


# moe_layer's launch orders (kernels/moe/cuda/moe_api.h: MoeConfig): the shared expert's GEMM 1 gathering after the
# routing (the default, and with the TMA unit's bulk copies), before the router, and after the router with the gather
# pass; the router's softmax and top-k by ATen's ops (the build before fused_topk)
LAYER_ORDERS = {"shared-gather": {}, "shared-gather-tma": {"KBENCH_MOE_GATHER_LSU": "0"},
                "aten-topk": {"KBENCH_MOE_FUSED_TOPK": "0"},
                "shared-first": {"KBENCH_MOE_SHARED_GATHER": "0"},
                "shared-last": {"KBENCH_MOE_SHARED_GATHER": "0", "KBENCH_MOE_SHARED_FIRST": "0"}}


@pytest.mark.gpu
# (20000, 8, 2): the shared expert's launch has 314 units, two or three a CTA, so each CTA's epilogue warps copy
# several slices
@pytest.mark.parametrize("order", list(LAYER_ORDERS))
@pytest.mark.parametrize("tokens,n_experts,k", [(300, 8, 4), (129, 4, 2), (1000, 32, 4), (20000, 8, 2)])
def test_layer_with_its_router_matches_the_definition(moe, tokens, n_experts, k, order, monkeypatch):
    """moe_layer: the router's ops, then the experts, in each launch order (LAYER_ORDERS). The experts the reference's
    ops pick (F.linear, softmax, topk unsorted) must be the kernel's: its returned scores are compared exactly, the
    output against the fp32 definition on those experts. With KBENCH_MOE_SHARED_FIRST=1 the shared expert's GEMM 1 is
    its own launch before the router, writing H rows the routed GEMM 1 then leaves alone; KBENCH_MOE_SHARED_GATHER=1
    (the default) overrides it: that launch runs after the routing and gathers xs and zeroes the output in its
    epilogue warps."""
    import torch
    import torch.nn.functional as F

    for name, value in LAYER_ORDERS[order].items():
        monkeypatch.setenv(name, value)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(tokens * 7 + n_experts)
    d, dexp = 512, 256

    def w(r, c):
        return (torch.randn(r, c, generator=gen, device="cuda") / math.sqrt(c)).half()

    x = torch.randn(1, tokens, d, generator=gen, device="cuda").half()
    router = w(n_experts, d)
    gate, up = [w(d, dexp) for _ in range(n_experts + 1)], [w(d, dexp) for _ in range(n_experts + 1)]
    down = [w(dexp, d) for _ in range(n_experts + 1)]
    scores, experts = torch.topk(F.linear(x, router).softmax(-1), k, dim=-1, sorted=False)
    scores, experts = scores.view(-1, k), experts.view(-1, k)
    want = definition(x.view(-1, d), experts, scores, gate, up, down)
    for attempt in range(2):
        benchlib.poison_allocator()
        out = moe.ext.moe_output(x.view(-1, d), k, n_experts)
        y, got_scores = moe.ext.moe_layer(x, router, k, gate, up, down, out)
        if out is None:
            out = moe.ext.moe_combine(y, got_scores)
        torch.cuda.synchronize()
        assert torch.equal(got_scores, scores), "the router's scores differ from the reference ops'"
        ratio = benchlib.tolerance_ratio(out, want, 1e-2, 1e-2)
        assert ratio <= 1, f"call {attempt + 1}: worst error {ratio:.3f}x the tolerance"


# (tokens, experts, slots): the official shapes, the tests' E = 8 and 4, widths 1 to 64 with E not a power of two
# (padded lanes), K = E, and a block's pairs ending inside a token (K = 3, 5: router_topk_kernel's blocks own 256 pairs)
TOPK_SHAPES = [(2048, 32, 4), (8192, 32, 4), (65536, 32, 4), (1000, 8, 2), (129, 4, 1), (300, 6, 3), (777, 64, 8),
               (513, 33, 5), (100, 16, 16), (50, 1, 1), (1001, 2, 2), (4097, 12, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("logits_kind", ["normal", "ties"])
@pytest.mark.parametrize("tokens,n_experts,k", TOPK_SHAPES)
def test_the_fused_router_picks_what_torch_topk_picks(moe, tokens, n_experts, k, logits_kind):
    """router.cuh against the reference's ops on the same logits: torch.topk(logits.softmax(-1), k, sorted=False)'s
    values bit for bit and its indices in its order. "ties": logits from four values, so most rows hold equal
    probabilities at the k-th place (the lowest indices must win, as gatherTopK picks them); a row of equal logits
    and a row with an -inf logit as well."""
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(tokens * 31 + n_experts * 7 + k)
    if logits_kind == "normal":
        logits = (torch.randn(tokens, n_experts, generator=gen, device="cuda") * 2).half()
    else:
        levels = torch.tensor([-1.0, 0.0, 0.5, 3.0], device="cuda")
        logits = levels[torch.randint(0, 4, (tokens, n_experts), generator=gen, device="cuda")].half()
        logits[0] = 1.0
        logits[-1, 0] = float("-inf")
    want_scores, want_experts = torch.topk(logits.softmax(-1), k, dim=-1, sorted=False)
    for attempt in range(2):
        benchlib.poison_allocator()
        scores, experts = moe.ext.moe_router_topk(logits, k)
        torch.cuda.synchronize()
        assert torch.equal(scores.view(torch.int16), want_scores.view(torch.int16)), \
            f"call {attempt + 1}: scores differ from softmax + topk in {(scores != want_scores).any(-1).sum()} rows"
        assert torch.equal(experts, want_experts), \
            f"call {attempt + 1}: experts differ in {(experts != want_experts).any(-1).sum()} rows"


@pytest.mark.gpu
def test_generated_submission_passes_every_official_case(moe, tmp_path):
    spec = problems.load_spec("moe")
    sub = generator.generate("moe", "cuda", out=tmp_path / "submission.py")
    cases = [problems.official_case(c) for c in spec.tests + spec.benchmarks]
    record = evaluator.run("moe", sub, mode="test", cases=cases, device="cuda")
    failed = [(problems.format_case(c.case), c.status, c.message) for c in record.cases if c.status != "pass"]
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [KNOBS[0], KNOBS[2], {"KBENCH_MOE_PY_KEY": "1", "KBENCH_MOE_FAST_REPLAY": "0"},
                                   {"KBENCH_MOE_FAST_REPLAY": "0"},
                                   {"KBENCH_MOE_PUBLISH_KERNEL": "1", "KBENCH_MOE_LATE_OUTPUT": "0"},
                                   {"KBENCH_MOE_LATE_OUTPUT": "0"}],
                         ids=[KNOB_IDS[0], KNOB_IDS[2], "py-key", "py-replay", "publish-kernel", "early-output"])
def test_graph_replays_follow_the_inputs(moe, knobs, monkeypatch):
    """The shipped graph path as benchmark mode calls it: the same tensors call after call, their values rewritten in
    place between calls (x and every weight). Each call must pass the reference's check and match the eager path
    (KBENCH_MOE_GRAPH=0); it is captured after the first call and replayed from the second (by the binding's fast
    path where it is on: the default); each call returns its own tensor (with red_combine: a new output each call,
    which the replayed graph finds through the device slot; on the fast path by default it makes that output after the
    launch, late_output)."""
    import torch

    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())

    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=2, seqlen=300, seed=11)
    x, weights, _ = data
    outputs = []
    for call in range(4):
        for t in (x, *weights.values()):
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype) / (t.shape[-1] ** 0.5 if t is not x else 1))
        monkeypatch.setenv("KBENCH_MOE_GRAPH", "0")
        expected = moe.custom_kernel(data)
        monkeypatch.delenv("KBENCH_MOE_GRAPH")
        benchlib.poison_allocator()
        out = moe.custom_kernel(data)
        torch.cuda.synchronize()
        ok, msg = ref.check_implementation(data, out)
        assert ok, f"call {call}: {msg}"
        ratio = benchlib.tolerance_ratio(out, expected, 1e-2, 1e-2)
        assert ratio <= 1, f"call {call}: the graph's output is {ratio:.2f}x the tolerance from the eager path's"
        outputs.append(out)
    # the last call's replay came from the fast path exactly where it is on (red_combine, no Python-path knob)
    fast = "KBENCH_MOE_RED_COMBINE" not in knobs and "KBENCH_MOE_FAST_REPLAY" not in knobs
    late = fast and "KBENCH_MOE_LATE_OUTPUT" not in knobs
    # captured once, after the first call; a graph that takes its output late is the binding's alone
    assert len(moe._graphs) == (0 if late else 1)
    assert len({o.data_ptr() for o in outputs}) == len(outputs), "each call returns its own tensor"
    assert moe.ext.moe_fast_replays() == (1 if fast else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("speculate", ["1", "0"], ids=["shipped", "SPECULATE=0"])
def test_the_fast_path_launches_a_held_graph_only_on_its_own_inputs(moe, monkeypatch, speculate):
    """moe_replay (the shipped fast path) launches a graph the binding holds only for the call it was captured on:
    the same GraphReplay, the same tensors' addresses, dtypes, shapes and strides, the same knobs; any other call
    goes to entry.py's Python path. With KBENCH_MOE_SPECULATE (shipped) a graph whose router inputs match is launched
    before the rest is compared, and called off where they differ (its GEMMs see a null output): a moved expert
    weight must still give the reference's output. Every output poisoned first (the allocator) and checked by the
    reference."""
    import torch

    monkeypatch.setenv("KBENCH_MOE_SPECULATE", speculate)
    first = ["launch", "describe", "find"] if speculate == "1" else ["describe", "find"]

    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=128, seed=9)
    x, weights, config = data
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())
    moe.ext.moe_fast_replays()  # from zero

    def fast_replays(inputs) -> int:
        benchlib.poison_allocator()
        out = moe.custom_kernel(inputs)
        torch.cuda.synchronize()
        ok, msg = ref.check_implementation(inputs, out)
        assert ok, msg
        return moe.ext.moe_fast_replays()

    assert fast_replays(data) == 0, "the first call runs eagerly (and is captured)"
    assert fast_replays(data) == 1, "the next is launched by the fast path"
    steps = moe.ext.moe_replay_steps()  # its host time a step (moe_launch_phases.py's replay:* columns)
    # (late_output: the output is made after the launch)
    assert [name for name, _ in steps] == ["knobs"] + first + (["output"] if speculate == "1" else
                                                                ["launch", "output"]), steps
    assert all(0 <= us < 1e6 for _, us in steps), steps
    monkeypatch.setenv("KBENCH_MOE_BK32", "7")  # the same inputs, another configuration
    assert fast_replays(data) == 0
    monkeypatch.delenv("KBENCH_MOE_BK32")
    assert fast_replays(data) == 1, "both graphs held: the first one again"
    moved = dict(weights, **{"experts.3.1.weight": weights["experts.3.1.weight"].clone()})  # another address
    assert fast_replays((x, moved, config)) == 0
    # (speculate: launched on x and the router weight, then called off by the comparison)
    assert [name for name, _ in moe.ext.moe_replay_steps()] == ["knobs"] + first, moe.ext.moe_replay_steps()
    gate = weights["experts.5.0.weight"]  # the same address and shape, other strides: no launch, the binding's error
    restrided = dict(weights, **{"experts.5.0.weight": gate.as_strided(gate.shape, (1, gate.shape[0]))})
    with pytest.raises(RuntimeError, match="must be a contiguous fp16 CUDA tensor"):
        moe.custom_kernel((x, restrided, config))
    assert moe.ext.moe_fast_replays() == 0
    assert fast_replays(data) == 1, "the good inputs again"
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())  # another GraphReplay: not its graphs
    assert fast_replays(data) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("recur", ["", "1"], ids=["shipped", "RECUR=1"])
def test_inputs_regenerated_at_two_addresses_in_turn_reach_the_fast_path(moe, monkeypatch, recur):
    """Leaderboard mode regenerates the inputs every run, and the allocator soon hands them two address sets in turn
    (host_gap.py --addresses: ABCDEFEFEF). After a capture that never came back (set X), each of the sets A and B is
    captured when it comes back, then both run on the fast path. Every call's inputs are new values written in place
    (as a regeneration at the same address), every output poisoned first and checked by the reference.
    KBENCH_GRAPH_RECUR=1 (the policy before: twice in a row only) never captures them."""
    import torch

    ref = problems.load_modules("moe").reference
    case = dict(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4, bs=1, seqlen=256)
    sets = {name: ref.generate_input(**case, seed=seed) for name, seed in (("X", 1), ("A", 2), ("B", 3))}

    def call(index: int, name: str) -> None:
        x, weights, config = sets[name]
        fresh_x, fresh_weights, _ = ref.generate_input(**case, seed=100 + index)  # the run's new values, in place
        x.copy_(fresh_x)
        for key, w in weights.items():
            w.copy_(fresh_weights[key])
        benchlib.poison_allocator()
        out = moe.custom_kernel(sets[name])
        torch.cuda.synchronize()
        ok, msg = ref.check_implementation(sets[name], out)
        assert ok, f"call {index} ({name}): {msg}"

    regenerated_inputs.run_schedule(monkeypatch, moe, moe.ext.moe_fast_replays, recur, call)


@pytest.mark.gpu
def test_late_outputs_reach_their_own_launches_while_the_host_runs_ahead(moe, monkeypatch):
    """late_output (the shipped fast path): each held graph's launch takes the address of the output its own call
    makes after the launch, through a ring of kLateRing = 64 words. 150 calls are queued behind a 0.2 s GPU sleep,
    so the host runs more than 64 calls ahead and must wait for the GPU in publish() instead of overwriting an
    address not yet taken; x is rewritten in place between calls (three values in turn), an eager call
    (KBENCH_MOE_GRAPH=0, which takes no address) sits in the middle, and every output is kept, poisoned first, and
    compared with the eager result for its x: a launch that took another call's address leaves NaN or the wrong
    values."""
    import torch

    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=1024, seed=21)
    x, weights, config = data
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())
    values = [torch.randn_like(x) for _ in range(3)]
    expected = []
    monkeypatch.setenv("KBENCH_MOE_GRAPH", "0")
    for v in values:
        x.copy_(v)
        expected.append(moe.custom_kernel(data).clone())
    monkeypatch.delenv("KBENCH_MOE_GRAPH")
    for _ in range(2):  # eager and captured, then held by the binding
        moe.custom_kernel(data)
    moe.ext.moe_fast_replays()  # from zero
    torch.cuda.synchronize()
    benchlib.poison_allocator()
    outputs, which_x = [], []
    torch.cuda._sleep(300_000_000)  # ~0.2 s of GPU time: the host queues every call below before the GPU runs one
    for call in range(150):
        x.copy_(values[call % 3])
        if call == 75:
            monkeypatch.setenv("KBENCH_MOE_GRAPH", "0")
            outputs.append(moe.custom_kernel(data))
            monkeypatch.delenv("KBENCH_MOE_GRAPH")
        else:
            outputs.append(moe.custom_kernel(data))
        which_x.append(call % 3)
    torch.cuda.synchronize()
    # every call but the eager one launched a held graph; the eager call's Python path read (and reset) the count of
    # the 75 before it
    assert moe.ext.moe_fast_replays() == 74
    for call, (out, which) in enumerate(zip(outputs, which_x)):
        ratio = benchlib.tolerance_ratio(out, expected[which], 1e-2, 1e-2)
        assert ratio <= 1, f"call {call}: {ratio:.2f}x the tolerance from its own input's eager result"


@pytest.mark.gpu
def test_the_launch_key_holds_every_input_address(moe, monkeypatch):
    """entry.prepare's key (moe_prepare's walk of the weights dict in C++) is the addresses Python's data_ptr() reads,
    x first, then the weights in the dict's order, followed by the host values; the KBENCH_MOE_PY_KEY=1 path gives the
    same addresses as a tuple. A dict with a value that is not a tensor is refused with a message."""
    import sys

    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=64, seed=7)
    x, weights, _ = data
    tensors = (x, *weights.values())
    out, key = moe.prepare(x, weights, 8, 4)
    assert key[0] == b"".join(t.data_ptr().to_bytes(8, sys.byteorder) for t in tensors)
    assert out.shape == (64, 1024) and out.dtype == x.dtype
    monkeypatch.setenv("KBENCH_MOE_PY_KEY", "1")
    old_out, old_key = moe.prepare(x, weights, 8, 4)
    assert old_key[:len(tensors)] == tuple(t.data_ptr() for t in tensors)
    assert old_key[len(tensors):] == key[1:], "the same host values after the addresses"
    monkeypatch.delenv("KBENCH_MOE_PY_KEY")
    with pytest.raises(RuntimeError, match="every value of the weights dict must be a tensor"):
        moe.prepare(x, {**weights, "note": 1.0}, 8, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [KNOBS[0], KNOBS[2]], ids=[KNOB_IDS[0], KNOB_IDS[2]])
def test_a_graph_launched_on_reshaped_inputs_is_thrown_away(moe, knobs, monkeypatch):
    """x coming back at the same address with fewer tokens must not get the captured graph's output (computed for
    the captured tokens, and with red_combine written over that many output rows): x's shape is part of the graph's
    launch key (the weights' shapes and strides are checked behind the launch: the malformed-weight test), so the
    64-token graph is not launched, and the answer for 40 tokens passes the reference's check."""
    import torch

    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=64, seed=5)
    x, weights, config = data
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())  # none held from earlier tests
    for _ in range(2):  # eager and captured, then replayed
        moe.custom_kernel(data)
    late = "KBENCH_MOE_RED_COMBINE" not in knobs  # (a late-output graph is the binding's alone)
    assert len(moe._graphs) == (0 if late else 1)
    fewer = (x[:, :40], weights, config)  # same address, 40 of the 64 tokens
    out = moe.custom_kernel(fewer)
    torch.cuda.synchronize()
    # x's shape is part of the launch key (with red_combine a replay writes the captured 64 output rows), so the
    # 64-token graph is not launched for 40 tokens; the verify-behind-the-launch path is the malformed-weight test's
    assert out.shape == (1, 40, 1024)
    ok, msg = ref.check_implementation(fewer, out)
    assert ok, msg
    ok, msg = ref.check_implementation(data, moe.custom_kernel(data))  # the original inputs work again
    assert ok, msg


@pytest.mark.gpu
@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_a_malformed_expert_weight_is_refused_with_a_message(moe, bad, monkeypatch):
    """A known-bad input: an expert weight of another shape at the same address (after a graph was captured for the
    good one), or of another dtype. The call raises the binding's one-line RuntimeError (a formatted TORCH_CHECK
    message once crashed the process here instead: kernels/_common/torch_check.h)."""
    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=64, seed=6)
    x, weights, config = data
    monkeypatch.setattr(moe, "_graphs", type(moe._graphs)())
    for _ in range(2):
        moe.custom_kernel(data)
    malformed = dict(weights)
    gate = weights["experts.0.0.weight"]
    malformed["experts.0.0.weight"] = gate.view(gate.shape[1], gate.shape[0]) if bad == "shape" else gate.float()
    with pytest.raises(RuntimeError, match=r"every gate weight must be a contiguous fp16 CUDA tensor \[1024, \d+\]"):
        moe.custom_kernel((x, malformed, config))


@pytest.mark.gpu
def test_red_combine_refuses_an_output_it_did_not_publish(moe, monkeypatch):
    """A known-bad call: with KBENCH_MOE_RED_COMBINE=1 the kernels add into the tensor whose address moe_output wrote
    to device memory; moe_experts handed any other tensor (or none) must refuse with the binding's one-line error
    instead of writing where the slot points. The published tensor itself gets the layer's output."""
    import torch
    import torch.nn.functional as F

    monkeypatch.setenv("KBENCH_MOE_RED_COMBINE", "1")
    ref = problems.load_modules("moe").reference
    data = ref.generate_input(dhidden=1024, dexpert=256, nroutedexperts=8, nsharedexperts=1, nexpertspertoken=4,
                              bs=1, seqlen=96, seed=7)
    x, weights, _ = data
    scores, experts = torch.topk(F.linear(x, weights["router.weight"]).softmax(-1), k=4, dim=-1, sorted=False)
    names = [f"experts.{e}" for e in range(8)] + ["shared_experts"]
    args = (x.view(-1, 1024), experts.view(-1, 4), scores.view(-1, 4),
            *[[weights[f"{n}.{i}.weight"] for n in names] for i in range(3)])
    published = moe.ext.moe_output(args[0], 4, 8)
    for wrong in (torch.empty_like(published), None):
        with pytest.raises(RuntimeError, match=r"pass the \[T, d\] tensor moe_output just returned"):
            moe.ext.moe_experts(*args, wrong)
    assert moe.ext.moe_experts(*args, published) is None
    ok, msg = ref.check_implementation(data, published.view(x.shape))
    assert ok, msg
