"""mla-decode pieces that need no GPU: the arithmetic argument behind the keys' RoPE in bf16x2 instructions, and the
phase-trace analysis of benchmarks/mla_decode.py."""
import pytest
import torch

from load_file import load_file


def _mla_benchmark():
    return load_file("benchmarks/mla_decode.py", "mla_decode_under_test")


def _bf16_once(x: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16, rounded once to nearest even (what mul.rn / add.rn.bf16x2 do to their exact result); torch's
    own float64 -> bf16 conversion goes through float32, which would round twice."""
    bits = x.view(torch.int64)
    drop = 45  # float64's 52 mantissa bits -> bf16's 7
    lsb = (bits >> drop) & 1
    rounded = (bits + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    return rounded.view(torch.float64).to(torch.bfloat16)  # now exact in bf16: no second rounding


def _random_bf16(n: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 values over a wide range of magnitudes (2^-40 .. 2^20) and both signs, zeros included."""
    mant = torch.rand(n, generator=gen, dtype=torch.float64) + 1.0
    exp = torch.randint(-40, 21, (n,), generator=gen).double()
    sign = torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1
    x = (sign * mant * torch.pow(2.0, exp)).to(torch.bfloat16)
    x[torch.randint(0, n, (n // 100,), generator=gen)] = 0
    return x


def test_bf16x2_rope_rounds_as_the_references_fp32_ops():
    """The kernel rotates the cached keys with mul.rn / add.rn / sub.rn.bf16x2 (attention.cuh: rotate_pair): each
    result rounded once from its exact value. The reference does the same ops in torch bf16, i.e. in fp32 rounded to
    bf16. The claim: equal bit for bit (a bf16 product is exact in fp32; an fp32 sum that rounds has operands so far
    apart that both give the larger). Checked here on a million random operands across 60 binades."""
    gen = torch.Generator().manual_seed(7)
    n = 1 << 20
    u, v, c, s = (_random_bf16(n, gen) for _ in range(4))
    ref_lo = u * c - v * s                     # torch bf16 ops: fp32 products, rounded; fp32 difference, rounded
    ref_hi = v * c + u * s
    uc, vs, vc, us = (_bf16_once(a.double() * b.double()) for a, b in ((u, c), (v, s), (v, c), (u, s)))
    ours_lo = _bf16_once(uc.double() - vs.double())
    ours_hi = _bf16_once(vc.double() + us.double())
    assert torch.equal(ref_lo.view(torch.int16), ours_lo.view(torch.int16))
    assert torch.equal(ref_hi.view(torch.int16), ours_hi.view(torch.int16))


def test_bf16_once_is_round_to_nearest_even():
    one_ulp = 2.0 ** -7  # bf16's spacing in [1, 2)
    x = torch.tensor([1 + one_ulp / 2, 1 + 1.5 * one_ulp, 1 + one_ulp / 2 + 2.0 ** -30, 1 + one_ulp / 4],
                     dtype=torch.float64)
    assert _bf16_once(x).double().tolist() == [1.0, 1 + 2 * one_ulp, 1 + one_ulp, 1.0]


def _synthetic_stamps(bench):
    """Every tile 1000 cycles after the last, event e of role r at tile * 1000 + 10 r + e; the clock calibration
    pairs say 1.5e6 cycles in 1e6 ns (1500 MHz)."""
    _, _, tiles, events = bench.TRACE_SHAPE
    t = torch.zeros(bench.TRACE_SHAPE, dtype=torch.float64)
    for r in range(4):
        t[:, r] = torch.arange(tiles)[:, None] * 1000.0 + 10 * r + torch.arange(events)
    t[:, 4, 0, :4] = torch.tensor([0.0, 0.0, 1.5e6, 1e6])
    return t


def test_trace_intervals_follow_the_stamps():
    """Synthetic stamps (_synthetic_stamps): each interval within a role is the events' difference, a tile offset
    adds 1000, and the clock comes from the (clock64, globaltimer) pairs."""
    bench = _mla_benchmark()
    t = _synthetic_stamps(bench)
    got = bench.trace_intervals(t, ntiles=40)
    assert got["tile period (wg0)"] == 1000
    assert got["wg0 S"] == 1 and got["wg1 rescale + P V"] == 1
    assert got["wg0 release -> next"] == 1000 - 6
    assert got["chain: tma issue -> wg0 S"] == 1 - 21           # (role 0, event 1) - (role 2, event 1)
    assert got["chain: wg1 P V done -> next tma issue"] == 2000 + 21 - 13
    assert set(got) == {name for name, *_ in bench.TRACE_PHASES}
    assert bench.trace_clock_mhz(t) == pytest.approx(1500)


def test_trace_intervals_leave_out_what_the_kernel_never_stamped():
    """The persistent kernel's loader stamps nothing: the intervals with a loader end are None and make no rows (they
    were written as raw clock64 values, ~2.5e11 cycles), the others as before."""
    bench = _mla_benchmark()
    t = _synthetic_stamps(bench)
    t[:, 2] = 0  # role 2, the loader
    got = bench.trace_intervals(t, ntiles=40)
    unstamped = {name for name, a, b in bench.TRACE_PHASES if 2 in (a[0], b[0])}
    assert unstamped and all(got[name] is None for name in unstamped)
    assert got["tile period (wg0)"] == 1000
    rows = bench.trace_rows(t, 64 * 40, "GPU", "case", [], seesaw=False)
    assert rows and not any(r.backend.split("trace:")[1] in unstamped for r in rows)


@pytest.mark.parametrize("knobs,backend", [({}, "cuda[dev]"), ({"KBENCH_MLA_SEESAW": "1"}, "cuda+seesaw[dev]"),
                                           ({"KBENCH_MLA_S_ONCE": "0", "KBENCH_MLA_PREFETCH_TABLES": "0"},
                                            "cuda+two-s-no-prefetch[dev]")])
def test_trace_rows_name_the_candidate_whose_knobs_are_set(monkeypatch, knobs, backend):
    """A trace taken with a candidate's knobs set is recorded under that candidate (the most specific one where one
    candidate's knobs include another's), not as the shipped kernel's."""
    bench = _mla_benchmark()
    for name in {k for c in bench.CANDIDATES.values() for k in c}:
        monkeypatch.delenv(name, raising=False)
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    rows = bench.trace_rows(_synthetic_stamps(bench), 64 * 40, "GPU", "case", [], seesaw=False)
    assert rows and {r.backend.split("/")[0] for r in rows} == {backend}


def test_item_parts_add_up_to_the_fixed_cost():
    """A work item of 40 tiles at a 1000-cycle period whose CTA entered 300 cycles before Q landed, waited 699 more
    for tile 0's S, took 500 extra over its first two tiles and 250 over its last three, and stored its rows 900
    cycles after its loop: each part is read back, the middle tiles cost nothing extra, and the parts add up to the
    fixed cost; the store's steps where stamped. Without the entry stamps (earlier builds, the seesaw kernel) there
    are no parts."""
    bench = _mla_benchmark()
    t = torch.zeros(bench.TRACE_SHAPE, dtype=torch.float64)
    ntiles, period = 40, 1000.0
    s_issued = 1000.0 + period * torch.arange(ntiles).double() + 500  # from tile 2 on, 500 behind the period
    s_issued[0], s_issued[1] = 1000.0, 1000.0 + period + 250
    t[:, 0, :ntiles, 0] = s_issued - 100  # before the ready wait
    t[:, 0, :ntiles, 1] = s_issued
    loop_end = s_issued[ntiles - 3] + 3 * period + 250
    entry = 1.0  # (a zero would read as "not stamped")
    t[:, 4, 0, :8] = torch.tensor([entry + 300, 0.0, loop_end, 1e6, entry, 0.0, loop_end + 900, 0.0])
    s_issued_check = t[:, 0, 0, 1] - t[:, 4, 0, 0]
    assert torch.all(s_issued_check == 1000 - 301)
    parts = bench.trace_item_parts(t, ntiles)
    assert parts["item: entry -> Q landed"] == pytest.approx(300)
    assert parts["item: Q landed -> tile 0's S"] == pytest.approx(699)
    assert parts["item: tiles 0-1 over the period"] == pytest.approx(500)
    assert parts["item: middle tiles over the period"] == pytest.approx(0)
    assert parts["item: last 3 tiles over the period"] == pytest.approx(250)
    assert parts["item: loop end -> rows stored"] == pytest.approx(900)
    assert parts["item: fixed cost (all parts)"] == pytest.approx(300 + 699 + 500 + 250 + 900)
    assert all(parts[n] is None for n in bench.ITEM_STORE_PARTS)  # a build without the store's stamps
    t[:, 4, 1, 0], t[:, 4, 1, 2] = loop_end + 200, loop_end + 450  # warpgroup 1 done, then the columns staged
    parts = bench.trace_item_parts(t, ntiles)
    assert [parts[n] for n in bench.ITEM_STORE_PARTS] == pytest.approx([200, 250, 450])
    t[:, 4, 1, 2] = 0  # the direct stores stamp no staging: the rest is one step
    assert [bench.trace_item_parts(t, ntiles)[n] for n in bench.ITEM_STORE_PARTS[::2]] == pytest.approx([200, 700])
    t[:, 4, 0, 4] = 0
    assert bench.trace_item_parts(t, ntiles) is None


def test_trace_rows_keep_only_positive_times():
    """A stretch of tiles may run faster than the median period (a negative part, shown signed in the printed
    table), but a results row is a time: trace_rows must not write it (tests/test_results_tables.py refuses it)."""
    bench = _mla_benchmark()
    t = torch.zeros(bench.TRACE_SHAPE, dtype=torch.float64)
    ntiles, period = 40, 1000.0
    s_issued = 1000.0 + period * torch.arange(ntiles).double()
    t[:, 0, :ntiles, 0] = s_issued - 100
    t[:, 0, :ntiles, 1] = s_issued
    t[:, 0, :ntiles - 1, 2] = s_issued[:-1] + 500  # wg0 S done, so that some phase rows exist
    loop_end = s_issued[ntiles - 3] + 3 * period - 250  # the last three tiles 250 cycles quicker than the period
    t[:, 4, 0, :8] = torch.tensor([301.0, 1.0, loop_end, 2e6, 1.0, 0.0, loop_end + 900, 0.0])
    table = []
    rows = bench.trace_rows(t, ntiles * 64, "gpu", "batchsize: 1; prefill: 2559", table, False)
    assert rows and all(r.us > 0 for r in rows)
    assert not any(r.backend.endswith("item: last 3 tiles over the period") for r in rows)
    assert any(cell and cell.startswith("-250") for cell in table[0])
