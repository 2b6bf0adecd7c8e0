"""The three distributed problems (all2all, gemm-rs, ag-gemm): specs, input generation, references and checks.

CPU tier: tiny smoke cases; multi-rank runs use gloo over spawned CPU processes (world sizes 2 and 4) with a hard
time limit, so a hang fails the test instead of stalling CI. GPU tier: the largest official cases on one GPU, and the
NCCL collective against the local reference on two GPUs.
"""
import json
import math
import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from kbench import problems

NAMES = ("all2all", "gemm-rs", "ag-gemm")
WORKER_TIMEOUT_S = 150


@pytest.fixture(autouse=True)
def _device_env(request, monkeypatch):
    """CPU tests generate on the CPU even where a GPU exists; GPU tests on the GPU."""
    gpu = request.node.get_closest_marker("gpu") is not None
    monkeypatch.setenv("KBENCH_DEVICE", "cuda" if gpu else "cpu")


def ref(name):
    return problems.load_modules(name).reference


def smoke(name, world_size=None):
    cases = problems.load_spec(name).smoke
    return [dict(c) for c in cases if world_size is None or c["world_size"] == world_size]


def intended(case):
    return problems.official_case(case, intended_bools=True)


def official(case):
    return problems.official_case(case)


def rank_inputs(name, case):
    return [ref(name).generate_input(**case, rank=r) for r in range(case["world_size"])]


def tensors(data):
    """The tensors of a generated input, in a fixed order (None kept as None)."""
    if hasattr(data[0], "num_experts"):           # all2all: (cfg, rank_data, rank, world_size)
        rd = data[1]
        return [rd.indices, rd.weights, rd.x]
    return list(data)


def same_tensors(a, b):
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(tensors(a), tensors(b)))


# ---------------------------------------------------------------------------------------------------------------
# spec.yml

@pytest.mark.parametrize("name", NAMES)
def test_reference_checks_with_the_spec_tolerance(name):
    spec = problems.load_spec(name)
    assert (ref(name).RTOL, ref(name).ATOL) == (spec.tolerance.rtol, spec.tolerance.atol)


@pytest.mark.parametrize("name", NAMES)
def test_spec_protocol_roofline_and_smoke(name):
    spec = problems.load_spec(name)
    p = spec.protocol
    assert (p.timer, p.l2_flush, p.rel_err_stop, p.leaderboard_cases, p.combine_seed, p.clone_inputs, p.case_values) \
        == ("cuda_event", True, 0.001, "all", True, True, "text")
    for case in spec.tests + spec.benchmarks + spec.smoke:
        for value in (spec.roofline.flops(case), spec.roofline.bytes(case), spec.roofline.comm_bytes(case)):
            assert math.isfinite(value) and value > 0, (case, value)
    sizes = {c["world_size"] for c in spec.smoke}
    assert {2, 4} <= sizes
    assert all(set(c) == set(spec.tests[0]) for c in spec.smoke)


def test_roofline_numbers_per_rank():
    case = {"world_size": 8, "m": 8192, "n": 4096, "k": 14336, "has_bias": True, "seed": 1}
    rs, ag = problems.load_spec("gemm-rs").roofline, problems.load_spec("ag-gemm").roofline
    assert rs.flops(case) == ag.flops(case) == 2 * 8192 * 4096 * 14336 / 8
    assert rs.comm_bytes(case) == 2 * 8192 * 4096 * 7 / 8
    assert ag.comm_bytes(case) == 2 * 8192 * 14336 * 7 / 8


# ---------------------------------------------------------------------------------------------------------------
# generation: deterministic per seed, official draw order

@pytest.mark.parametrize("name", NAMES)
def test_generation_deterministic(name):
    case = official(smoke(name, 2)[0])
    r = ref(name)
    a0, a0_again = r.generate_input(**case, rank=0), r.generate_input(**case, rank=0)
    a1 = r.generate_input(**case, rank=1)
    assert same_tensors(a0, a0_again)
    other_seed = r.generate_input(**{**case, "seed": case["seed"] + 1}, rank=0)
    assert not same_tensors(a0, other_seed)
    assert not same_tensors(a0, a1)
    for t in tensors(a0):
        assert t is None or t.device.type == "cpu"


def _uniform(gen, shape):
    return (torch.rand(shape, dtype=torch.bfloat16, generator=gen) * 2 - 1) * 0.01


