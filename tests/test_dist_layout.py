"""CPU tier: the host-side layout of the distributed CUDA backends' symmetric buffers (kernels/all2all/cuda/layout.py)
and the flag words every backend uses, for every official shape at world sizes 2, 4 and 8."""
from pathlib import Path

import pytest

from kbench import problems
from load_file import load_file

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _module(path: Path):
    return load_file(path, path.stem + "_under_test")


LAYOUT = _module(KERNELS / "all2all" / "cuda" / "layout.py")


@pytest.mark.parametrize("ws", [1, 2, 4, 8])
def test_all2all_regions_are_aligned_disjoint_and_large_enough(ws):
    """A row per (token, destination rank) each way, M = max_num_tokens rows from each source."""
    spec = problems.load_spec("all2all")
    for case in spec.tests + spec.benchmarks:
        M, H = case["max_num_tokens"], case["hidden_dim"]
        lay = LAYOUT.layout(ws, M, H)
        regions = [(lay.off_count, 4 * ws), (lay.off_tok, 4 * ws * M), (lay.off_x, 2 * ws * M * H),
                   (lay.off_ret, 2 * ws * M * H)]
        assert lay.offsets() == [M, lay.off_count, lay.off_tok, lay.off_x, lay.off_ret]
        assert lay.off_count >= LAYOUT.FLAG_BYTES >= 16 * 4      # 16 flag words come first
        for (start, size), (nxt, _) in zip(regions, regions[1:]):
            assert start % LAYOUT.ALIGN == 0 and start + size <= nxt
        assert regions[-1][0] + regions[-1][1] <= lay.nbytes
        assert lay.nbytes < 320 << 20          # the official shapes fit the first allocation (symm.MIN_BYTES)


def test_symm_minimum_covers_the_largest_official_gemm_cases():
    symm = _module(KERNELS / "_common" / "symm.py")
    for problem in ("gemm-rs", "ag-gemm"):
        spec = problems.load_spec(problem)
        for case in spec.tests + spec.benchmarks:
            width = case["n"] if problem == "gemm-rs" else case["k"]
            need = symm.FLAG_BYTES + 2 * case["m"] * width * 2     # two parities of [m, n] (or [m, k]) bf16
            assert need <= symm.MIN_BYTES, (problem, case)


def test_parity_halves_are_fixed_disjoint_and_large_enough(monkeypatch):
    """gemm-rs and ag-gemm write call N+1's data while a peer may still read call N's: the two halves never overlap,
    whatever size each call asks for, and a call that needs more grows the buffer (a collective) instead."""
    torch = pytest.importorskip("torch")
    symm = _module(KERNELS / "_common" / "symm.py")
    held = {}

    def buffer(nbytes, device):  # symm.buffer without the collective: grows only when asked for more
        if "t" not in held or held["t"].numel() < nbytes + symm.FLAG_BYTES:
            held["t"] = torch.empty(max(nbytes + symm.FLAG_BYTES, symm.MIN_BYTES // 64), dtype=torch.uint8)
        return held["t"], [0, 1]

    monkeypatch.setattr(symm, "buffer", buffer)
    sizes = [3 << 20, 1 << 20, 1000, 3 << 20]  # a large case, smaller ones, the large one again
    offsets = []
    for n in sizes:
        bases = [symm.half(n, parity, "cpu")[0] for parity in (0, 1)]
        size = held["t"].numel()
        assert bases[0] == symm.FLAG_BYTES and bases[1] - bases[0] >= n and bases[1] + n <= size
        assert all(b % 256 == 0 for b in bases)
        offsets.append(tuple(bases))
    assert len(set(offsets)) == 1  # the same halves for every size that fits: no region moves under a reader
    bigger = symm.half(16 << 20, 1, "cpu")[0]
    assert bigger - symm.FLAG_BYTES >= 16 << 20 and held["t"].numel() >= bigger + (16 << 20)
