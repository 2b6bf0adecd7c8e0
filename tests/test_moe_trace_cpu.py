"""benchmarks/moe.py --trace's arithmetic on made-up stamps (grouped_gemm.cuh's kTraceFields layout): the clock,
the per-unit means, the tail and the split between a group's short last m-tiles and whole ones."""
import pytest
import torch

from load_file import load_file


@pytest.fixture(scope="module")
def bench():
    return load_file("benchmarks/moe.py", "moe_bench_under_test")


def stamp(sm, rows, start_ns, first_ns, end_ns, mhz, wait_cycles, handover_ns, group=0, mt=0, nt=0):
    """One unit's kTraceFields int64 words, its clock64 readings consistent with `mhz` from first to end."""
    word = sm | (group << 8) | (mt << 16) | (rows << 24) | (nt << 32)
    clk0 = 10_000
    clk1 = clk0 + round((end_ns - first_ns) * mhz / 1e3)
    return [word, start_ns, first_ns, end_ns, clk0, clk1, wait_cycles, end_ns + handover_ns]


def test_unit_stats_reads_the_clock_means_and_tail(bench):
    # two SMs at 1500 MHz: SM 0 runs two whole units back to back, SM 1 one short last m-tile that ends 4 us later
    units = [stamp(0, 128, 1_000, 2_000, 51_000, 1500, 3000, 500),
             stamp(0, 128, 51_500, 52_000, 101_000, 1500, 1500, 500),
             stamp(1, 40, 1_000, 3_000, 105_000, 1500, 6000, 0)]
    stamps = torch.zeros(8, 8, dtype=torch.int64)
    stamps[:3] = torch.tensor(units, dtype=torch.int64)
    s = bench.unit_stats(stamps, num_kb=64)
    assert s["units"] == 3 and s["sms"] == 2
    assert s["mhz"] == pytest.approx(1500, rel=1e-3)
    assert s["peak"] == pytest.approx(64 * 1024 / 1500)
    assert s["span"] == pytest.approx((105_000 - 1_000) / 1e3)
    # the last SM's end after the median of the SMs' last ends (torch's median: the lower middle one, 101.5 us)
    assert s["tail"] == pytest.approx((105_000 - 101_500) / 1e3)
    assert s["unit"] == pytest.approx((50_000 + 49_500 + 104_000) / 3 / 1e3)
    assert s["wait"] == pytest.approx((3000 + 1500 + 6000) / 3 / 1500)
    assert s["first"] == pytest.approx((1_000 + 500 + 2_000) / 3 / 1e3)
    assert s["tail_units"]["n"] == 1 and s["tail_units"]["unit"] == pytest.approx(104.0)
    assert s["full_units"]["n"] == 2 and s["full_units"]["handover"] == pytest.approx(0.5)
    assert s["mma_share"] == pytest.approx(3 * s["peak"] / (2 * s["span"]))
    # both SMs start at 1 us; SM 0's second unit starts 0 us after its first one's hand-over (51.0 + 0.5 us)
    assert s["skew"] == pytest.approx(0.0)
    assert s["gap"] == pytest.approx(0.0)


def test_unit_stats_reads_the_start_skew_and_the_gaps_between_units(bench):
    # SM 0 starts at 1 us and leaves 2 us between its units' hand-over and next start; SMs 1 and 2 start 10 us later
    units = [stamp(0, 128, 1_000, 2_000, 51_000, 1500, 0, 500),
             stamp(0, 128, 53_500, 54_000, 101_000, 1500, 0, 500),
             stamp(1, 128, 11_000, 12_000, 60_000, 1500, 0, 500),
             stamp(2, 128, 11_000, 12_000, 60_000, 1500, 0, 500)]
    stamps = torch.tensor(units, dtype=torch.int64)
    s = bench.unit_stats(stamps[[1, 0, 2, 3]], num_kb=64)  # out of order: the gaps follow each SM's start order
    assert s["skew"] == pytest.approx(10.0)
    assert s["gap"] == pytest.approx(2.0)


def test_unit_stats_without_stamps_is_none(bench):
    assert bench.unit_stats(torch.zeros(4, 8, dtype=torch.int64), num_kb=32) is None