def test_gemm_rs_draw_order():
    case = official({"world_size": 2, "m": 64, "n": 48, "k": 128, "has_bias": False, "seed": 77})
    for rank in range(2):
        a, w, bias = ref("gemm-rs").generate_input(**case, rank=rank)
        gen = torch.Generator().manual_seed(77 + rank)
        assert torch.equal(a, _uniform(gen, (64, 64))) and a.dtype == torch.bfloat16
        assert torch.equal(w, _uniform(gen, (48, 64)))
        # has_bias arrives as the string "False" in the official round trip: truthy, so a bias is drawn,
        # re-seeded with the case seed (the same on every rank)
        assert torch.equal(bias, _uniform(torch.Generator().manual_seed(77), (48,)))
        assert a.abs().max() <= 0.01 and a.abs().max() > 0.005
    _, _, none = ref("gemm-rs").generate_input(**intended({**case, "has_bias": False}), rank=0)
    assert none is None


def test_ag_gemm_draw_order():
    case = official({"world_size": 4, "m": 64, "n": 96, "k": 32, "has_bias": True, "seed": 5})
    biases = []
    for rank in range(4):
        a, w, bias = ref("ag-gemm").generate_input(**case, rank=rank)
        gen = torch.Generator().manual_seed(5 + rank)
        assert torch.equal(a, _uniform(gen, (16, 32)))
        assert torch.equal(w, _uniform(gen, (24, 32)))
        assert torch.equal(bias, _uniform(gen, (24,)))       # no re-seed: each rank's own bias
        biases.append(bias)
    assert not torch.equal(biases[0], biases[1])
    _, _, none = ref("ag-gemm").generate_input(**intended({**case, "has_bias": False}), rank=0)
    assert none is None


def test_all2all_draw_order():
    case = {"num_experts": 16, "experts_per_token": 3, "hidden_dim": 40, "max_num_tokens": 9, "seed": 11,
            "world_size": 4}
    for rank in (0, 3):
        cfg, rd, got_rank, got_ws = ref("all2all").generate_input(**case, rank=rank)
        assert (got_rank, got_ws) == (rank, 4)
        assert (cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim, cfg.max_num_tokens) == (16, 3, 40, 9)
        assert cfg.in_dtype == cfg.out_dtype == torch.float16
        gen = torch.Generator().manual_seed(11 + rank)
        num_tokens = int(torch.randint(1, 9, [1], generator=gen).item())
        assert rd.num_tokens == num_tokens and 1 <= num_tokens < 9
        perms = torch.stack([torch.randperm(16, generator=gen)[:3] for _ in range(num_tokens)]).int()
        assert rd.indices.dtype == torch.int32 and torch.equal(rd.indices, perms)
        assert torch.equal(rd.weights, torch.rand((num_tokens, 3), dtype=torch.float32, generator=gen))
        assert torch.equal(rd.x, torch.randn((num_tokens, 40), dtype=torch.float16, generator=gen))
        assert all(len(set(row)) == 3 for row in rd.indices.tolist())


@pytest.mark.parametrize("name, bad, fix", [
    ("gemm-rs", {"world_size": 3, "m": 64, "n": 64, "k": 128, "has_bias": True, "seed": 1}, "multiples of world_size"),
    ("ag-gemm", {"world_size": 2, "m": 64, "n": 63, "k": 128, "has_bias": True, "seed": 1}, "multiples of world_size"),
    ("all2all", {"num_experts": 6, "experts_per_token": 2, "hidden_dim": 8, "max_num_tokens": 4, "seed": 1,
                 "world_size": 4}, "multiple of world_size"),
    ("all2all", {"num_experts": 8, "experts_per_token": 2, "hidden_dim": 8, "max_num_tokens": 1, "seed": 1,
                 "world_size": 2}, "max_num_tokens must be >= 2"),
])
def test_bad_case_names_the_fix(name, bad, fix):
    with pytest.raises(ValueError, match=fix):
        ref(name).generate_input(**bad, rank=0)
    with pytest.raises(ValueError, match=fix):
        ref(name).ref_kernel_local(0, **bad)


# ---------------------------------------------------------------------------------------------------------------
# the local reference against an independent float64 computation

def float64_expected(name, case, rank):
    """This rank's output computed in float64 from every rank's generated inputs (no reference code involved)."""
    inputs = rank_inputs(name, case)
    ws = case["world_size"]
    if name == "gemm-rs":
        total = sum(a.double() @ w.double().T + (0 if b is None else b.double()) for a, w, b in inputs)
        rows = case["m"] // ws
        return total[rank * rows:(rank + 1) * rows]
    if name == "ag-gemm":
        full = torch.cat([a for a, _, _ in inputs]).double()
        _, w, b = inputs[rank]
        return full @ w.double().T + (0 if b is None else b.double())
    cfg, rd, _, _ = inputs[rank]
    owner = (rd.indices.long() // (cfg.num_experts // ws)).double()
    scaled = rd.x.double().unsqueeze(1) * (1 + owner).unsqueeze(2)              # [T, K, H]
    return (scaled * rd.weights.double().unsqueeze(2)).sum(1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bools", ["official", "intended"])
def test_local_reference_matches_float64(name, bools):
    for case in smoke(name):
        case = official(case) if bools == "official" else intended(case)
        for rank in range(case["world_size"]):
            got = ref(name).ref_kernel_local(rank, **case)
            want = float64_expected(name, case, rank)
            assert got.dtype == (torch.float16 if name == "all2all" else torch.bfloat16)
            assert got.shape == want.shape
            scale = want.abs().max().item()
            assert scale > 1e-3, "degenerate case: the expected output is ~0"
            # far tighter than the official tolerance: rounding only (bf16 partials / fp16 accumulation)
            err = (got.double() - want).abs().max().item()
            assert err <= 1e-2 * scale, (case, rank, err, scale)
            ok, msg = ref(name).compare(got, want.to(got.dtype))
            assert ok, msg


def test_all2all_local_reference_rounds_like_official():
    """fp16 accumulation one expert at a time, in ascending expert id, as the official combine receives them."""
    case = {"num_experts": 16, "experts_per_token": 6, "hidden_dim": 32, "max_num_tokens": 6, "seed": 9,
            "world_size": 4}
    cfg, rd, _, _ = ref("all2all").generate_input(**case, rank=1)
    got = ref("all2all").ref_kernel_local(1, **case)
    for t in range(rd.num_tokens):
        acc = torch.zeros(32, dtype=torch.float16)
        for k in sorted(range(6), key=lambda k: int(rd.indices[t, k])):
            y = rd.x[t] * (1 + int(rd.indices[t, k]) // 4)
            acc += y.to(torch.float32) * rd.weights[t, k]
        assert torch.equal(got[t], acc), t


# ---------------------------------------------------------------------------------------------------------------
# compare / check: accept the reference, reject the rest

@pytest.mark.parametrize("name", NAMES)
def test_compare_accepts_and_rejects(name):
    r = ref(name)
    case = official(smoke(name, 4)[0])
    expected = r.ref_kernel_local(2, **case)
    assert r.compare(expected.clone(), expected) == (True, "")

    # inside the tolerance everywhere: accepted
    slack = 0.5 * (r.ATOL + r.RTOL * expected.float().abs())
    assert r.compare((expected.float() + slack).to(expected.dtype), expected)[0]

    # one element past the tolerance: rejected, and the message locates it
    idx = expected.numel() // 2
    bad = expected.clone()
    bad.view(-1)[idx] = expected.view(-1)[idx].float() + 3 * (r.ATOL + r.RTOL * expected.view(-1)[idx].float().abs())
    ok, msg = r.compare(bad, expected)
    assert not ok and "mismatch" in msg.lower() and "1 of" in msg

    nan = expected.clone()
    nan.view(-1)[0] = float("nan")
    ok, msg = r.compare(nan, expected)
    assert not ok and "nan" in msg.lower()

    ok, msg = r.compare(torch.cat([expected, expected[:1]]), expected)
    assert not ok and "shape" in msg.lower()

    ok, msg = r.compare(expected.float(), expected)
    assert not ok and "dtype" in msg

    ok, msg = r.compare(expected.tolist(), expected)
    assert not ok and "torch.Tensor" in msg


# ---------------------------------------------------------------------------------------------------------------
# multi-rank: the collective reference against the local one, on every rank

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_cases(name, world_size):
    """Each smoke case of this world size as the official text round trip gives it, and with intended bools."""
    cases = []
    for case in smoke(name, world_size):
        cases.append(official(case))
        if "has_bias" in case:
            cases.append(intended(case))
    return cases


def _rank_worker(rank, world_size, port, backend, out_dir):
    """One rank: run every distributed problem's smoke cases through ref_kernel and ref_kernel_local."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      KBENCH_DEVICE="cuda" if backend == "nccl" else "cpu")
    torch.set_num_threads(1)
    results = []
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
        for name in NAMES:
            r = ref(name)
            for case in _worker_cases(name, world_size):
                data = r.generate_input(**case, rank=rank)
                untouched = r.generate_input(**case, rank=rank)
                got = r.ref_kernel(data)
                want = r.ref_kernel_local(rank, **case)
                ok, msg = r.compare(got, want)
                check_ok, check_msg = r.check_implementation(data, want)
                poisoned = torch.full_like(want, float("nan"))
                poison_ok, _ = r.check_implementation(data, poisoned)
                off = want.clone()
                off.view(-1)[-1] += 1.0
                off_ok, _ = r.check_implementation(data, off)
                results.append({
                    "problem": name, "case": case, "compare": ok, "message": msg,
                    "bitwise": bool(torch.equal(got, want)),
                    "max_diff": (got.float() - want.float()).abs().max().item() if got.shape == want.shape else None,
                    "check": check_ok, "check_message": check_msg, "poison_rejected": not poison_ok,
                    "off_rejected": not off_ok, "inputs_untouched": same_tensors(data, untouched),
                    "scale": want.float().abs().max().item(), "device": str(got.device), "shape": list(got.shape),
                })
    except BaseException:
        results.append({"error": traceback.format_exc()})
    finally:
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world_size, backend, out_dir):
    """Spawn world_size ranks, wait at most WORKER_TIMEOUT_S, and return each rank's results."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_worker, args=(r, world_size, port, backend, str(out_dir)), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert not hung, f"ranks {hung} still running after {WORKER_TIMEOUT_S}s (a collective hung)"
    results = []
    for r in range(world_size):
        path = Path(out_dir) / f"rank{r}.json"
        assert path.is_file(), f"rank {r} exited with code {procs[r].exitcode} and wrote no results"
        results.append(json.loads(path.read_text()))
    return results


def assert_ranks_agree(all_results, world_size):
    for rank, results in enumerate(all_results):
        errors = [r["error"] for r in results if "error" in r]
        assert not errors, f"rank {rank}:\n{errors[0]}"
        expected_runs = sum(len(_worker_cases(n, world_size)) for n in NAMES)
        assert len(results) == expected_runs
        for r in results:
            where = f"rank {rank} {r['problem']} {r['case']}"
            assert r["compare"], f"{where}: collective vs local: {r['message']}"
            assert r["check"], f"{where}: check_implementation rejected the local reference: {r['check_message']}"
            assert r["poison_rejected"] and r["off_rejected"], f"{where}: a wrong output passed the check"
            assert r["inputs_untouched"], f"{where}: the reference modified its inputs"
            if r["problem"] in ("all2all", "ag-gemm"):
                # same ops in the same order on the same numbers
                assert r["bitwise"], f"{where}: expected bitwise equality, max diff {r['max_diff']}"
            else:
                # bf16 sum (collective) vs fp32 sum rounded once (local): a few bf16 ulps (2^-7 relative) at most
                assert r["max_diff"] <= r["scale"] / 32, f"{where}: max diff {r['max_diff']} at scale {r['scale']}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_collective_matches_local_over_gloo(world_size, tmp_path):
    assert_ranks_agree(run_ranks(world_size, "gloo", tmp_path), world_size)


# ---------------------------------------------------------------------------------------------------------------
# GPU tier

@pytest.mark.gpu
@pytest.mark.multigpu(2)
def test_collective_matches_local_over_nccl(tmp_path):
    assert_ranks_agree(run_ranks(2, "nccl", tmp_path), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_local_reference_largest_official_case_on_gpu(name):
    """The biggest official benchmark, world size 8, regenerated on one GPU: bounded memory, right output."""
    spec = problems.load_spec(name)
    case = official(max(spec.benchmarks, key=lambda c: spec.roofline.flops(c) + spec.roofline.bytes(c)))
    torch.cuda.init()  # the memory-stat calls below reject the device while CUDA is not initialised yet
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    base = torch.cuda.memory_allocated(0)
    out = ref(name).ref_kernel_local(0, **case)
    torch.cuda.synchronize()
    peak_gb = (torch.cuda.max_memory_allocated(0) - base) / 2**30
    assert out.device == torch.device("cuda", 0) and bool(torch.isfinite(out).all())
    assert out.abs().max().item() > 0
    assert peak_gb < 3.0, f"{name}: local reference peaked at {peak_gb:.2f} GB"
    data = ref(name).generate_input(**case, rank=0)
    if name == "gemm-rs":
        assert out.shape == (case["m"] // 8, case["n"]) and out.dtype == torch.bfloat16
    elif name == "ag-gemm":
        assert out.shape == (case["m"], case["n"] // 8) and out.dtype == torch.bfloat16
    else:
        assert out.shape == (data[1].num_tokens, case["hidden_dim"]) and out.dtype == torch.float16
